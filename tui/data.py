"""Read-only snapshots of a run store, taken in worker threads (each opens its own connection)."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from mas_lab.control import RunControl
from mas_lab.store import RunStore

LIVE_SERIES = ("reward/mean", "eval/success_rate", "zero_std_frac", "time/step", "team_reward")
SPLIT = ("rollout", "reward", "learner", "weight_sync", "other")


def open_store(run_dir: Path) -> RunStore:
    return RunStore(Path(run_dir) / "run.db", create=False)


@dataclass
class LiveSnapshot:
    task: dict
    state: dict
    total_steps: int
    series: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    started: float | None = None
    finished: float | None = None
    mean_step_s: float | None = None


def live_snapshot(run_dir: Path, events_after: float) -> LiveSnapshot:
    store = open_store(run_dir)
    try:
        meta = store.meta()
        task = meta.get("task") or {}
        state = RunControl(store).status()
        keys = [k for k in store.metric_keys() if k in LIVE_SERIES or k.startswith(("reward/", "loss/"))]
        keys = [k for k in keys if k.count("/") <= 1]
        series = {k: [v for _, v in store.series(k)] for k in keys}
        steps = store.metrics()
        train = [m for m in steps.values() if "time/step" in m]
        last = dict(train[-1]) if train else {}
        first, last_finished = store.time_span()
        mean_step = sum(m["time/step"] for m in train[-5:]) / len(train[-5:]) if train else None
        return LiveSnapshot(task, state, int(task.get("train", {}).get("steps", 0)), series, last,
                            store.events(events_after), first, last_finished, mean_step)
    finally:
        store.close()


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds:
        return "-"
    seconds = int(max(0, seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def now() -> float:
    return time.time()
