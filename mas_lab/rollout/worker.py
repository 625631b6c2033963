"""RolloutWorker: serves one policy's generations; a plain class that Ray wraps as an actor."""
from __future__ import annotations

from mas_lab.actors import node_id
from mas_lab.config import Lora, Sampling
from mas_lab.rollout.engine import Generation, HFEngine


class RolloutWorker:
    """Serves one base model: a single full policy, or several policies as LoRA adapters."""

    def __init__(self, model_dir: str, dtype: str = "float32", threads: int = 0, adapters: dict[str, Lora] | None = None):
        self.engine = HFEngine(model_dir, dtype=dtype, threads=threads, adapters=adapters)
        self.version = 0

    def generate(self, policy: str, prompts: list[list[dict[str, str]]], n: int, sampling: Sampling,
                 seed: int, first_index: int = 0) -> list[list[Generation]]:
        """`first_index`: where these prompts start in the call's whole list (a slice of it)."""
        return self.engine.generate(policy, prompts, n, sampling, seed, first_index)

    def load_weights(self, policy: str, state, version: int) -> int:
        """Receive a learner's new weights or adapter (weight sync after each step)."""
        self.engine.load_weights(state, policy)
        self.version = version
        return version

    def stats(self) -> dict:
        return dict(self.engine.stats)

    def ready(self) -> bool:
        return True

    def node(self) -> str:
        return node_id()
