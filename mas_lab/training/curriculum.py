"""The curriculum (`train.curriculum`): stages of easier problems before the task's own, each left
when its training success is high enough (mas-lab's addition; the paper trains on one distribution)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def promotion(
    stages: Sequence[Any], metrics: Mapping[int, Mapping[str, float]], stage: int, started: int, step: int
) -> str | None:
    """Whether the run leaves `stage` after `step`, as the event that says so (None: it stays).
    A stage is left when it has run `min_steps` steps and the mean training success of its last
    `window` steps reaches `promote_at`; read from the stored metrics, so a resumed run decides
    exactly as the original."""
    if stage >= len(stages):
        return None
    rule = stages[stage]
    done = [s for s in range(started + 1, step + 1) if "success_rate" in metrics.get(s, {})]
    if len(done) < rule.min_steps:
        return None
    recent = [metrics[s]["success_rate"] for s in done[-rule.window :]]
    rolling = statistics.fmean(recent)
    if rolling < rule.promote_at:
        return None
    final = " (the task's own problems)" if stage + 1 == len(stages) else ""
    return (
        f"stage {stage + 1}{final} from step {step + 1}: training success "
        f"{rolling:.3f} over the last {len(recent)} steps reached {rule.promote_at}"
    )
