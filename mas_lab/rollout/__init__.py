"""Inference engines (transformers by default) and the RolloutWorker that serves a policy."""

from mas_lab.rollout.engine import Generation, HFEngine
from mas_lab.rollout.worker import RolloutWorker

__all__ = ["Generation", "HFEngine", "RolloutWorker"]
