"""RolloutWorker: serves one policy's generations; a plain class that Ray wraps as an actor."""

from __future__ import annotations

from dataclasses import replace

from mas_lab.actors.placement import node_id
from mas_lab.config import Lora, Sampling, Vllm
from mas_lab.rollout.engine import Generation, HFEngine
from mas_lab.rollout.vllm_engine import VLLMEngine


class RolloutWorker:
    """Serves one base model: a single full policy, or several policies as LoRA adapters, with
    the transformers engine (`hf`) or vLLM (`vllm`)."""

    def __init__(
        self,
        model_dir: str,
        dtype: str = "float32",
        threads: int = 0,
        adapters: dict[str, Lora] | None = None,
        engine: str = "hf",
        options: Vllm | None = None,
        seed: int = 0,
        device: str = "cpu",
    ):
        if engine == "vllm":
            self.engine: HFEngine | VLLMEngine = VLLMEngine(
                model_dir, dtype=dtype, threads=threads, adapters=adapters, options=options, seed=seed
            )
        else:
            self.engine = HFEngine(model_dir, dtype=dtype, threads=threads, adapters=adapters, device=device)
        self.versions: dict[str, int] = {}  # policy -> the weight version this worker serves

    def generate(
        self,
        policy: str,
        prompts: list[list[dict[str, str]]],
        n: int,
        sampling: Sampling,
        seed: int,
        first_index: int = 0,
    ) -> list[list[Generation]]:
        """`first_index`: where these prompts start in the call's whole list (a slice of it). Every
        candidate carries the weight version that generated it."""
        version = self.versions.get(policy, 0)
        rows = self.engine.generate(policy, prompts, n, sampling, seed, first_index)
        return [[replace(g, version=version) for g in row] for row in rows]

    def load_weights(self, policy: str, state, version: int) -> int:
        """Receive a learner's new weights or adapter (weight sync after each step)."""
        self.engine.load_weights(state, policy)
        self.versions[policy] = version
        return version

    def sleep(self) -> None:
        """Free the accelerator while the learner updates (vLLM `sleep`; otherwise nothing)."""
        if hasattr(self.engine, "sleep"):
            self.engine.sleep()

    def stats(self) -> dict:
        return dict(self.engine.stats)

    def ready(self) -> bool:
        return True

    def precision_report(self) -> dict[str, object]:
        """The dtype this worker's engine generates in, as resolved on its device (mas_lab/modeling/precision.py)."""
        return self.engine.precision

    def node(self) -> str:
        return node_id()
