"""Two parts of our sampling loop, each against the loop without it, side by side in one process,
printed as JSON: the shared prefix (one role's system prompt and preamble computed once per call
or learner micro-batch) and the reserved key/value cache (new keys and values written in place
instead of torch.cat onto the whole cache at every token).

    .venv/bin/python benchmarks/sampling_loop.py tasks/plan_path_learns.yaml [--problems 8] [--k 4]
        [--dtype auto] [--repeats 2] [--threads 0] [--greedy-problems 64]

Per role: its first observation of E training problems, K candidates each at the role's sampling
settings (one call, as a training step's turn 0); one learner update on those candidates (the
task's micro-batch, advantages +-1); one greedy call on `--greedy-problems` problems (an
evaluation's turn 0). Variants: `ours` (both), `no_reserved_cache` (transformers' DynamicCache),
`no_shared_prefix` (every prompt whole); the learner has no reserved cache, so it compares two.
Each call is timed per variant in turn, `--repeats` times after one warm-up of each (median).
Reports seconds, each variant's time over ours (> 1: ours is faster), the prompt and prefix
lengths, and how many sampled candidates came out token for token as ours (float32 rounding
differs between the ways by ~1e-5 in a log-prob, so a rare draw near a boundary of the inverse
CDF goes the other way, and that candidate its own way after it). Run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from mas_lab.config import Sampling, load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling import precision, prefill
from mas_lab.modeling.models import resolve
from mas_lab.rollout import decode
from mas_lab.rollout.engine import HFEngine
from mas_lab.training.episodes import with_system

SHARED = prefill.MIN_SHARED_PREFIX
VARIANTS = {"ours": (SHARED, True), "no_reserved_cache": (SHARED, False), "no_shared_prefix": (10**9, True)}


def side_by_side(fn, names: list[str], repeats: int) -> tuple[dict, dict]:
    """fn under each variant in turn; one warm-up of each first; medians and ratios to ours."""
    times: dict[str, list[float]] = {name: [] for name in names}
    outs: dict[str, object] = {}
    for round_ in range(repeats + 1):
        for name in names:
            prefill.MIN_SHARED_PREFIX, decode.RESERVED_CACHE = VARIANTS[name]
            started = time.perf_counter()
            outs[name] = fn()
            if round_:
                times[name].append(time.perf_counter() - started)
    prefill.MIN_SHARED_PREFIX, decode.RESERVED_CACHE = VARIANTS["ours"]
    median = {name: statistics.median(t) for name, t in times.items()}
    report = {f"{name}_s": round(median[name], 2) for name in names}
    report.update({f"{name}_over_ours": round(median[name] / median["ours"], 3) for name in names if name != "ours"})
    return report, outs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task")
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--greedy-problems", type=int, default=64)
    args = parser.parse_args()
    task = load_task(args.task)
    k = args.k or task.algorithm.k
    pool = ProblemPool(ENVS[task.env.name], task.env.params, 0, 0)
    folder = resolve(task.policies[task.roles[0].policy].model)
    engine = HFEngine(folder, dtype=args.dtype, threads=args.threads)
    learner = Learner(folder, task.algorithm.model_copy(update={"lr": 1e-7}), dtype=args.dtype, threads=args.threads)
    out = {
        "task": args.task,
        "dtype": precision.resolve(args.dtype, "cpu"),
        "problems": args.problems,
        "k": k,
        "micro_batch": task.algorithm.micro_batch,
        "greedy_problems": args.greedy_problems,
        "roles": {},
    }
    every = list(VARIANTS)
    for role in task.roles:
        prompts = [
            with_system(pool.make(pool.train(i)).messages(role.name, 0), role.system_prompt)
            for i in range(max(args.problems, args.greedy_problems))
        ]
        encoded = [tuple(engine.encode(p)) for p in prompts[: args.problems]]
        row: dict = {
            "prompt_tokens": round(statistics.fmean(map(len, encoded)), 1),
            "shared_prefix": prefill.shared_prefix(encoded),
        }
        row["sample"], outs = side_by_side(
            lambda: engine.generate(role.name, prompts[: args.problems], k, role.sampling, seed=1), every, args.repeats
        )
        ours = [g for r in outs["ours"] for g in r]
        row["sample"]["tokens"] = sum(len(g.response_ids) for g in ours)
        row["identical_candidates"] = {
            name: f"{sum(a.response_ids == b.response_ids for a, b in zip(ours, theirs))}/{len(ours)}"
            for name in every[1:]
            for theirs in [[g for r in outs[name] for g in r]]
        }
        samples = [
            Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, role.sampling.temperature)
            for i, g in enumerate(ours)
        ]
        row["update"], _ = side_by_side(
            lambda: learner.update({"shared": samples}), ["ours", "no_shared_prefix"], args.repeats
        )
        greedy = Sampling(temperature=0.0, max_new_tokens=role.sampling.max_new_tokens)
        row["greedy"], _ = side_by_side(
            lambda: engine.generate(role.name, prompts[: args.greedy_problems], 1, greedy, seed=0), every, 1
        )
        out["roles"][role.name] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
