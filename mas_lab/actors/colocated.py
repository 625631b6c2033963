"""A base model's learner and its rollout worker in one process (`resources.colocate`): no weight
copy through the object store after each update.

With one rollout worker on the learner's device (the default on one machine) the two share a
process. The engine then reads the new weights in place: where both hold the same dtype and no
adapters (float32 here), its parameters *are* the learner's tensors (set once; the optimizer's
in-place steps are what the next rollout samples from, so a weight sync costs nothing); in bf16,
where the engine holds a bf16 copy of the learner's float32 master weights, each parameter is cast
into the engine's own tensor in place (what the copy through the object store did, without the
serialisation); with LoRA adapters, the adapter state moves in memory. The samples are those of
the separate actors: the same weights reach the same engine code (tests/test_colocated.py).
Under `algorithm.overlap` the engine samples step n+1 while the learner updates on step n, so it
keeps its own copy of the weights even where the dtypes match, and a sync copies them in place.
"""

from __future__ import annotations

import torch

from mas_lab.actors.placement import node_id
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.rollout.engine import Generation, HFEngine
from mas_lab.rollout.worker import RolloutWorker


class Colocated:
    """Serves both ends of one base model: the Backend uses it as the base's learner and as its
    single rollout worker."""

    def __init__(self, worker_args: tuple, learner_args: tuple):
        self.learner = Learner(*learner_args)
        self.worker = RolloutWorker(*worker_args)
        self.shared = False  # the engine's parameters are the learner's tensors
        engine = self.worker.engine
        if isinstance(engine, HFEngine) and not engine.adapters and not self.learner.adapters:
            self.pairs = list(zip(engine.model.parameters(), self.learner.model.parameters(), strict=True))
            same = all(e.shape == p.shape and e.dtype == p.dtype and e.device == p.device for e, p in self.pairs)
            if same and not self.learner.algo.overlap:  # overlapped, the engine must not see the update happen
                for e, p in self.pairs:
                    e.data = p.data  # one storage: the optimizer's in-place step is the sync
                self.shared = True
        else:
            self.pairs = []

    # --- the rollout worker's side --------------------------------------------------------------
    def generate(self, policy, prompts, n, sampling, seed, first_index=0) -> list[list[Generation]]:
        return self.worker.generate(policy, prompts, n, sampling, seed, first_index)

    def sleep(self) -> None:
        self.worker.sleep()

    def stats(self) -> dict:
        return self.worker.stats()

    def load_weights(self, policy: str, state, version: int) -> int:
        """Weights from elsewhere (not the colocated learner's): as a separate worker takes them."""
        return self.worker.load_weights(policy, state, version)

    def sync_local(self, policy: str, version: int) -> int:
        """The weight sync, in this process (shared tensors need none); returns the version, as
        a separate worker's load_weights does (the backend times the sync)."""
        if self.shared:
            pass
        elif self.pairs:
            with torch.no_grad():
                for engine_param, learner_param in self.pairs:
                    engine_param.copy_(learner_param)  # cast into the engine's dtype, in place
        else:
            self.worker.engine.load_weights(self.learner.weights(policy), policy)
        self.worker.versions[policy] = version
        return version

    # --- the learner's side ----------------------------------------------------------------------
    def update(self, samples: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
        return self.learner.update(samples)

    def weights(self, name: str):
        return self.learner.weights(name)

    def save(self, name: str, path: str, background: bool = False) -> None:
        self.learner.save(name, path, background)

    def wait_saves(self) -> None:
        self.learner.wait_saves()

    def load(self, name: str, path: str, optimizer: bool = True) -> int:
        return self.learner.load(name, path, optimizer)

    def ready(self) -> bool:
        return True

    def precision_report(self) -> dict[str, object]:
        return self.worker.precision_report()

    def learner_precision(self) -> dict[str, object]:
        return self.learner.precision_report()

    def node(self) -> str:
        return node_id()
