"""The one shape of a progress event, from the trainer and the run lifecycle to whoever shows
it (the CLI's progress bar, the background run's log)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class ProgressEvent:
    """`phase` says what the run is doing (e.g. "rollout t0 tool", "learner", "eval", "done");
    `step` is the training step it belongs to; `metrics` come with "done" (the finished step's)."""

    phase: str
    step: int
    metrics: Optional[dict[str, float]] = None


Progress = Callable[[ProgressEvent], None]
