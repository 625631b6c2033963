"""The actors behind a run: one RolloutWorker and one Learner per policy.

With Ray (the default) they are Ray actors in a local Ray instance, or in an existing cluster
when `resources.ray_address` is set. `use_ray=False` builds the same classes in-process, which
the fast unit tests and the learning test use; the code path above this module is identical.
"""
from __future__ import annotations

import os
import time

from mas_lab.config import Sampling, TaskConfig
from mas_lab.learner.learner import Learner
from mas_lab.models import resolve
from mas_lab.rollout.engine import Generation
from mas_lab.rollout.worker import RolloutWorker


def start_ray(address: str | None) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, configure_logging=False)


class Backend:
    def __init__(self, task: TaskConfig, use_ray: bool = True):
        self.task = task
        self.use_ray = use_ray
        self.sync_s = 0.0
        self.workers: dict[str, object] = {}
        self.learners: dict[str, object] = {}
        threads = task.resources.torch_threads
        algorithm = task.algorithm.model_dump()
        if use_ray:
            import ray

            start_ray(task.resources.ray_address)
            worker_cls = ray.remote(num_cpus=task.resources.rollout_cpus)(RolloutWorker)
            learner_cls = ray.remote(num_cpus=task.resources.learner_cpus)(Learner)
        else:
            worker_cls, learner_cls = RolloutWorker, Learner
        for name, policy in task.policies.items():
            folder = resolve(policy.model)
            self.workers[name] = self._new(worker_cls, folder, policy.dtype, threads)
            self.learners[name] = self._new(learner_cls, folder, algorithm, policy.dtype, threads, task.train.seed)
        self._wait([self._call(a, "ready") for a in [*self.workers.values(), *self.learners.values()]])

    @staticmethod
    def _new(cls, *args):
        return cls.remote(*args) if hasattr(cls, "remote") else cls(*args)

    def _call(self, actor, method: str, *args):
        if self.use_ray:
            return getattr(actor, method).remote(*args)
        return getattr(actor, method)(*args)

    def _wait(self, handles: list):
        if self.use_ray:
            import ray

            return ray.get(handles)
        return handles

    def generate(self, policy: str, prompts, n: int, sampling: Sampling, seed: int) -> list[list[Generation]]:
        handle = self._call(self.workers[policy], "generate", prompts, n, sampling.temperature, sampling.top_p,
                            sampling.max_new_tokens, seed)
        return self._wait([handle])[0]

    def update(self, samples: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
        """Update every policy on its own samples; with Ray the policies update in parallel."""
        names = list(samples)
        results = self._wait([self._call(self.learners[n], "update", samples[n]) for n in names])
        return dict(zip(names, results))

    def sync_weights(self, version: int) -> float:
        """Push each learner's weights to its rollout worker; returns the seconds it took."""
        started = time.perf_counter()
        handles = []
        for name, learner in self.learners.items():
            weights = self._call(learner, "weights")  # an ObjectRef under Ray: no trip via the driver
            handles.append(self._call(self.workers[name], "load_weights", weights, version))
        self._wait(handles)
        return time.perf_counter() - started

    def save_policies(self, folder) -> None:
        """Every learner writes its policy under folder/<policy name> (a shared file system in a cluster)."""
        self._wait([self._call(learner, "save", str(folder / name)) for name, learner in self.learners.items()])

    def load_policies(self, folder, version: int) -> None:
        """Load every policy from a checkpoint, then push the weights to the rollout workers."""
        self._wait([self._call(learner, "load", str(folder / name)) for name, learner in self.learners.items()])
        self.sync_weights(version)

    def alive(self) -> bool:
        """Whether every actor answers (checked while a run is paused)."""
        try:
            return all(self._wait([self._call(a, "ready") for a in [*self.workers.values(), *self.learners.values()]]))
        except Exception:
            return False

    def shutdown(self) -> None:
        if self.use_ray:
            import ray

            for actor in [*self.workers.values(), *self.learners.values()]:
                ray.kill(actor)
            if not self.task.resources.ray_address:
                ray.shutdown()
