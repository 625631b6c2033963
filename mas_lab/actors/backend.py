"""The actors behind a run: for each base model, one RolloutWorker and one Learner.

A *base* is one base model in memory: a full-model policy has a base of its own; policies with
LoRA on the same base model and dtype share one base, one adapter each (per-role LoRA). With Ray
(the default) workers and learners are Ray actors in a local Ray instance, or in an existing
cluster when `resources.ray_address` is set; bases update in parallel. `use_ray=False` builds the
same classes in-process (fast unit tests and the learning test); the code above is identical.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from mas_lab.actors.colocated import Colocated
from mas_lab.config import Sampling, TaskConfig
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import Generation
from mas_lab.rollout.worker import RolloutWorker


@runtime_checkable
class PolicyBackend(Protocol):
    """What the trainer needs of the actors behind a run: generate with a policy, update the
    policies on their samples, push weights to the rollout side, save and load, liveness, shutdown.
    `Backend` implements it with Ray actors (or in-process); tests implement it with fakes."""

    def generate(
        self, policy: str, prompts: list[list[dict[str, str]]], n: int, sampling: Sampling, seed: int
    ) -> list[list[Generation]]: ...

    def update(self, samples: dict[str, list[Sample]]) -> dict[str, dict[str, float]]: ...

    def sync_weights(self, version: int) -> float: ...

    def save_policies(self, folder: Path, background: bool = False) -> None: ...

    def wait_saves(self) -> None: ...

    def load_policies(self, folder: Path, version: int, optimizer: bool = True) -> None: ...

    def placement(self) -> dict[str, str]: ...

    def precision(self) -> dict[str, dict[str, object]]: ...

    def alive(self) -> bool: ...

    def shutdown(self) -> None: ...


def check_cluster(address: str, timeout_s: float) -> str | None:
    """None when the head of a Ray cluster answers at host:port within `timeout_s`, else a
    sentence saying what failed (ray.init would retry for a long time instead)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return f"'{address}' is not host:port (the address `ray start --head` prints)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"no Ray cluster answers at {address} within {timeout_s:g} s ({exc.strerror or exc})"


def ray_token_available() -> bool:
    """Whether this machine has a Ray auth token where Ray looks for one: $RAY_AUTH_TOKEN, the file
    $RAY_AUTH_TOKEN_PATH names, or ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    return os.path.isfile(path)


def start_ray(address: str | None, cpus_needed: float = 0.0) -> None:
    """Join `address`, or start a local Ray instance. Locally the logical CPUs are at least what
    the actors ask for: rollout and learner phases alternate, so sharing cores is intended (with
    only os.cpu_count() logical CPUs, per-role full models would wait forever to be scheduled)."""
    if address and ray_token_available():
        # Ray 2.60's `ray start --head` turns token auth on where it finds a token (~/.ray); the
        # client must ask for it to send the token, or every call fails with InvalidAuthToken.
        # Ray reads this when it is first imported, so it is set before the import. Where no
        # token exists the head ran without auth, and asking for it would fail ("no token found").
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    # lazy: ray (~0.4 s), only where the actors run
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    else:
        cpus = max(os.cpu_count() or 1, int(-(-cpus_needed // 1)))
        # address="local": a new instance even when a cluster from `ray start` runs on this machine
        ray.init(address="local", num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)


def colocate(task: TaskConfig, engine: str) -> bool:
    """Whether a base's learner and rollout worker share one process (`resources.colocate`; auto:
    with one transformers rollout worker on the learner's kind of device)."""
    res = task.resources
    if res.colocate == "auto":
        return engine == "hf" and res.rollout_workers == 1 and (res.rollout_gpus > 0) == (res.learner_gpus > 0)
    return bool(res.colocate)


def bases_of(task: TaskConfig) -> dict[str, list[str]]:
    """Group policies into bases: LoRA policies on the same base share one; full ones stand alone."""
    bases: dict[str, list[str]] = {}
    for name, policy in task.policies.items():
        key = f"lora:{policy.model}:{policy.dtype}:{policy.engine}" if policy.lora else f"full:{name}"
        bases.setdefault(key, []).append(name)
    return bases


class Backend:
    def __init__(self, task: TaskConfig, use_ray: bool = True):
        self.task = task
        self.use_ray = use_ray
        self.workers: dict[str, list] = {}  # base -> its RolloutWorkers (resources.rollout_workers)
        self.learners: dict[str, object] = {}  # base -> Learner
        self.base_of: dict[str, str] = {}
        self.sleepers: list = []  # rollout workers whose vLLM engine sleeps while the learners update
        self.colocated: set[str] = set()  # bases whose learner and rollout worker share one process
        threads = task.resources.torch_threads
        if use_ray:
            per_base = task.resources.rollout_cpus * task.resources.rollout_workers + task.resources.learner_cpus
            start_ray(task.resources.ray_address, per_base * len(bases_of(task)))  # imports ray after its auth setting
            # lazy: ray (~0.4 s), only where the actors run
            import ray

            # several rollout workers go to different nodes where the cluster has them
            res = task.resources
            spread: dict[str, Any] = {"scheduling_strategy": "SPREAD"} if res.rollout_workers > 1 else {}
            worker_cls: Any = ray.remote(num_cpus=res.rollout_cpus, num_gpus=res.rollout_gpus, **spread)(RolloutWorker)
            learner_cls: Any = ray.remote(num_cpus=res.learner_cpus, num_gpus=res.learner_gpus)(Learner)
            # overlap: the next step's rollout runs while the update does (a threaded actor)
            threaded: dict[str, Any] = {"max_concurrency": 2} if task.algorithm.overlap else {}
            colocated_cls: Any = ray.remote(
                num_cpus=res.rollout_cpus + res.learner_cpus,
                num_gpus=max(res.rollout_gpus, res.learner_gpus),
                **threaded,
            )(Colocated)
        else:
            worker_cls, learner_cls, colocated_cls = RolloutWorker, Learner, Colocated
        for base, names in bases_of(task).items():
            first = task.policies[names[0]]
            folder = resolve(first.model)
            specs = {n: task.policies[n].lora for n in names}
            adapters = {n: s for n, s in specs.items() if s}
            init_from = {n: task.policies[n].init_from for n in names if task.policies[n].init_from}
            rollout_device = "cuda" if task.resources.rollout_gpus > 0 else "cpu"
            learner_device = "cuda" if task.resources.learner_gpus > 0 else "cpu"
            worker_args = (
                folder,
                first.dtype,
                threads,
                adapters or None,
                first.engine,
                first.vllm,
                task.train.seed,
                rollout_device,
            )
            learner_args = (
                folder,
                task.algorithm,
                first.dtype,
                threads,
                task.train.seed,
                specs,
                init_from,
                learner_device,
                {n: task.policies[n].lr for n in names if task.policies[n].lr is not None},
            )
            if colocate(task, first.engine):
                both = self._new(colocated_cls, worker_args, learner_args)
                self.workers[base], self.learners[base] = [both], both
                self.colocated.add(base)
            else:
                self.workers[base] = [
                    self._new(worker_cls, *worker_args) for _ in range(task.resources.rollout_workers)
                ]
                self.learners[base] = self._new(learner_cls, *learner_args)
            self.base_of.update({n: base for n in names})
            if first.engine == "vllm" and first.vllm.sleep:
                self.sleepers += self.workers[base]
        self._ready(task)
        self.sync_weights(0)  # adapters start random in each process; init_from weights too

    def _ready(self, task: TaskConfig) -> None:
        """Wait for every actor; in a cluster that cannot place them, fail with the numbers."""
        handles = [self._call(a, "ready") for a in self._actors()]
        if not self.use_ray:
            return
        # lazy: ray (~0.4 s), only where the actors run
        import ray

        timeout = float(os.environ.get("MAS_LAB_ACTOR_TIMEOUT_S", "600"))
        ready, pending = ray.wait(handles, num_returns=len(handles), timeout=timeout)
        if pending:
            res = task.resources
            needed = (res.rollout_cpus * res.rollout_workers + res.learner_cpus) * len(self.workers)
            have = ray.cluster_resources().get("CPU", 0)
            raise RuntimeError(
                f"{len(pending)} of {len(handles)} actors were not placed within {timeout:.0f} s: "
                f"they ask for {needed:g} CPUs, the Ray cluster has {have:g}"
            )
        ray.get(ready)

    def _actors(self) -> list:
        """Every actor once (a colocated base's one actor is its worker and its learner)."""
        found = [*(w for workers in self.workers.values() for w in workers), *self.learners.values()]
        return list({id(a): a for a in found}.values())

    @staticmethod
    def _new(cls, *args):
        return cls.remote(*args) if hasattr(cls, "remote") else cls(*args)

    def _call(self, actor, method: str, *args):
        if self.use_ray:
            return getattr(actor, method).remote(*args)
        return getattr(actor, method)(*args)

    def _wait(self, handles: list):
        if self.use_ray:
            # lazy: ray (~0.4 s), only where the actors run
            import ray

            return ray.get(handles)
        return handles

    def generate(
        self, policy: str, prompts: list[list[dict[str, str]]], n: int, sampling: Sampling, seed: int
    ) -> list[list[Generation]]:
        """The prompts in contiguous slices, one per rollout worker, gathered in order; each slice
        says where it starts, so every candidate is seeded as if one worker had all the prompts."""
        workers = self.workers[self.base_of[policy]]
        size = -(-len(prompts) // len(workers))  # ceil
        starts = range(0, len(prompts), max(size, 1))
        handles = [
            self._call(w, "generate", policy, prompts[s : s + size], n, sampling, seed, s)
            for w, s in zip(workers, starts)
        ]
        return [row for part in self._wait(handles) for row in part]

    def update(self, samples: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
        """Update every policy on its own samples; bases update in parallel under Ray."""
        by_base: dict[str, dict[str, list[Sample]]] = {}
        for policy, batch in samples.items():
            by_base.setdefault(self.base_of[policy], {})[policy] = batch
        bases = list(by_base)
        self._wait([self._call(w, "sleep") for w in self.sleepers])
        results = self._wait([self._call(self.learners[h], "update", by_base[h]) for h in bases])
        return {policy: metrics for result in results for policy, metrics in result.items()}

    def sync_weights(self, version: int) -> float:
        """Push each policy's weights (or adapter) to its rollout workers; returns the seconds.
        Under Ray the learner's result is one object in the object store that every worker reads."""
        started = time.perf_counter()
        handles = []
        for policy, base in self.base_of.items():
            if base in self.colocated:  # in the actor's own memory: mas_lab/actors/colocated.py
                handles.append(self._call(self.learners[base], "sync_local", policy, version))
                continue
            weights = self._call(self.learners[base], "weights", policy)  # an ObjectRef under Ray
            handles += [self._call(w, "load_weights", policy, weights, version) for w in self.workers[base]]
        self._wait(handles)
        return time.perf_counter() - started

    def save_policies(self, folder: Path, background: bool = False) -> None:
        """Every policy written under folder/<policy> (a shared file system in a cluster).
        `background`: each learner snapshots its policies now and writes them while training goes
        on; `wait_saves` returns once they are on disk."""
        self._wait(
            [self._call(self.learners[h], "save", p, str(folder / p), background) for p, h in self.base_of.items()]
        )

    def wait_saves(self) -> None:
        self._wait([self._call(learner, "wait_saves") for learner in self.learners.values()])

    def load_policies(self, folder: Path, version: int, optimizer: bool = True) -> None:
        """Load every policy from a checkpoint, then push the weights to the rollout workers."""
        self._wait(
            [self._call(self.learners[h], "load", p, str(folder / p), optimizer) for p, h in self.base_of.items()]
        )
        self.sync_weights(version)

    def _roles(self) -> list[tuple[str, object, str]]:
        """(name, actor, precision method) of every rollout worker and learner, the colocated ones
        by the role they play."""
        found = [
            (f"rollout {base}#{i}", w, "precision_report")
            for base, workers in self.workers.items()
            for i, w in enumerate(workers)
        ]
        for base, learner in self.learners.items():
            method = "learner_precision" if base in self.colocated else "precision_report"
            found.append((f"learner {base}", learner, method))
        return found

    def placement(self) -> dict[str, str]:
        """Actor -> the node it runs on: `rollout <base>#<i>` and `learner <base>` (one process for
        a colocated base)."""
        roles = self._roles()
        return dict(zip([n for n, _, _ in roles], self._wait([self._call(a, "node") for _, a, _ in roles])))

    def precision(self) -> dict[str, dict[str, object]]:
        """Actor -> its requested and resolved dtype and whether bf16 is emulated there
        (`dtype: auto` resolves in each actor, on its own device: mas_lab/modeling/precision.py)."""
        roles = self._roles()
        return dict(zip([n for n, _, _ in roles], self._wait([self._call(a, m) for _, a, m in roles])))

    def alive(self) -> bool:
        """Whether every actor answers (checked while a run is paused)."""
        try:
            return all(self._wait([self._call(a, "ready") for a in self._actors()]))
        except Exception:
            return False

    def shutdown(self) -> None:
        """Kill the actors (and the local Ray instance this backend started); idempotent."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        if self.use_ray:
            # lazy: ray (~0.4 s), only where the actors run
            import ray

            for actor in self._actors():
                ray.kill(actor)
            if not self.task.resources.ray_address:
                ray.shutdown()
