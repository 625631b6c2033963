"""A measured sweep for the learning issue: does AT-GRPO lift an SmolLM2 team on Plan-Path?

    .venv/bin/python benchmarks/sweep.py --out sweeps/plan_path.jsonl [--only NAME ...]

Each setting is one real `mas-lab run` (its greedy evaluations before, during and after training
are in its store), then `mas-lab eval --checkpoint` of its final policy with S sampled
trajectories per held-out problem at the roles' own temperatures, against the same evaluation of
the untrained model (computed once per environment setting). One JSON line per setting is
appended to --out as soon as it is measured, so a sweep cut short keeps what it measured.
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

# Plan-Path 3x3, goal 1-2 moves away (the learning probe's setting), then variations.
BASE = ["env.params.size=3", "env.params.min_distance=1", "env.params.wall_prob=0.1", "algorithm.k=4",
        "train.problems_per_step=6", "train.steps=14", "train.eval_every=7", "train.eval_problems=32",
        "checkpoint.every=0", "checkpoint.keep_last=1"]
SETTINGS = {
    "probe lr 2e-5": ["algorithm.lr=2e-5"],
    "lr 5e-5": ["algorithm.lr=5e-5"],
    "lr 1e-5": ["algorithm.lr=1e-5"],
    "lr 5e-5 T=0.7": ["algorithm.lr=5e-5", "roles.0.sampling.temperature=0.7", "roles.1.sampling.temperature=0.7"],
    "lora r16 lr 2e-4": ["algorithm.lr=2e-4", "policies.shared.lora.rank=16", "policies.shared.lora.alpha=32"],
}


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


def sampled_eval(task: str, overrides: list[str], samples: int, problems: int, log: Path,
                 checkpoint: Path | None = None) -> dict:
    args = ["eval", task, "--samples", str(samples), "--problems", str(problems), *sets(overrides)]
    if checkpoint is not None:
        args += ["--checkpoint", str(checkpoint)]
    return mas_lab(*args, log=log)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=ROOT / "sweeps" / "plan_path.jsonl")
    parser.add_argument("--task", default="tasks/plan_path.yaml")
    parser.add_argument("--only", nargs="*")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--problems", type=int, default=32)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.out.with_suffix(".log")
    runs_dir = f"tracking.runs_dir={args.out.parent / 'runs'}"
    untrained: dict[str, dict] = {}
    for name, extra in SETTINGS.items():
        if args.only and name not in args.only:
            continue
        overrides = BASE + extra + [runs_dir]
        env_key = json.dumps([o for o in overrides if o.startswith(("env.", "roles."))])  # LoRA starts as the base
        started = time.time()
        if env_key not in untrained:
            untrained[env_key] = sampled_eval(args.task, overrides, args.samples, args.problems, log)
        summary = mas_lab("run", args.task, *sets(overrides), log=log)
        run_dir = ROOT / summary["run_dir"]
        final = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
        trained = sampled_eval(args.task, overrides, args.samples, args.problems, log, final)
        from mas_lab.store import RunStore

        metrics = RunStore(run_dir / "run.db", create=False).metrics()
        train = [m for m in metrics.values() if "time/step" in m]
        row = {
            "setting": name, "overrides": overrides, "run_dir": summary["run_dir"],
            "greedy_eval": {step: round(m["eval/success_rate"], 3) for step, m in metrics.items() if "eval/success_rate" in m},
            "sampled_before": {k: untrained[env_key][k] for k in ("success_rate", "success_ci_low", "success_ci_high")},
            "sampled_after": {k: trained[k] for k in ("success_rate", "success_ci_low", "success_ci_high")},
            "episodes": args.samples * args.problems,
            "train_success_first3": [round(m["success_rate"], 3) for m in train[:3]],
            "train_success_last3": [round(m["success_rate"], 3) for m in train[-3:]],
            "train_reward_first3": [round(m["reward/mean"], 3) for m in train[:3]],
            "train_reward_last3": [round(m["reward/mean"], 3) for m in train[-3:]],
            "mean_step_s": round(sum(m["time/step"] for m in train) / len(train), 1),
            "wall_s": round(time.time() - started),
        }
        with open(args.out, "a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
