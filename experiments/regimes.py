"""Run the paper's comparison on Plan-Path with small budgets and print one JSON row per regime.

    .venv/bin/python experiments/regimes.py [--steps 3] [--problems 4] [--eval-problems 16] [--only NAME ...]

Each regime is a real `mas-lab run` (its step-0 evaluation is the untrained number, its final
evaluation the trained one). Peak memory is the largest sum of resident memory over the run's
process tree and Ray's actor processes, sampled every second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from mas_lab.training.metric_names import TIME_SPLIT

ROOT = Path(__file__).resolve().parents[1]
REGIMES = {
    "single_agent+grpo": "tasks/plan_path_single_agent.yaml",
    "mas+at_grpo shared": "tasks/plan_path.yaml",
    "mas+at_grpo per-role lora": "tasks/plan_path_per_role_lora.yaml",
    "mas+at_grpo per-role full": "tasks/plan_path_per_role_full.yaml",
    "mas+mas_grpo (trajectory)": "tasks/plan_path_mas_grpo.yaml",
}


def tree_rss(root: psutil.Process) -> int:
    procs = [root, *root.children(recursive=True)]
    procs += [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith("ray::")]
    total = 0
    for p in {p.pid: p for p in procs}.values():
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run(name: str, task: str, args) -> dict:
    cmd = [
        str(Path(sys.executable).parent / "mas-lab"),
        "run",
        task,
        "--set",
        f"train.steps={args.steps}",
        "--set",
        f"train.problems_per_step={args.problems}",
        "--set",
        f"train.eval_problems={args.eval_problems}",
        "--set",
        "train.eval_every=0",
        "--set",
        "checkpoint.every=0",
        "--set",
        f"tracking.runs_dir={args.runs_dir}",
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    root = psutil.Process(proc.pid)

    def sample() -> None:
        while proc.poll() is None:
            try:
                peak[0] = max(peak[0], tree_rss(root))
            except psutil.Error:
                pass
            time.sleep(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        return {"regime": name, "task": task, "error": err[-1500:]}
    summary = json.loads(out.strip().splitlines()[-1])
    sys.path.insert(0, str(ROOT))
    from mas_lab.records.store import RunStore

    metrics = RunStore(ROOT / summary["run_dir"] / "run.db").metrics()
    steps = [m for s, m in metrics.items() if "time/step" in m]
    final = metrics[max(metrics)]
    return {
        "regime": name,
        "task": task,
        "run_dir": summary["run_dir"],
        "eval_before": summary["eval_before"],
        "eval_after": summary["eval_after"],
        "eval_after_ci": [final.get("eval/success_ci_low"), final.get("eval/success_ci_high")],
        "team_reward_before": metrics[0].get("eval/team_reward"),
        "team_reward_after": final.get("eval/team_reward"),
        "train_reward_by_step": [round(m["reward/mean"], 4) for m in steps],
        "mean_step_s": round(statistics.fmean(m["time/step"] for m in steps), 2),
        "split_s": {k: round(statistics.fmean(m[f"time/{k}"] for m in steps), 2) for k in TIME_SPLIT},
        "tokens_per_s": round(statistics.fmean(m["tokens_per_s"] for m in steps), 1),
        "peak_rss_gb": round(peak[0] / 2**30, 2),
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--eval-problems", type=int, default=16)
    parser.add_argument("--runs-dir", default="runs/regimes")
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    for name, task in REGIMES.items():
        if args.only and name not in args.only:
            continue
        print(json.dumps(run(name, task, args)), flush=True)


if __name__ == "__main__":
    main()
