"""Time the tools around a run on a large store, printed as JSON: `mas-lab runs`, `export` (JSON
lines and Parquet) and `plot`.

    .venv/bin/python benchmarks/tools_store.py RUN_DIR

Make a 100,000-candidate store first, e.g. `mas-lab run tasks/toy.yaml --no-ray --set
train.steps=200 --set train.problems_per_step=16` (102,432 candidates). Run on an idle machine.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from mas_lab.analysis.export import export_records
from mas_lab.analysis.plots import plot_run
from mas_lab.records.store import RunStore
from mas_lab.runs import list_runs


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, round(time.perf_counter() - started, 3)


def main() -> None:
    run_dir = Path(sys.argv[1])
    store = RunStore(run_dir / "run.db", create=False)
    candidates = store.rows("SELECT COUNT(*) AS n FROM candidates")[0]["n"]
    out = {
        "run_dir": str(run_dir),
        "candidates": candidates,
        "store_mb": round((run_dir / "run.db").stat().st_size / 2**20, 1),
    }
    rows, out["runs_s"] = timed(lambda: list_runs(run_dir.parent))
    out["runs_listed"] = len(rows)
    folder = Path(tempfile.mkdtemp(prefix="mas-lab-tools-"))
    for fmt in ("jsonl", "parquet"):
        target = folder / f"all.{fmt}"
        count, out[f"export_{fmt}_s"] = timed(lambda: export_records(run_dir, target, fmt))
        out[f"export_{fmt}_records"] = count
        out[f"export_{fmt}_mb"] = round(target.stat().st_size / 2**20, 1)
    charts, out["plot_s"] = timed(lambda: plot_run(run_dir, folder / "plots"))
    out["plots"] = len(charts)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
