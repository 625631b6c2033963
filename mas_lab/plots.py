"""Charts of a run as PNG files (matplotlib), for papers and notes: `mas-lab plot RUN_DIR`.

Every chart has the training step on its x-axis and comes from the run store alone: held-out
success with its 95% interval at the steps it was evaluated (and what the best constant answer
scores on the same problems, baselines.py), mean reward per role and per
(agent, turn), team reward, the zero-std share of groups, and per policy loss, gradient norm,
clip fraction, entropy, the rollout/training mismatch, KL to the initial policy and ratio extremes,
the all-fail / all-success share of groups per (agent, turn), then the step time split.
"""
from __future__ import annotations

from pathlib import Path

from mas_lab.store import RunStore

PANELS = {
    "success": ("held-out success (95% interval)", ["eval/success_rate", "eval/constant_success"]),
    "reward_per_role": ("mean reward per role", ["reward/"]),
    "reward_per_agent_turn": ("mean reward per (agent, turn)", ["reward/*/t"]),
    "team": ("team reward and zero-std share of groups", ["team_reward", "zero_std_frac"]),
    "learner": ("loss, grad norm, clip fraction per policy", ["loss/", "grad_norm/", "clip_frac/"]),
    "sampling": ("entropy, response length, rollout/training mismatch per policy",
                 ["entropy/", "response_len/", "mismatch_abs/"]),
    "drift": ("KL to the initial policy, rollout/training KL, max ratio per policy",
              ["kl_initial/", "mismatch_kl/", "ratio_max/"]),
    "groups": ("groups with no signal per (agent, turn): all fail, all succeed",
               ["groups_all_fail/", "groups_all_success/"]),
    "time": ("step time split (s)", ["time/rollout", "time/reward", "time/learner", "time/weight_sync", "time/other"]),
}


def _matches(key: str, pattern: str) -> bool:
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
        if chosen:
            out[panel] = (title, {key: store.series(key) for key in chosen})
    return out


def plot_run(run_dir: Path, output: Path) -> list[Path]:
    """Write one PNG per panel that has data into `output`; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    store = RunStore(Path(run_dir) / "run.db", create=False)
    name = (store.meta().get("task") or {}).get("name", Path(run_dir).name)
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for panel, (title, series) in panel_series(store).items():
        fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
        for key, points in series.items():
            steps, values = [s for s, _ in points], [v for _, v in points]
            if key == "eval/constant_success":
                ax.plot(steps, values, linestyle="--", color="grey", label="best constant answer (no model)")
            elif panel == "success":
                low = dict(store.series("eval/success_ci_low"))
                high = dict(store.series("eval/success_ci_high"))
                errors = [[v - low.get(s, v) for s, v in points], [high.get(s, v) - v for s, v in points]]
                ax.errorbar(steps, values, yerr=errors, marker="o", capsize=4, label="greedy eval")
                ax.set_ylim(-0.02, 1.02)
            else:
                ax.plot(steps, values, marker="." if len(steps) < 60 else None, label=key)
        ax.set_xlabel("training step")
        ax.set_title(f"{name}: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        fig.tight_layout()
        path = output / f"{panel}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    store.close()
    return written
