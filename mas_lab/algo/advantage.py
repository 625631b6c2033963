"""GRPO advantages inside one group (paper Eq. 3; DeepSeekMath GRPO outcome supervision).

A_c = (r_c - mean(r)) / (std(r) + eps), with the sample standard deviation over the group's K
rewards. A group whose rewards are all equal carries no signal and gets all-zero advantages.
"""

from __future__ import annotations

import math


def is_zero_std(rewards: list[float], tol: float = 0.0) -> bool:
    """A group whose rewards are all equal, or equal up to `tol` (algorithm.tie_tolerance: rewards
    that differ by float noise, e.g. 0.2 + 0.9 / 3 summed in two orders): no relative signal (the
    one definition, used by the advantages, the zero_std filter and the group statistics)."""
    return max(rewards) - min(rewards) <= tol


def grpo_advantages(rewards: list[float], eps: float = 1e-6, tol: float = 0.0) -> list[float]:
    k = len(rewards)
    if k < 2:
        raise ValueError("a GRPO group needs at least two rewards")
    mean = sum(rewards) / k
    if is_zero_std(rewards, tol):
        return [0.0] * k
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (k - 1))
    return [(r - mean) / (std + eps) for r in rewards]


def rloo_advantages(rewards: list[float], tol: float = 0.0) -> list[float]:
    """Leave-one-out: each reward against the mean of the other K-1 (RLOO; Kool et al. 2019,
    Ahmadian et al. 2024): A_c = r_c - (sum(r) - r_c) / (K - 1) = K / (K - 1) * (r_c - mean(r)).
    Unscaled by the spread, so it sums to exactly zero and a zero-spread group gets zeros."""
    k = len(rewards)
    if k < 2:
        raise ValueError("a leave-one-out baseline needs at least two rewards")
    if is_zero_std(rewards, tol):
        return [0.0] * k
    total = sum(rewards)
    return [r - (total - r) / (k - 1) for r in rewards]
