"""Step-time benchmark: run N training steps of a task and print the split as JSON.

    .venv/bin/python benchmarks/step_time.py tasks/toy.yaml --steps 5 [--no-ray] [--set k=v ...]

Prints per-step and mean seconds for rollout (generation), reward (env steps, sandbox), learner,
weight sync and other, plus generated tokens per second and the process's peak resident memory
(with --no-ray, the engine's and learner's too). Step 1 is reported but left out of the
means (it includes one-off warm-up).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

from mas_lab.actors.backend import Backend
from mas_lab.config import load_task
from mas_lab.records.store import RunStore
from mas_lab.training.metric_names import TIME_KEYS
from mas_lab.training.trainer import Trainer

KEYS = (*TIME_KEYS, "time/step", "tokens_generated", "tokens_per_s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    task = load_task(args.task, args.set)
    started = time.perf_counter()
    backend = Backend(task, use_ray=not args.no_ray)
    startup = time.perf_counter() - started
    store = RunStore(Path(tempfile.mkdtemp(prefix="mas-lab-bench-")) / "run.db")
    trainer = Trainer(task, backend, store)
    steps = []
    for step in range(1, args.steps + 1):
        metrics = trainer.train_step(step).metrics
        steps.append({k: round(metrics[k], 4) for k in KEYS})
    backend.shutdown()
    measured = steps[1:] or steps
    print(
        json.dumps(
            {
                "task": args.task,
                "overrides": args.set,
                "ray": not args.no_ray,
                "startup_s": round(startup, 2),
                "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                "steps": steps,
                "mean_excluding_first": {k: round(statistics.fmean(s[k] for s in measured), 4) for k in KEYS},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
