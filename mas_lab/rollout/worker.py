"""RolloutWorker: serves one policy's generations; a plain class that Ray wraps as an actor."""
from __future__ import annotations

from mas_lab.rollout.engine import Generation, HFEngine


class RolloutWorker:
    def __init__(self, model_dir: str, dtype: str = "float32", threads: int = 0):
        self.engine = HFEngine(model_dir, dtype=dtype, threads=threads)
        self.version = 0

    def generate(self, prompts, n, temperature, top_p, max_new_tokens, seed) -> list[list[Generation]]:
        return self.engine.generate(prompts, n, temperature, top_p, max_new_tokens, seed)

    def load_weights(self, state, version: int) -> int:
        """Receive the learner's new weights (weight sync after each step)."""
        self.engine.load_weights(state)
        self.version = version
        return version

    def stats(self) -> dict:
        return dict(self.engine.stats)

    def ready(self) -> bool:
        return True
