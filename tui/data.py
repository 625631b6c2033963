"""Read-only snapshots of a run store, taken in worker threads (each opens its own connection)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from mas_lab.analysis.plots import panel_series
from mas_lab.records.control import RunControl
from mas_lab.records.store import RunStore
from mas_lab.training.metric_names import EVAL_TIME, STEP_TIME, TIME_SPLIT
from mas_lab.training.progress import time_left

SPLIT = TIME_SPLIT


def open_store(run_dir: Path) -> RunStore:
    return RunStore(Path(run_dir) / "run.db", create=False)


@dataclass
class LiveSnapshot:
    task: dict
    state: dict
    total_steps: int
    # panel -> (title, {metric key: [(step, value)]}), the charts of `mas-lab plot`
    panels: dict[str, tuple[str, dict[str, list[tuple[int, float]]]]] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    started: float | None = None
    finished: float | None = None
    left_s: float | None = None  # training/progress.time_left: steps and evaluations left at the run's pace


def live_snapshot(run_dir: Path, events_after: float) -> LiveSnapshot:
    store = open_store(run_dir)
    try:
        meta = store.meta()
        task = meta.get("task") or {}
        state = RunControl(store).status()
        steps = store.metrics()
        train = [m for m in steps.values() if STEP_TIME in m]
        last = dict(train[-1]) if train else {}
        first, last_finished = store.time_span()
        total = int(task.get("train", {}).get("steps", 0))
        left = time_left(
            [m[STEP_TIME] for m in train],
            [m[EVAL_TIME] for m in steps.values() if EVAL_TIME in m],
            max((s for s, m in steps.items() if STEP_TIME in m), default=0),
            total,
            task.get("train", {}).get("eval_every"),
        )
        return LiveSnapshot(
            task, state, total, panel_series(store), last, store.events(events_after), first, last_finished, left
        )
    finally:
        store.close()


QUIET_EVENTS = ("checkpoint",)  # one a step: the header shows the last one


def event_line(event: dict) -> str | None:
    """One event as the log shows it, or None for the kinds the header already shows. Events
    whose message carries JSON (where the actors run, their dtypes) are said in words."""
    kind, message = event["kind"], event["message"]
    if kind in QUIET_EVENTS:
        return None
    if kind in ("placement", "precision") and ": {" in message:
        try:
            detail = json.loads(message.split(": ", 1)[1])
        except ValueError:
            detail = None
        if isinstance(detail, dict) and kind == "placement":
            message = f"{len(detail)} actors on {len(set(detail.values()))} node(s)"
        elif isinstance(detail, dict):
            dtypes = sorted({str(d.get("dtype")) for d in detail.values() if isinstance(d, dict)})
            message = f"actors compute in {', '.join(dtypes)}"
    return f"step {event['step']:>4}  {kind:<10} {message}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "-"
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def now() -> float:
    return time.time()
