"""The one shape of a progress event, from the trainer and the run lifecycle to whoever shows
it (the CLI's progress bar, the background run's log)."""

from __future__ import annotations

import statistics
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


def time_left(
    step_times: list[float], eval_times: list[float], step: int, steps: int, eval_every: int | None
) -> float | None:
    """Seconds a run still needs at its own pace: the median of its last five steps' times for each
    step left, and its last evaluation's time for each evaluation left (every `eval_every` steps and
    at the end, as the trainer evaluates). None before its first timed step."""
    if not step_times:
        return None
    evals_left = sum(1 for s in range(step + 1, steps + 1) if s == steps or (eval_every and s % eval_every == 0))
    return max(0, steps - step) * statistics.median(step_times[-5:]) + evals_left * (
        eval_times[-1] if eval_times else 0.0
    )
