"""The comparison's curves: held-out success against steps per regime (each seed faint, the mean
bold, the constant answer's band) and the training reward of each role."""

from __future__ import annotations

import contextlib
import functools
import itertools
import lzma
import shutil
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from mas_lab.records.store import RunStore
from mas_lab.training.metric_names import EVAL_SUCCESS


@contextlib.contextmanager
def kept_store(result: dict) -> Iterator[RunStore]:
    """The run's kept store (run.db.xz), opened for reading from its unpacked copy (_unpacked)."""
    store = RunStore(_unpacked(str(result["store"]), Path(result["store"]).stat().st_mtime_ns), create=False)
    try:
        yield store
    finally:
        store.close()


@functools.lru_cache(maxsize=None)
def _unpacked(packed: str, mtime_ns: int) -> Path:
    """A kept store unpacked once per process (a report reads each store for its curves, outcomes,
    starting point and metrics; ~2.5 MB a store); mtime: a store replaced is unpacked again."""
    path = Path(_folder().name) / f"{next(_NAMES)}.db"
    with lzma.open(packed) as source, open(path, "wb") as plain:
        shutil.copyfileobj(source, plain)
    return path


_NAMES = itertools.count()


@functools.lru_cache(maxsize=1)
def _folder() -> tempfile.TemporaryDirectory:
    """The process's folder of unpacked stores, made at the first store read, removed at exit."""
    return tempfile.TemporaryDirectory(prefix="mas-lab-kept-")


def curves(result: dict) -> dict[str, list[tuple[int, float]]]:
    """eval success, reward per role and gradient norm per policy against steps, from the run's kept store."""
    with kept_store(result) as store:
        keys = [k for k in store.metric_keys() if _curve(k)]
        return {key: store.series(key) for key in keys}


def _curve(key: str) -> bool:
    """The curves' metrics: eval success, each role's reward (not its parts), each policy's gradient norm."""
    return key == EVAL_SUCCESS or (key.startswith("reward/") and key.count("/") == 1) or key.startswith("grad_norm/")


def plot(
    results: list[dict],
    image: Path,
    constant: dict | None = None,
    names: tuple[str, ...] = (),
    problems: int | None = None,
) -> None:
    """Left: held-out success against steps, each seed faint, the mean over seeds bold with the
    range over seeds shaded, and the constant answer's pooled success with its 95% interval (grey).
    Right: the training reward of each role, mean over seeds (solid: the tool agent or the single
    agent; dashed: the planner). `problems`: the held-out problems per evaluation, for the title."""
    # lazy: matplotlib (~0.5 s), only when a chart is drawn
    import matplotlib

    matplotlib.use("Agg")
    # lazy: matplotlib (~0.5 s), only when a chart is drawn
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    order = [*names, *sorted({r["regime"] for r in results} - set(names))]  # a regime keeps its colour
    colours = dict(zip(order, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 3))
    by_regime: dict[str, list[dict[str, list[tuple[int, float]]]]] = {}
    for r in results:
        by_regime.setdefault(r["regime"], []).append(curves(r))
    for regime, runs in by_regime.items():
        colour, seeds = colours[regime], len(runs)
        for data in runs:
            if seeds > 1:
                faint = data.get(EVAL_SUCCESS, [(0, 0.0)])
                left.plot([s for s, _ in faint], [v for _, v in faint], color=colour, alpha=0.25, linewidth=1)
        successes = [data.get(EVAL_SUCCESS, []) for data in runs]
        steps, values = mean_curve(successes)
        if seeds > 1:  # the range over the seeds that reached each step (a range, not an interval)
            by_step = [[v for curve in successes for s, v in curve if s == step] for step in steps]
            left.fill_between(
                steps, [min(v) for v in by_step], [max(v) for v in by_step], color=colour, alpha=0.12, linewidth=0
            )
        left.plot(
            steps,
            values,
            marker="o",
            color=colour,
            linewidth=2,
            label=f"{regime} ({seeds} seed{'s' if seeds > 1 else ''})",
        )
        roles = sorted({key for data in runs for key in data if key.startswith("reward/") and key != "reward/mean"})
        for key in roles:
            role = key.split("/", 1)[1]
            steps, values = mean_curve([data.get(key, []) for data in runs])
            right.plot(
                steps,
                values,
                color=colour,
                alpha=0.8,
                linestyle="--" if role == "planner" else "-",
                label=f"{regime}: {role}",
            )
    if constant:
        left.axhspan(constant["low"], constant["high"], color="grey", alpha=0.15)
        left.axhline(constant["pooled"], color="grey", linestyle=":", label="constant answer (no model), 95% interval")
    left.set_ylim(0, 1)
    left.set(
        title=(
            f"held-out success (greedy{f', {problems} problems' if problems else ''}): mean over seeds,\n"
            "each seed faint, shaded: range over seeds"
        ),
        xlabel="step",
        ylabel="success rate",
    )
    right.set(title="training reward per role, mean over seeds", xlabel="step", ylabel="reward")
    left.legend(fontsize=7)
    right.legend(fontsize=6)
    fig.tight_layout()
    image.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(image, dpi=110)
    plt.close(fig)


def mean_curve(series: list[list[tuple[int, float]]]) -> tuple[list[int], list[float]]:
    """Mean over runs at each step, over the runs that have that step."""
    at: dict[int, list[float]] = {}
    for points in series:
        for step, value in points:
            at.setdefault(step, []).append(value)
    steps = sorted(at)
    return steps, [statistics.fmean(at[s]) for s in steps]
