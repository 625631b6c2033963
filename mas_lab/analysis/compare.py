"""Runs side by side (`mas-lab compare RUN_OR_STUDY ... -o DIR`): their curves overlaid against
steps (held-out success with its 95% intervals: across a label's runs, the runs as the unit; reward per role, KL to the initial policy,
entropy, the zero-std share), each run faint and the mean of each label bold; the settings in
which the runs differ; and a table of the final held-out success pooled per label with its
interval and per-run values, and every pair of labels paired on the same held-out problems seed by
seed. Runs are labelled by their regime (a kept study run's summary), else each by its own name
(`--group-by` chooses: run, task, or a task key); runs with one label are seeds of one setting.
PNG and Markdown out."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from mas_lab.analysis.paired import compare_paired, on_common_problems
from mas_lab.analysis.reporting import update_diagnostics, wilson_interval
from mas_lab.config import TaskConfig, flat_params, stored_task_data
from mas_lab.notebook import RunData, final_splits, load_run, load_study
from mas_lab.study.spec import read_kept_json
from mas_lab.training.metric_names import EVAL_SUCCESS

PANELS = {
    "success": ("held-out success (greedy)", [EVAL_SUCCESS]),
    "reward": ("training reward per role", ["reward/"]),
    "kl": ("KL to the initial policy", ["kl_initial/"]),
    "entropy": ("entropy of the sampled distributions", ["entropy/"]),
    "zero_std": ("share of groups with no signal (zero-std)", ["zero_std_frac"]),
}


@dataclass
class Compared:
    label: str
    name: str
    run: RunData

    @cached_property
    def finals(self) -> dict[str, dict[str, bool]]:
        """The final evaluation's outcome per problem, per split (notebook.final_splits), read once."""
        return final_splits(self.run)


def gather(
    paths: list[Path],
    labels: dict[Path, str] | None = None,
    group_by: str = "regime",
    skipped: dict[str, str] | None = None,
) -> list[Compared]:
    """Every run under the given run or study folders, with its label: `labels` (a folder's label,
    given), else by `group_by`: "regime" (a kept study run's regime, else the run's own name: runs
    are pooled only when they are seeds of one regime), "run" (every run its own label), "task"
    (the task's name) or a task key such as `algorithm.mode` ("algorithm.mode=tree")."""
    labels = labels or {}
    found: list[Compared] = []
    for path in paths:
        runs = (
            {path.name: load_run(path)}
            if (path / "run.db").is_file() or (path / "run.db.xz").is_file()
            else _study_runs(path, skipped)
        )
        for name, run in runs.items():
            summary = run.path / "summary.json"
            regime = read_kept_json(summary).get("regime") if summary.is_file() else None
            if path in labels:
                label = labels[path]
            elif group_by == "regime":
                label = regime or name
            elif group_by == "run":
                label = name
            elif group_by == "task":
                label = str(run.task.get("name") or name)
            else:
                flat = flat_params(TaskConfig.model_validate(stored_task_data(run.task)))
                if group_by not in flat:
                    raise ValueError(f"--group-by {group_by}: not a task key (e.g. algorithm.mode, train.seed)")
                label = f"{group_by}={flat[group_by]}"
            found.append(Compared(label, name, run))
    if not found:
        raise FileNotFoundError(f"no run folder (run.db or run.db.xz) under {', '.join(map(str, paths))}")
    return found


def _study_runs(path: Path, skipped: dict[str, str] | None) -> dict[str, RunData]:
    """The readable runs of a study folder; a damaged one goes to `skipped` (name -> why)."""
    study = load_study(path)
    if skipped is not None:
        skipped.update({f"{path.name}/{name}": why for name, why in study.damaged.items()})
    return {f"{path.name}/{name}": run for name, run in study.runs.items()}


def _keys(metrics, patterns: list[str]) -> list[str]:
    return [
        k
        for k in metrics.columns
        if any(
            k == p or (p.endswith("/") and k.startswith(p) and k.count("/") == 1 and k != "reward/mean")
            for p in patterns
        )
    ]


def plot(runs: list[Compared], out: Path) -> list[Path]:
    """One PNG per panel: each run faint, each label's mean bold (mean over its runs at each step)."""
    # lazy: matplotlib (~0.5 s), only when a chart is drawn
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib (~0.5 s), only when a chart is drawn
    import matplotlib.pyplot as plt

    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = list(dict.fromkeys(r.label for r in runs))
    written = []
    for panel, (title, patterns) in PANELS.items():
        keys = sorted({k for r in runs for k in _keys(r.run.metrics, patterns)})
        if not keys:
            continue
        fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
        for index, label in enumerate(labels):
            colour = colours[index % len(colours)]
            members = [r for r in runs if r.label == label]
            for style, key in zip(("-", "--", ":", "-."), keys):
                series = [r.run.metrics[key].dropna() for r in members if key in r.run.metrics]
                if not series:
                    continue
                for s in series if len(series) > 1 else []:
                    ax.plot(s.index, s.values, color=colour, alpha=0.25, linewidth=1, linestyle=style)
                steps = sorted({int(i) for s in series for i in s.index})
                means = [statistics.fmean(float(s[i]) for s in series if i in s.index) for i in steps]
                suffix = f" {key.split('/', 1)[1]}" if "/" in key and len(keys) > 1 else ""
                ax.plot(
                    steps,
                    means,
                    color=colour,
                    linewidth=2,
                    linestyle=style,
                    marker="o" if panel == "success" else None,
                    label=f"{label}{suffix} ({len(series)} run{'s' * (len(series) > 1)})",
                )
            if panel == "success":  # each label's 95% interval at each step: across its runs, or a run's own
                band = _band_by_step(members)
                if band:
                    ax.fill_between(
                        [s for s, _, _ in band],
                        [lo for _, lo, _ in band],
                        [hi for _, _, hi in band],
                        color=colour,
                        alpha=0.12,
                        linewidth=0,
                    )
        if panel == "success":
            ax.set_ylim(-0.02, 1.02)
        ax.set(title=title, xlabel="training step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"compare_{panel}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def _band_by_step(members: list[Compared]) -> list[tuple[int, float, float]]:
    """(step, low, high) of a label's held-out success at each evaluated step: with several runs
    (seeds), the 95% t-interval of the mean across them, the runs as the unit (pooling their
    episodes as one sample once drew a +-0.07 band around runs 0.55 apart); with one run, its own
    Wilson interval."""
    # lazy: scipy (~0.7 s), only when a test or an interval is computed
    from scipy.stats import t

    by_step: dict[int, list[tuple[int, int]]] = {}
    for r in members:
        episodes = r.run.episodes.query("kind == 'eval'")
        for step, group in episodes.groupby("step"):
            by_step.setdefault(int(step), []).append((int(group["success"].sum()), len(group)))
    out = []
    for step, runs in sorted(by_step.items()):
        if len(runs) == 1:
            out.append((step, *wilson_interval(*runs[0])))
            continue
        rates = [solved / n for solved, n in runs]
        mean, sd = statistics.fmean(rates), statistics.stdev(rates)
        half = float(t.ppf(0.975, len(rates) - 1)) * sd / len(rates) ** 0.5
        out.append((step, max(0.0, mean - half), min(1.0, mean + half)))
    return out


def differences(runs: list[Compared]) -> dict[str, list[str]]:
    """The task settings that differ between the labels or between the runs of one label: flat key
    -> each label's value (its runs' values joined with " / " where they differ, e.g. seeds)."""
    flat = []
    for r in runs:
        try:
            flat.append(flat_params(TaskConfig.model_validate(stored_task_data(r.run.task))))
        except Exception:  # a task this version cannot read: compare what was stored
            flat.append({k: str(v) for k, v in r.run.task.items()})
    keys = sorted({k for f in flat for k in f})
    labels = list(dict.fromkeys(r.label for r in runs))
    out = {}
    for key in keys:
        if len({f.get(key) for f in flat}) > 1:
            out[key] = [
                " / ".join(dict.fromkeys(f.get(key, "-") for f, r in zip(flat, runs) if r.label == label))
                for label in labels
            ]
    return out


def table(runs: list[Compared]) -> list[str]:
    """Final held-out success on the main split pooled per label (95% Wilson interval) and per run;
    where a run evaluated a hard split, that split's pooled success in a column of its own."""
    finals: dict[str, list[tuple[int, int]]] = {}
    hard: dict[str, list[tuple[int, int]]] = {}
    for r in runs:
        if main := r.finals["main"]:
            finals.setdefault(r.label, []).append((sum(main.values()), len(main)))
        if extra := r.finals["hard"]:
            hard.setdefault(r.label, []).append((sum(extra.values()), len(extra)))

    def pooled(counts: list[tuple[int, int]]) -> str:
        solved, n = sum(s for s, _ in counts), sum(n for _, n in counts)
        low, high = wilson_interval(solved, n)
        return f"{solved / n:.3f} [{low:.3f}, {high:.3f}] (n={n})"

    head = "| label | runs | final held-out success, pooled [95% interval] | per run |"
    lines = [
        head + (" hard split, pooled [95% interval] |" if hard else ""),
        "|---|---|---|---|" + ("---|" if hard else ""),
    ]
    for label, counts in finals.items():
        row = f"| {label} | {len(counts)} | {pooled(counts)} | {' / '.join(f'{s / m:.3f}' for s, m in counts)} |"
        lines.append(row + (f" {pooled(hard[label]) if label in hard else '-'} |" if hard else ""))
    return lines


def paired_table(runs: list[Compared], split: str = "main") -> list[str]:
    """Every pair of labels, paired on the same held-out problems seed by seed (the run of each label
    with that `train.seed`; mas_lab/analysis/paired.py), on one split (notebook.final_splits: the
    main evaluation set, or the hard split; Compared.finals): discordant counts per seed, the exact p-value, the
    difference with its interval and the verdict in the paired test's words. Empty for one label,
    and for a split no two labels evaluated."""
    by_label: dict[str, dict[int, dict[str, bool]]] = {}
    for r in runs:
        seed = int((r.run.task.get("train") or {}).get("seed", 0))
        if found := r.finals[split]:
            by_label.setdefault(r.label, {}).setdefault(seed, found)
    labels = list(by_label)
    lines = [
        "| A | B | seeds | discordant A only / B only, per seed | exact p | A - B [95%] | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            pairs, seeds = [], []
            for seed in sorted(by_label[a].keys() & by_label[b].keys()):
                x, y = on_common_problems(by_label[a][seed], by_label[b][seed])
                if x:
                    pairs.append((x, y))
                    seeds.append(seed)
            if not pairs:
                lines.append(f"| {a} | {b} | - | no seed evaluated on the same problems | | | not paired |")
                continue
            v = compare_paired(pairs)
            low, high = v.diff_ci
            word = v.ordering(a, b)
            lines.append(
                f"| {a} | {b} | {', '.join(map(str, seeds))} | {', '.join(f'{s.a_only}/{s.b_only}' for s in v.seeds)} "
                f"| {v.p_value:.3g} | {v.diff:+.3f} [{low:+.2f}, {high:+.2f}] | {word} |"
            )
    return lines if len(labels) > 1 else []


def update_table(runs: list[Compared]) -> list[str]:
    """What each run's updates did (reporting.update_diagnostics): per run and policy, the share of
    optimizer steps whose gradient-norm clip bound, the median norm before and after it, and the
    PPO ratio's range. Runs of different labels that clip on different shares of their steps took
    different effective step sizes. Empty when no run recorded the clip share (older stores)."""
    lines = [
        "| label | run | policy | clip bound (share of optimizer steps) | grad norm median before / after | "
        "PPO ratio range | samples trained |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        metrics = r.run.metrics
        by_step = {int(step): {k: v for k, v in row.items() if v == v} for step, row in metrics.iterrows()}
        for policy, d in update_diagnostics(by_step).items():
            lines.append(
                f"| {r.label} | {r.name} | {policy} | {d['clip_bound_share']:.0%} | {d['grad_norm_median']:.3g} / "
                f"{d['grad_norm_clipped_median']:.3g} | [{d['ratio_min']:.3g}, {d['ratio_max']:.3g}] | "
                f"{int(d['samples'])} |"
            )
    return lines if len(lines) > 2 else []


def compare(paths: list[Path], out: Path, labels: dict[Path, str] | None = None, group_by: str = "regime") -> Path:
    """Write compare.md and the PNGs into `out`; returns the Markdown file."""
    skipped: dict[str, str] = {}
    runs = gather(paths, labels, group_by, skipped)
    out.mkdir(parents=True, exist_ok=True)
    images = plot(runs, out)
    diff = differences(runs)
    lines = [f"# {len(runs)} runs compared", "", "Runs: " + ", ".join(f"`{r.name}` ({r.label})" for r in runs), ""]
    if skipped:
        lines += ["Not compared (damaged): " + "; ".join(f"`{name}`: {why}" for name, why in skipped.items()), ""]
    lines += table(runs) + [""]
    if paired := paired_table(runs):
        lines += [
            "Paired on the same held-out problems (final evaluations; runs of one seed against each other; "
            'exact McNemar per seed, the exact stratified test over seeds; "above" only where significant at '
            "0.05 and no seed goes the other way):",
            "",
            *paired,
            "",
        ]
    if paired := paired_table(runs, "hard"):
        lines += ["On the hard split (the extra held-out problems that need a detour), paired the same way:", ""]
        lines += [*paired, ""]
    if updates := update_table(runs):
        lines += ["What the updates did:", "", *updates, ""]
    if diff:
        lines += [
            "Settings that differ:",
            "",
            "| setting | " + " | ".join(dict.fromkeys(r.label for r in runs)) + " |",
            "|---|" + "---|" * len(dict.fromkeys(r.label for r in runs)),
        ]
        lines += [f"| `{k}` | " + " | ".join(values) + " |" for k, values in diff.items()]
    else:
        lines += ["The runs' settings are identical."]
    lines += ["", *[f"![{p.stem}]({p.name})" for p in images], ""]
    path = out / "compare.md"
    path.write_text("\n".join(lines))
    return path
