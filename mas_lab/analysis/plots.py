"""Charts of a run as PNG files (matplotlib), for papers and notes: `mas-lab plot RUN_DIR`.

Every chart has the training step on its x-axis and comes from the run store alone: held-out
success with its 95% interval at the steps it was evaluated, beside what the baselines without a
model score on the same problems (the best constant answer and, in the move games, the reading
rules: baselines.py), the hard split (the problems a detour), mean reward per role and per
(agent, turn), team reward, the zero-std share of groups (steps with no learning signal marked),
and per policy loss, gradient norm, clip fraction, entropy, the rollout/training mismatch, KL to
the initial policy and ratio extremes, the all-fail / all-success share of groups per (agent,
turn), the curriculum stage, then the step time split. Each quantity gets an axis of its own.
"""

from __future__ import annotations

from pathlib import Path

from mas_lab.records.store import RunStore
from mas_lab.training.baselines import RULE_LABELS
from mas_lab.training.metric_names import (
    CONSTANT_SUCCESS,
    EVAL_CI_HIGH,
    EVAL_CI_LOW,
    EVAL_PREFIX,
    EVAL_SUCCESS,
    HARD_CI_HIGH,
    HARD_CI_LOW,
    HARD_PREFIX,
    HARD_SUCCESS,
    LEARNER_FLOPS,
    ROLLOUT_FLOPS,
    STEP_TIME,
    TIME_KEYS,
    rule_key,
)

EVAL_INTERVAL = (EVAL_CI_LOW, EVAL_CI_HIGH)
PANELS = {
    "success": (
        "held-out success (95% interval) and the baselines without a model",
        [EVAL_SUCCESS, *EVAL_INTERVAL, CONSTANT_SUCCESS, rule_key("*")],
    ),
    "hard": (
        "held-out success on the hard split (a detour needed)",
        [HARD_SUCCESS, HARD_CI_LOW, HARD_CI_HIGH, rule_key("*", hard=True)],
    ),
    "reward_per_role": ("mean reward per role", ["reward/"]),
    "reward_per_agent_turn": ("mean reward per (agent, turn)", ["reward/*/t"]),
    "team": ("team reward and zero-std share of groups", ["team_reward", "zero_std_frac"]),
    "learner": ("loss, grad norm, clip fraction per policy", ["loss/", "grad_norm/", "clip_frac/"]),
    "update": (
        "what each update did per policy: grad norm before and after the clip, share of optimizer steps it bound",
        ["grad_norm/", "grad_norm_clipped/", "grad_clip_frac/"],
    ),
    "per_agent": (
        "per agent: advantage spread, and gradient norm of its own samples (algorithm.role_grad_norms)",
        ["adv_std/", "grad_norm_role/"],
    ),
    "sampling": (
        "entropy, response length, rollout/training mismatch per policy",
        ["entropy/", "response_len/", "mismatch_abs/"],
    ),
    "drift": (
        "KL to the initial policy, rollout/training KL, max ratio per policy",
        ["kl_initial/", "mismatch_kl/", "ratio_max/"],
    ),
    "groups": (
        "groups with no signal per (agent, turn): all fail, all succeed",
        ["groups_all_fail/", "groups_all_success/"],
    ),
    "staleness": (
        "algorithm.overlap: updates between the weights that sampled a step and the weights it trains, per policy",
        ["staleness/"],
    ),
    "curriculum": ("curriculum stage (the task's own problems: the last)", ["curriculum/stage"]),
    # counted FLOPs over the phase's seconds, and that rate as a share of this machine's measured
    # matmul peak (benchmarks/matmul_peak.py; the share is absent where the peak was not measured)
    "utilisation": (
        "rollout and learner: GFLOP/s counted, and their share of the measured matmul peak",
        [f"{name}/" for phase in (ROLLOUT_FLOPS, LEARNER_FLOPS) for name in phase[1:]],
    ),
    # each part as its share of the step, the step in seconds on an axis of its own: in seconds one
    # 248-s learner step flattened every other step's split to the floor (see _time_split)
    "time": ("step time split: each part's share of the step, and the step (s)", list(TIME_KEYS)),
}
# a panel drawn only for runs that record a metric of their own (older stores have grad_norm but no clip
# share; every run records its staleness, 0 unless it overlaps, which only overlapped runs time)
REQUIRES = {"update": "grad_clip_frac/", "staleness": "time/overlap_wait"}
BASELINE_STYLES = {
    "constant": ("grey", "--"),
    "rows_first": ("tab:orange", ":"),
    "either_order": ("tab:red", "-."),
    "one_step": ("tab:purple", ":"),
    "optimum": ("tab:green", "--"),
}


def _matches(key: str, pattern: str) -> bool:
    if pattern.endswith("/*"):  # every key under it but intervals
        return key.startswith(pattern[:-1]) and not key.endswith(("_ci_low", "_ci_high"))
    if pattern == "reward/":
        return key.startswith("reward/") and key.count("/") == 1 and key != "reward/mean"
    if pattern == "reward/*/t":
        return key.startswith("reward/") and key.count("/") == 2
    return key.startswith(pattern) if pattern.endswith("/") else key == pattern


def panel_series(store: RunStore) -> dict[str, tuple[str, dict[str, list[tuple[int, float]]]]]:
    """panel -> (title, {metric key: [(step, value)]}) for every panel with data: the one
    definition of the charts, drawn by `plot_run` (PNG) and by the TUI's live screen."""
    keys = store.metric_keys()
    out = {}
    for panel, (title, patterns) in PANELS.items():
        chosen = [k for k in keys if any(_matches(k, p) for p in patterns)]
        needed = REQUIRES.get(panel)
        if chosen and (needed is None or any(_matches(k, needed) for k in keys)):
            series = {key: store.series(key) for key in chosen}
            out[panel] = (title, _time_split(series, store.series(STEP_TIME)) if panel == "time" else series)
    return out


def _time_split(parts: dict[str, list[tuple[int, float]]], step: list[tuple[int, float]]) -> dict:
    """The step time split as shares (time/rollout -> share/rollout = rollout seconds / step
    seconds, 0-1 whatever the step took) beside the step's seconds (seconds/step), two quantities
    that axis_groups puts on axes of their own."""
    total = {s: v for s, v in step if v > 0}
    out = {
        f"share/{key.split('/', 1)[1]}": [(s, v / total[s]) for s, v in points if s in total]
        for key, points in parts.items()
    }
    if step:
        out["seconds/step"] = step
    return out


def baseline_name(key: str) -> str | None:
    """'constant' or the rule's name for a baseline's metric key, else None."""
    if key.endswith("constant_success"):
        return "constant"
    return key.rsplit("/", 1)[1] if "/rule/" in key else None


def axis_groups(series: dict[str, list[tuple[int, float]]]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """The series of a panel by quantity (the key before its policy or role: loss/shared and
    loss/tool share an axis, grad_norm/shared gets its own), so no quantity is flattened by
    another's scale."""
    groups: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for key, points in series.items():
        quantity = key.split("/", 1)[0] if key.count("/") == 1 and not key.startswith(("reward/", "time/")) else ""
        groups.setdefault(quantity, {})[key] = points
    return groups


def _draw_success(ax, store: RunStore, series: dict, interval: tuple[str, str]) -> None:
    """The team's evaluations as points with their 95% intervals (never joined: between two
    evaluations nothing was measured), the baselines as dashed lines."""
    for key, points in series.items():
        steps, values = [s for s, _ in points], [v for _, v in points]
        name = baseline_name(key)
        if name is not None:
            colour, style = BASELINE_STYLES.get(name, ("black", ":"))
            label = "best constant answer" if name == "constant" else RULE_LABELS.get(name, name)
            ax.plot(steps, values, linestyle=style, color=colour, label=f"{label} (no model)")
        elif key.endswith("success_rate"):
            low, high = dict(store.series(interval[0])), dict(store.series(interval[1]))
            errors = [[v - low.get(s, v) for s, v in points], [high.get(s, v) - v for s, v in points]]
            ax.errorbar(steps, values, yerr=errors, marker="o", linestyle="none", capsize=4, label="the team (greedy)")
    ax.set_ylim(-0.02, 1.02)


def plot_run(run_dir: Path, output: Path) -> list[Path]:
    """Write one PNG per panel that has data into `output`; returns the files written."""
    # lazy: matplotlib (~0.5 s), only when a chart is drawn
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib (~0.5 s), only when a chart is drawn
    import matplotlib.pyplot as plt

    store = RunStore(Path(run_dir) / "run.db", create=False)
    name = (store.meta().get("task") or {}).get("name", Path(run_dir).name)
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for panel, (title, series) in panel_series(store).items():
        if panel in ("success", "hard"):
            fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
            prefix = EVAL_PREFIX if panel == "success" else HARD_PREFIX
            _draw_success(ax, store, series, (f"{prefix}success_ci_low", f"{prefix}success_ci_high"))
            axes = [ax]
        else:
            groups = axis_groups(series)
            fig, grid = plt.subplots(
                len(groups), 1, figsize=(7, 1.2 + 2.2 * len(groups)), dpi=110, sharex=True, squeeze=False
            )
            axes = [row[0] for row in grid]
            for ax, (quantity, members) in zip(axes, groups.items()):
                for key, points in members.items():
                    steps, values = [s for s, _ in points], [v for _, v in points]
                    ax.plot(steps, values, marker="." if len(steps) < 60 else None, label=key)
                    if key == "zero_std_frac":  # no group carried a signal: the update did nothing
                        idle = [s for s, v in points if v >= 1.0]
                        if idle:
                            ax.scatter(
                                idle,
                                [1.0] * len(idle),
                                marker="x",
                                color="red",
                                zorder=3,
                                label="no learning signal (every group zero-std)",
                            )
                if quantity:
                    ax.set_ylabel(quantity, fontsize=8)
        axes[-1].set_xlabel("training step")
        axes[0].set_title(f"{name}: {title}", fontsize=10)
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        path = output / f"{panel}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    store.close()
    return written
