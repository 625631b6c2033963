"""How many held-out Plan-Path problems does one constant answer solve? The baseline a trained
team must beat (docs/results.md: the trained SmolLM2 teams collapsed onto a constant answer).

    .venv/bin/python benchmarks/constant_baseline.py [tasks/plan_path_learns.yaml]

Plays every held-out problem of the task's seed with the tool agent sending an empty code block
and the planner sending the same move string on every turn; prints JSON: what the trained teams'
answer ("Moves: R D ...") solves, and the best constant answer of one or two moves.
"""
import itertools
import json
import sys

from mas_lab.config import load_task
from mas_lab.envs import ENVS, ProblemPool

task = load_task(sys.argv[1] if len(sys.argv) > 1 else "tasks/plan_path_learns.yaml")
pool = ProblemPool(ENVS[task.env.name], task.env.params, task.train.seed, task.train.eval_problems)
def solved(answer: str) -> int:
    n = 0
    for p in pool.eval_set:
        env = pool.make(p)
        for turn in range(task.env.max_turns):
            env.step("tool", turn, "```\n```")
            env.step("planner", turn, answer)
            if env.done:
                break
        n += bool(env.success)
    return n
out = {"Moves: R D ...": solved("Moves: R D ...")}
best = max((" ".join(m) for k in (1, 2) for m in itertools.product("UDLR", repeat=k)), key=lambda a: solved("Moves: " + a))
out[f"best constant of 1-2 moves: Moves: {best}"] = solved("Moves: " + best)
print(json.dumps({"task": task.name, "seed": task.train.seed, "eval_problems": len(pool.eval_set), "solved": out}))
