"""Optional group filters (docs/algorithm.md, "Group filters"). Every filter reports what it dropped.

`zero_std` drops groups whose rewards are all equal: their advantages are zero, so they add
tokens to the loss's denominator without adding gradient.
"""

from __future__ import annotations

from dataclasses import dataclass

from mas_lab.algo.advantage import is_zero_std
from mas_lab.algo.groups import Group


@dataclass
class FilterReport:
    kept_groups: int
    dropped_groups: int
    dropped_samples: int


def filter_groups(groups: list[Group], name: str, tol: float = 0.0) -> tuple[list[Group], FilterReport]:
    if name == "none":
        kept = list(groups)
    elif name == "zero_std":
        kept = [g for g in groups if not is_zero_std(g.rewards, tol)]
    else:
        raise ValueError(f"unknown group filter '{name}'")
    dropped = [g for g in groups if g not in kept]
    return kept, FilterReport(len(kept), len(dropped), sum(len(g.members) for g in dropped))
