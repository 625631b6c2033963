"""How often does a policy state a legal answer, and how often a right one? Samples the answering
role's first reply on training problems and scores each on a fresh state (no tool output shown).

    .venv/bin/python experiments/format_probe.py [TASK.yaml] [--problems 32] [--k 4]
        [--temperatures 1.0 0.7] [--top-p 1.0 0.9] [--checkpoint CKPT_DIR/POLICY]

Prints one JSON line per temperature: the share of legal answers, of solved problems, and the
most common answers (a policy that answers every problem alike shows it here).
"""

import argparse
import collections
import json
import time

from mas_lab.config import Sampling, load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine
from mas_lab.training.episodes import with_system

parser = argparse.ArgumentParser()
parser.add_argument("task", nargs="?", default="tasks/plan_path_learns.yaml")
parser.add_argument("--problems", type=int, default=32)
parser.add_argument("--k", type=int, default=4)
parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
parser.add_argument("--top-p", type=float, nargs="+", default=None, help="one per temperature (default 1.0)")
parser.add_argument("--checkpoint", default=None, help="a policy folder of a checkpoint (default: the base model)")
args = parser.parse_args()

task = load_task(args.task)
env_cls = ENVS[task.env.name]
params = env_cls.Params.coerce(task.env.params)
pool = ProblemPool(env_cls, params, task.train.seed, 0)
problems = [pool.train(i) for i in range(args.problems)]
role = task.roles[-1]  # the answering role (planner, or the single agent's solver)
policy = task.policies[role.policy]
engine = HFEngine(args.checkpoint or resolve(policy.model), dtype=policy.dtype)
prompts = [with_system(env_cls(p, params).messages(role.name, 0), role.system_prompt) for p in problems]
for i, temperature in enumerate(args.temperatures):
    top_p = args.top_p[i] if args.top_p else 1.0
    started = time.perf_counter()
    rows = engine.generate(
        role.policy,
        prompts,
        args.k,
        Sampling(temperature=temperature, top_p=top_p, max_new_tokens=role.sampling.max_new_tokens),
        seed=1,
    )
    legal = solved = 0
    answers: collections.Counter = collections.Counter()
    for problem, row in zip(problems, rows):
        for g in row:
            env = env_cls(problem, params)
            result = env.step(role.name, 0, g.text)
            legal += result.components.get("format", 0.0) > 0
            solved += env.success
            answers[str(env.parse_answer(g.text))] += 1
    n = args.k * len(problems)
    print(
        json.dumps(
            {
                "task": task.name,
                "role": role.name,
                "temperature": temperature,
                "top_p": top_p,
                "replies": n,
                "legal": legal / n,
                "solved": solved / n,
                "top_answers": answers.most_common(5),
                "seconds": round(time.perf_counter() - started, 1),
            }
        ),
        flush=True,
    )
