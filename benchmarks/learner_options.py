"""One learner update under each candidate speed change, side by side in one process, in
interleaved rounds (A B C A B C ...: drift of the machine falls on every variant alike); prints JSON.

    .venv/bin/python benchmarks/learner_options.py [--task tasks/plan_path_learns.yaml] [--problems 4]
        [--k 4] [--dtype bfloat16] [--rounds 3] [--threads 0] [--variants base fused mb16 mb32 math eager compile_mlp]

Samples: the task's first-role observations of `--problems` training problems, K candidates each,
sampled once by our engine (the same samples for every variant), advantages +1/-1 alternating.
Variants (each a fresh Learner, seeded alike; `base` is the task's algorithm with micro-batch 8):

- `fused`: `algorithm.adamw: fused` (torch's one-kernel AdamW);
- `mbN`: `algorithm.micro_batch: N` (larger matmuls; the prompts of one micro-batch share their
  common prefix's forward, so fewer FLOPs too);
- `math`: attention through SDPA's math backend (matmuls and a softmax) instead of the CPU flash kernel;
- `eager`: transformers' eager attention;
- `compile_mlp`: each decoder layer's MLP through `torch.compile` (inductor, dynamic shapes):
  regional compilation of the elementwise-heavy block (the attention block holds the KV cache,
  which breaks graphs).

Each variant is measured beside the first (`base`) in its own pair, the two learners updated in
turn for `--rounds` rounds (two learners in memory at a time). Reported per pair and learner: the
mean and min seconds of the timed updates (the first update of each learner is a warm-up, compile
time included, reported as `first_s`), the counted GFLOP and the utilisation the learner stores
(modeling/flops.py against the cached matmul peak), the loss and pre-clip gradient norm of the first
update (equal up to float rounding across variants: the same update), and the speed-up against the
pair's base. Run on an idle machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch
from learner_speed import first_turn_samples
from torch.nn.attention import SDPBackend, sdpa_kernel

from mas_lab.config import load_task
from mas_lab.learner.learner import Learner
from mas_lab.modeling.models import resolve

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("base", "fused", "mb16", "mb32", "math", "eager", "compile_mlp")


def learner_for(variant: str, model_dir: str, algorithm, dtype: str, threads: int) -> tuple[Learner, object]:
    """A fresh learner set up as `variant` says, and the context its updates run in."""
    if variant == "fused":
        algorithm = algorithm.model_copy(update={"adamw": "fused"})
    elif variant.startswith("mb"):
        algorithm = algorithm.model_copy(update={"micro_batch": int(variant[2:])})
    elif variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}: one of {', '.join(VARIANTS)} or mbN")
    torch.manual_seed(0)
    learner = Learner(model_dir, algorithm, dtype=dtype, threads=threads)
    context = contextlib.nullcontext
    if variant == "math":
        context = lambda: sdpa_kernel(SDPBackend.MATH)  # noqa: E731
    elif variant == "eager":
        learner.model.set_attn_implementation("eager")
    elif variant == "compile_mlp":
        for layer in learner.model.get_decoder().layers:
            layer.mlp.compile(dynamic=True)
    return learner, context


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default=str(ROOT / "tasks" / "plan_path_learns.yaml"))
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=3, help="timed updates per variant, interleaved")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: as a run sets them)")
    args = parser.parse_args()

    task = load_task(args.task)
    role = task.roles[0]
    model_dir = resolve(task.policies[role.policy].model)
    samples = first_turn_samples(task, role, args.problems, args.k, args.dtype, args.threads)
    algorithm = task.algorithm.model_copy(update={"micro_batch": 8, "kl_probe": 0, "role_grad_norms": False})
    batch = {role.policy: samples}

    def measure(variants: list[str]) -> dict[str, dict]:
        """Build and warm up each variant (compile time lands in the first update), then time them
        in interleaved rounds."""
        learners, results = {}, {}
        for variant in variants:
            learner, context = learner_for(variant, model_dir, algorithm, args.dtype, args.threads)
            started = time.perf_counter()
            with context():
                first = learner.update(batch)[role.policy]
            learners[variant] = (learner, context)
            results[variant] = {
                "first_s": round(time.perf_counter() - started, 2),
                "loss": first["loss"],
                "grad_norm": round(first["grad_norm"], 6),
                "times": [],
            }
        for _ in range(args.rounds):
            for variant, (learner, context) in learners.items():
                started = time.perf_counter()
                with context():
                    out = learner.update(batch)[role.policy]
                results[variant]["times"].append(time.perf_counter() - started)
                results[variant]["gflop"] = round(out["learner_gflop"], 1)
                if "learner_util" in out:
                    results[variant].setdefault("utils", []).append(out["learner_util"])
        base = statistics.fmean(results[variants[0]]["times"])
        for r in results.values():
            times = r.pop("times")
            utils = r.pop("utils", None)
            r.update(
                {
                    "s": round(statistics.fmean(times), 3),
                    "min_s": round(min(times), 3),
                    **({"util": round(statistics.fmean(utils), 3)} if utils else {}),
                    "speedup": round(base / statistics.fmean(times), 3),
                }
            )
        return results

    # each variant beside its own base, two learners in memory at a time (a learner with its AdamW
    # state holds about 2.2 GB of SmolLM2-135M in float32: seven at once do not fit in 24 GiB)
    first, others = args.variants[0], args.variants[1:]
    results = {v: measure([first, v]) for v in others} if others else {first: measure([first])}
    print(
        json.dumps(
            {
                "task": task.name,
                "dtype": args.dtype,
                "threads": torch.get_num_threads(),
                "samples": len(samples),
                "completion_tokens": sum(len(s.response_ids) for s in samples),
                "prompt_tokens_mean": round(statistics.fmean(len(s.prompt_ids) for s in samples), 1),
                "rounds": args.rounds,
                "pairs": results,
            }
        )
    )


if __name__ == "__main__":
    main()
