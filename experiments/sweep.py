"""Measured sweeps for the learning issue: does AT-GRPO lift an SmolLM2 team on Plan-Path?

    .venv/bin/python experiments/sweep.py base  --out sweeps/base.jsonl  [--only NAME ...]
    .venv/bin/python experiments/sweep.py train --out sweeps/train.jsonl [--only NAME ...] [--train-set K=V ...]

`base`: the untrained team, S sampled trajectories per held-out problem at the roles' own
settings, for each setting (temperature, dtype, prompt): where is success small but non-zero?
`train`: one real `mas-lab run` per setting (its greedy evaluations are in its store), then the
same sampled evaluation of its final checkpoint against the untrained one. One JSON line per
setting is appended to --out as soon as it is measured, so a sweep cut short keeps its rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAS_LAB = str(Path(sys.executable).parent / "mas-lab")

# Plan-Path 3x3, goal 1-4 moves away (the learning probe's setting).
ENV = ["env.params.size=3", "env.params.min_distance=1", "env.params.wall_prob=0.1"]
EXAMPLE = (
    "You are the planner. Solve the task. End with one line 'Moves: R D ...' using U, D, L, R.\n"
    "Example: S is at row 0, col 0 and G is at row 1, col 1, no walls in the way. Last line:\nMoves: R D"
)
SETTINGS = {
    "T1.0 bf16": [],
    "T0.7 bf16": ["roles.0.sampling.temperature=0.7", "roles.1.sampling.temperature=0.7"],
    "T0.3 bf16": ["roles.0.sampling.temperature=0.3", "roles.1.sampling.temperature=0.3"],
    "T0.7 fp32": [
        "roles.0.sampling.temperature=0.7",
        "roles.1.sampling.temperature=0.7",
        "policies.shared.dtype=float32",
    ],
    "T0.7 bf16 example": [
        "roles.0.sampling.temperature=0.7",
        "roles.1.sampling.temperature=0.7",
        f"roles.1.system_prompt={json.dumps(EXAMPLE)}",
    ],
}
TRAIN = [
    "algorithm.k=4",
    "train.problems_per_step=6",
    "train.steps=10",
    "train.eval_every=5",
    "train.eval_problems=16",
    "checkpoint.every=0",
    "checkpoint.keep_last=1",
    "algorithm.lr=2e-5",
]


def mas_lab(*args: str, log: Path) -> dict:
    with open(log, "a") as handle:
        handle.write(f"\n$ mas-lab {' '.join(args)}\n")
        handle.flush()
        proc = subprocess.run([MAS_LAB, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=handle, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"mas-lab {args[0]} failed ({proc.returncode}); see {log}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def sampled_eval(task: str, overrides: list[str], args, log: Path, checkpoint: Path | None = None) -> dict:
    extra = ["--checkpoint", str(checkpoint)] if checkpoint is not None else []
    result = mas_lab(
        "eval",
        task,
        "--samples",
        str(args.samples),
        "--problems",
        str(args.problems),
        *extra,
        *sets(overrides),
        log=log,
    )
    return {k: result[k] for k in ("success_rate", "success_ci_low", "success_ci_high", "team_reward", "time")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("stage", choices=["base", "train"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--task", default="tasks/plan_path.yaml")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--train-set", nargs="*", default=[], help="overrides after the TRAIN defaults (key=value)")
    args = parser.parse_args()
    train_overrides = TRAIN + args.train_set
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.out.with_suffix(".log")
    runs_dir = f"tracking.runs_dir={args.out.parent / 'runs'}"
    for name, extra in SETTINGS.items():
        if args.only and name not in args.only:
            continue
        overrides = ENV + extra + [runs_dir]
        started = time.time()
        row = {"setting": name, "overrides": overrides, "episodes": args.samples * args.problems}
        row["untrained"] = sampled_eval(args.task, overrides, args, log)
        if args.stage == "train":
            summary = mas_lab("run", args.task, *sets(overrides + train_overrides), log=log)
            run_dir = ROOT / summary["run_dir"]
            final = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
            row["trained"] = sampled_eval(args.task, overrides, args, log, final)
            from mas_lab.records.store import RunStore

            metrics = RunStore(run_dir / "run.db", create=False).metrics()
            train = [m for m in metrics.values() if "time/step" in m]
            row.update(
                {
                    "train_overrides": train_overrides,
                    "run_dir": summary["run_dir"],
                    "greedy_eval": {
                        s: round(m["eval/success_rate"], 3) for s, m in metrics.items() if "eval/success_rate" in m
                    },
                    "train_success": [round(m["success_rate"], 3) for m in train],
                    "train_reward": [round(m["reward/mean"], 3) for m in train],
                    "mean_step_s": round(sum(m["time/step"] for m in train) / len(train), 1),
                }
            )
        row["wall_s"] = round(time.time() - started)
        with open(args.out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
