"""The statistics a run reports: Wilson intervals, the before/after verdict in words, how held-out
success compares with the baselines that use no model, and the reward metrics of a set of episodes.

Pure functions of numbers and episode records (no model, no store, no Ray), so the benchmarks and
the study reports use them without importing the training loop.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Mapping, Sequence

from mas_lab.analysis.paired import sentence
from mas_lab.training.metric_names import EVAL_PREFIX, LEARNER_FLOPS, ROLLOUT_FLOPS

if TYPE_CHECKING:
    from mas_lab.training.episodes import Episode


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a success rate."""
    if n == 0:
        return (0.0, 0.0)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def verdict(before: dict | None, after: dict | None, constant: dict | None = None) -> str:
    """The before/after comparison of held-out success in plain words (95% Wilson intervals), and,
    when the environment has one, how "after" compares with the best constant answer (baselines.py):
    a lift that does not clear it may be one learned answer, not solving the task."""
    if before is None or after is None:
        return "no evaluation after training to compare with" if before else "no evaluation"
    (b_low, b_high), (a_low, a_high) = before["ci"], after["ci"]
    change = f"held-out success {before['success']:.3f} [{b_low:.2f}, {b_high:.2f}] -> {after['success']:.3f} [{a_low:.2f}, {a_high:.2f}]"
    if a_low > b_high:
        out = change + ": better after training (the 95% intervals do not overlap)"
    elif a_high < b_low:
        out = change + ": worse after training (the 95% intervals do not overlap)"
    else:
        out = change + ": no clear change (the 95% intervals overlap)"
    if constant is None:
        return out
    c_low, c_high = constant["ci"]
    fixed = f"the best constant answer ({constant['answer']!r}, the same reply to every problem) solves {constant['success']:.3f} [{c_low:.2f}, {c_high:.2f}]"
    if a_low > c_high:
        return out + f"; above the best constant answer: {fixed}"
    if a_low > b_high:
        return (
            out
            + f"; but not clearly above what a fixed answer scores: {fixed}, so the team may have learned one answer rather than to solve the task"
        )
    return out + f"; for comparison, {fixed}"


def paired_verdict(before: dict | None, after: dict | None, evidence: Mapping) -> str:
    """The run's held-out result in words that follow the paired tests (mas_lab/analysis/evidence.py): the
    change training made on the same problems, then the team against each baseline without a model
    on the main split and on the hard split, each with n, the discordant counts and the p-value."""
    if before is None or after is None:
        return "no evaluation after training to compare with" if before else "no evaluation"
    said = f"held-out success {before['success']:.3f} -> {after['success']:.3f}"
    change = evidence.get("change")
    if change is not None:
        said += f" on the same {evidence['problems']} problems: " + {
            "above": "better after training",
            "below": "worse after training",
        }.get(change.word, "no change training made is distinguishable")
        said += f" ({change.evidence()})"
    if evidence.get("baselines"):
        said += ". Against the baselines without a model on the same problems, after training it is " + sentence(
            evidence["baselines"]
        )
    if evidence.get("hard"):
        said += f". On the hard split ({evidence['hard_problems']} problems, a detour needed): " + sentence(
            evidence["hard"]
        )
    return said


def reward_metrics(episodes: list[Episode], prefix: str = "") -> dict[str, float]:
    """Mean reward per role and per (role, turn), final team reward and success rate."""
    out: dict[str, float] = {}
    by_role: dict[str, list[float]] = {}
    by_role_turn: dict[str, list[float]] = {}
    for episode in episodes:
        for turn in episode.turns:
            rewards = [c.reward for c in turn.candidates]
            by_role.setdefault(turn.role, []).extend(rewards)
            by_role_turn.setdefault(f"{turn.role}/t{turn.turn}", []).extend(rewards)
    for key, values in {**by_role, **by_role_turn}.items():
        out[f"{prefix}reward/{key}"] = statistics.fmean(values)
    everything = [r for values in by_role.values() for r in values]
    out[f"{prefix}reward/mean"] = statistics.fmean(everything) if everything else 0.0
    # the live state's at the end: in a parallel turn the last agent's branch misses the others' actions
    finals = [e.final_team for e in episodes if e.turns]
    out[f"{prefix}team_reward"] = statistics.fmean(finals) if finals else 0.0
    out[f"{prefix}success_rate"] = statistics.fmean(float(e.success) for e in episodes) if episodes else 0.0
    out[f"{prefix}turns"] = statistics.fmean(len({t.turn for t in e.turns}) for e in episodes) if episodes else 0.0
    return out


def update_diagnostics(metrics: Mapping[int, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """What the updates of a run did, per policy, from its steps' metrics: the share of optimizer
    steps whose gradient-norm clip bound (the step was scaled down to `grad_clip`), the median
    gradient norm before and after the clip, the training steps that updated it and the samples
    and tokens they trained, and the widest PPO ratio seen (exactly 1 with one epoch and one
    mini-batch: logp_old is logp itself). Steps of an older store without the clip share count
    nowhere."""
    out: dict[str, dict[str, float]] = {}
    policies = sorted({k.split("/", 1)[1] for m in metrics.values() for k in m if k.startswith("grad_clip_frac/")})
    for policy in policies:
        steps = [m for m in metrics.values() if f"grad_clip_frac/{policy}" in m and m.get(f"samples/{policy}", 0) > 0]
        if not steps:
            continue
        before = [m[f"grad_norm/{policy}"] for m in steps if f"grad_norm/{policy}" in m]
        after = [m[f"grad_norm_clipped/{policy}"] for m in steps if f"grad_norm_clipped/{policy}" in m]
        out[policy] = {
            "steps": float(len(steps)),
            "clip_bound_share": statistics.fmean(m[f"grad_clip_frac/{policy}"] for m in steps),
            "grad_norm_median": statistics.median(before) if before else math.nan,
            "grad_norm_clipped_median": statistics.median(after) if after else math.nan,
            "samples": float(sum(m.get(f"samples/{policy}", 0) for m in steps)),
            "tokens": float(sum(m.get(f"tokens/{policy}", 0) for m in steps)),
            "ratio_min": min((m[f"ratio_min/{policy}"] for m in steps if f"ratio_min/{policy}" in m), default=math.nan),
            "ratio_max": max((m[f"ratio_max/{policy}"] for m in steps if f"ratio_max/{policy}" in m), default=math.nan),
        }
    return out


def update_text(diagnostics: Mapping[str, Mapping[str, float]]) -> str:
    """The update diagnostics in one line per policy."""
    return "; ".join(
        f"{policy}: clip bound on {d['clip_bound_share']:.0%} of optimizer steps over {int(d['steps'])} steps, "
        f"grad norm median {d['grad_norm_median']:.3g} before the clip, {d['grad_norm_clipped_median']:.3g} after; "
        f"PPO ratio in [{d['ratio_min']:.3g}, {d['ratio_max']:.3g}]"
        for policy, d in diagnostics.items()
    )


def utilisation_text(steps: Sequence[Mapping[str, float]]) -> str:
    """Each policy's rollout and learner rate over the run's steps (mean GFLOP/s), with its share of
    the machine's measured matmul peak where there is one (modeling/flops.py); "" where nothing was
    counted."""
    parts = []
    for phase, (_, per_s, util) in (("rollout", ROLLOUT_FLOPS), ("learner", LEARNER_FLOPS)):
        rates: dict[str, list[float]] = {}
        shares: dict[str, list[float]] = {}
        for metrics in steps:
            for key, value in metrics.items():
                name, _, policy = key.partition("/")
                if name == per_s:
                    rates.setdefault(policy, []).append(value)
                elif name == util:
                    shares.setdefault(policy, []).append(value)
        for policy, values in rates.items():
            share = shares.get(policy)
            of_peak = f" ({sum(share) / len(share):.0%} of peak)" if share else " (peak not measured)"
            parts.append(f"{phase} {policy} {sum(values) / len(values):.1f} GFLOP/s{of_peak}")
    return "; ".join(parts)


def baselines_from_metrics(metrics: Mapping[str, float], labels: Mapping[str, str], prefix: str = EVAL_PREFIX) -> dict:
    """The baselines without a model an evaluation stored (`{prefix}constant_success` and
    `{prefix}rule/NAME`, each with its interval) as {name: {label, success, ci}}, for the summary's table rows."""
    out: dict[str, dict] = {}
    if f"{prefix}constant_success" in metrics:
        out["constant"] = {
            "label": "the best constant answer",
            "success": metrics[f"{prefix}constant_success"],
            "ci": [metrics[f"{prefix}constant_ci_low"], metrics[f"{prefix}constant_ci_high"]],
        }
    for name, label in labels.items():
        key = f"{prefix}rule/{name}"
        if key in metrics:
            out[name] = {
                "label": label,
                "success": metrics[key],
                "ci": [metrics[f"{key}_ci_low"], metrics[f"{key}_ci_high"]],
            }
    return out


def hard_split_text(metrics: Mapping[str, float], prefix: str = EVAL_PREFIX) -> str:
    """The team's success on the hard split with its interval, and the rules' there, in one line."""
    if f"{prefix}hard/success_rate" not in metrics:
        return "no hard problems in this evaluation" if metrics.get(f"{prefix}hard/problems") == 0 else "-"
    low, high = metrics[f"{prefix}hard/success_ci_low"], metrics[f"{prefix}hard/success_ci_high"]
    rules = ", ".join(
        f"{key.rsplit('/', 1)[1]} {value:.3f}"
        for key, value in sorted(metrics.items())
        if key.startswith(f"{prefix}hard/rule/")
    )
    return (
        f"{metrics[f'{prefix}hard/success_rate']:.3f} [{low:.2f}, {high:.2f}] on "
        f"{int(metrics[f'{prefix}hard/problems'])} problems (rules there: {rules})"
    )
