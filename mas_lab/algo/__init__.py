"""AT-GRPO as pure functions: grouping, advantages, filters and the clipped loss. No Ray, no I/O.

The loss needs torch; it is imported on first use, so readers of the run store (replay, the
dashboard) that use the group types do not load torch."""

from mas_lab.algo.advantage import grpo_advantages, is_zero_std
from mas_lab.algo.filters import FilterReport, filter_groups
from mas_lab.algo.groups import (
    Candidate,
    Group,
    GroupError,
    GroupKey,
    GroupStats,
    build_groups,
    build_trajectory_groups,
    group_stats,
)

__all__ = [
    "Candidate",
    "Group",
    "GroupError",
    "GroupKey",
    "GroupStats",
    "build_groups",
    "build_trajectory_groups",
    "group_stats",
    "grpo_advantages",
    "is_zero_std",
    "FilterReport",
    "filter_groups",
    "clipped_policy_loss",
]


def __getattr__(name: str):
    if name == "clipped_policy_loss":
        # lazy: torch, only where the loss is computed
        from mas_lab.algo.loss import clipped_policy_loss

        return clipped_policy_loss
    raise AttributeError(f"module 'mas_lab.algo' has no attribute '{name}'")
