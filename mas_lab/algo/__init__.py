"""AT-GRPO as pure functions: grouping, advantages, filters and the clipped loss. No Ray, no I/O."""
from mas_lab.algo.advantage import grpo_advantages
from mas_lab.algo.filters import FilterReport, filter_groups
from mas_lab.algo.groups import Candidate, Group, GroupError, build_groups, build_trajectory_groups, group_stats
from mas_lab.algo.loss import clipped_policy_loss

__all__ = [
    "Candidate", "Group", "GroupError", "build_groups", "build_trajectory_groups", "group_stats", "grpo_advantages",
    "FilterReport", "filter_groups", "clipped_policy_loss",
]
