"""Opening and scrolling a large run store in the dashboard, printed as JSON.

    .venv/bin/python benchmarks/tui_store.py RUN_DIR [--scroll 50]

Measures, with Textual's headless driver: time until the replay screen shows its first episode,
time to open the groups screen, mean and max time per `]` (next step) over --scroll presses in
each, and the process's peak resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import time
from pathlib import Path

from mas_lab.records.store import RunStore
from tui.app import MasLabApp


async def press_timed(pilot, key: str, times: int, result: dict, prefix: str) -> None:
    """Press `key` `times` times; record the mean and max seconds until the screen settles."""
    durations = []
    for _ in range(times):
        started = time.perf_counter()
        await pilot.press(key)
        await pilot.pause()
        durations.append(time.perf_counter() - started)
    result[f"{prefix}_mean_s"] = round(statistics.fmean(durations), 4)
    result[f"{prefix}_max_s"] = round(max(durations), 4)


async def measure(run_dir: Path, scroll: int) -> dict:
    store = RunStore(run_dir / "run.db", create=False)
    counts = store.rows(
        "SELECT (SELECT COUNT(*) FROM candidates) AS candidates, (SELECT COUNT(*) FROM episodes) AS episodes,"
        " (SELECT COUNT(*) FROM groups) AS groups, (SELECT COUNT(*) FROM steps) AS steps"
    )[0]
    started = time.perf_counter()
    app = MasLabApp(run_dir, "replay")
    result = {**counts, "db_mb": round((run_dir / "run.db").stat().st_size / 2**20, 1)}
    async with app.run_test(size=(160, 50)) as pilot:
        while "step" not in str(app.screen.query_one("#where").render()):
            await pilot.pause(0.01)
        result["replay_first_paint_s"] = round(time.perf_counter() - started, 3)
        await press_timed(pilot, "right_square_bracket", scroll, result, "replay_next_step")
        t = time.perf_counter()
        await pilot.press("g")
        await pilot.pause()
        result["groups_open_s"] = round(time.perf_counter() - t, 3)
        await press_timed(pilot, "right_square_bracket", scroll, result, "groups_next_step")
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--scroll", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.run_dir, args.scroll))))


if __name__ == "__main__":
    main()
