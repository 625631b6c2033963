"""The per-step diagnostics RL practitioners watch, from a step's groups (pure; no I/O).

Per policy: entropy of the sampled distributions (token-weighted mean), response length (mean,
max) and the share cut at max_new_tokens, the advantage distribution of the samples it trains on
(mean |A|, shares positive / negative / zero). Per (agent, turn): the share of groups where every
candidate failed, every one succeeded (its branch solved the task), or the results were mixed:
the all-fail and all-success groups are the ones with no learning signal. (Loss, clip fraction,
grad norm and the rollout/training mismatch come from the learner.)
"""

from __future__ import annotations

from collections import defaultdict

from mas_lab.algo.groups import Group


def diagnostics(groups: list[Group], kept: list[Group]) -> dict[str, float]:
    out: dict[str, float] = {}
    by_policy = defaultdict(list)
    for group in groups:
        for candidate in group.members:
            by_policy[candidate.policy].append(candidate)
    for policy, candidates in by_policy.items():
        lengths = [len(c.response_ids) for c in candidates]
        out[f"response_len/{policy}"] = sum(lengths) / len(lengths)
        out[f"response_len_max/{policy}"] = float(max(lengths))
        out[f"truncated_frac/{policy}"] = sum(c.truncated for c in candidates) / len(candidates)
        weighted = [(c.entropy, len(c.response_ids)) for c in candidates if c.entropy is not None and c.response_ids]
        if weighted:
            out[f"entropy/{policy}"] = sum(h * n for h, n in weighted) / sum(n for _, n in weighted)
    trained = defaultdict(list)
    for group in kept:
        for candidate in group.members:
            trained[candidate.policy].append(candidate.advantage)
    by_role = defaultdict(list)
    for group in kept:
        for candidate in group.members:
            by_role[candidate.role].append(candidate.advantage)
    for role, advantages in by_role.items():  # per agent: how widely its credit spreads (a spike shows here)
        mean = sum(advantages) / len(advantages)
        out[f"adv_std/{role}"] = (sum((a - mean) ** 2 for a in advantages) / len(advantages)) ** 0.5
        out[f"adv_abs_max/{role}"] = max(abs(a) for a in advantages)
    for policy, advantages in trained.items():
        n = len(advantages)
        out[f"adv_abs_mean/{policy}"] = sum(abs(a) for a in advantages) / n
        out[f"adv_pos_frac/{policy}"] = sum(a > 0 for a in advantages) / n
        out[f"adv_neg_frac/{policy}"] = sum(a < 0 for a in advantages) / n
        out[f"adv_zero_frac/{policy}"] = sum(a == 0 for a in advantages) / n
    outcome: defaultdict[str, list[int]] = defaultdict(
        lambda: [0, 0, 0]
    )  # (agent, turn) -> all fail, all success, mixed
    for group in groups:
        # a candidate of a (problem, agent, turn) group solved the problem, or a trajectory of a
        # trajectory group reached a solved state at some action (its early actions never do)
        solved = [max(c.team for c in unit) >= 1.0 for unit in group.units]
        counts = outcome[group.key.role if group.key.is_trajectory else f"{group.key.role}/t{group.key.turn}"]
        counts[0 if not any(solved) else 1 if all(solved) else 2] += 1
    for where, (fail, success, mixed) in outcome.items():
        total = fail + success + mixed
        out[f"groups_all_fail/{where}"] = fail / total
        out[f"groups_all_success/{where}"] = success / total
        out[f"groups_mixed/{where}"] = mixed / total
    return out
