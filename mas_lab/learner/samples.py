"""What the controller sends a learner: one candidate as a training sample."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One candidate's tokens and its group-relative advantage (paper Eq. 3), routed to the
    learner of its role's policy. The loss covers the response tokens only."""

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
