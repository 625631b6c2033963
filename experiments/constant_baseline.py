"""How many held-out problems does the best constant answer solve? The bar a trained team must
clear to count as solving the task (mas_lab/training/baselines.py; `mas-lab run` and `mas-lab eval` report
it too).

    .venv/bin/python experiments/constant_baseline.py [TASK.yaml] [--seeds 0 1 2] [--problems N]

Prints one JSON line per seed: the best fixed answer of the task's environment, the problems it
solves, and the 95% Wilson interval.
"""

import argparse
import json
import time

from mas_lab.analysis.reporting import wilson_interval
from mas_lab.config import load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.training.baselines import task_baseline

parser = argparse.ArgumentParser()
parser.add_argument("task", nargs="?", default="tasks/plan_path_learns.yaml")
parser.add_argument("--seeds", type=int, nargs="+", default=None)
parser.add_argument("--problems", type=int, default=None)
args = parser.parse_args()
task = load_task(args.task)
env_cls = ENVS[task.env.name]
params = env_cls.Params.coerce(task.env.params)
for seed in args.seeds or [task.train.seed]:
    pool = ProblemPool(env_cls, params, seed, args.problems or task.train.eval_problems)
    started = time.perf_counter()
    best = task_baseline(task, pool.eval_set)
    out = {
        "task": task.name,
        "seed": seed,
        "eval_problems": len(pool.eval_set),
        "answers_tried": len(env_cls.constant_answers(params)),
        "seconds": round(time.perf_counter() - started, 2),
    }
    if best is not None:
        out |= {
            "best_answer": best.answer,
            "solved": best.solved,
            "success": best.success,
            "ci": [round(x, 3) for x in wilson_interval(best.solved, best.problems)],
        }
    print(json.dumps(out))
