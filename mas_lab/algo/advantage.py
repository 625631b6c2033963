"""GRPO advantages inside one group (paper Eq. 3; DeepSeekMath GRPO outcome supervision).

A_c = (r_c - mean(r)) / (std(r) + eps), with the sample standard deviation over the group's K
rewards. A group whose rewards are all equal carries no signal and gets all-zero advantages.
"""
from __future__ import annotations

import math


def is_zero_std(rewards: list[float]) -> bool:
    """A group whose rewards are all equal: no relative signal (the one definition, used by the
    advantages, the zero_std filter and the group statistics)."""
    return max(rewards) - min(rewards) == 0.0


def grpo_advantages(rewards: list[float], eps: float = 1e-6) -> list[float]:
    k = len(rewards)
    if k < 2:
        raise ValueError("a GRPO group needs at least two rewards")
    mean = sum(rewards) / k
    if is_zero_std(rewards):
        return [0.0] * k
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (k - 1))
    return [(r - mean) / (std + eps) for r in rewards]
