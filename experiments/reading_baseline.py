"""How far does reading alone go? Answers copied from the move letters that a move game's
observation states in parentheses (Plan-Path: "G is 2 rows up (U U) and 1 column right (R) of
S."; Sokoban: the box's offset from you, then the target's from the box), played on the held-out
problems without a model. It bounds what a team that learned to read (not to plan) can reach, as
the constant-answer baseline (experiments/constant_baseline.py) bounds a team that reads nothing.

    .venv/bin/python experiments/reading_baseline.py [TASK.yaml] [--seeds 0 1 2]

Prints one JSON line per seed: problems solved by each fixed reading rule (sentence k's letters in
the stated order, or its two groups swapped), and by the best rule per problem ("any").
"""

import argparse
import json

from mas_lab.config import load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.training.baselines import reading_answers, solves


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", nargs="?", default="tasks/plan_path_learns.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    args = parser.parse_args()
    task = load_task(args.task)
    env_cls = ENVS[task.env.name]
    params = env_cls.Params.coerce(task.env.params)
    answerer = env_cls.answer_role or task.roles[-1].name
    for seed in args.seeds or [task.train.seed]:
        pool = ProblemPool(env_cls, params, seed, task.train.eval_problems)
        solved: dict[str, int] = {}
        any_rule = 0
        for problem in pool.eval_set:
            answers = reading_answers(env_cls(problem, params).observe(answerer, 0))
            hits = {rule for rule, answer in answers.items() if solves(env_cls, problem, params, answer, 1)}
            for rule in answers:
                solved[rule] = solved.get(rule, 0) + (rule in hits)
            any_rule += bool(hits)
        print(
            json.dumps(
                {"task": args.task, "seed": seed, "problems": len(pool.eval_set), "solved": solved, "any": any_rule}
            )
        )


if __name__ == "__main__":
    main()
