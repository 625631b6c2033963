"""float32 against bfloat16 on this machine, side by side in one process, printed as JSON: what
`dtype: auto` decides from (mas_lab/modeling/precision.py).

    .venv/bin/python benchmarks/precision.py [--model smollm2-135m-instruct] [--prompts 4]
        [--new-tokens 16] [--threads 0]

Three measurements in each dtype, each after one warm-up: a 1024 x 1024 matrix product
(GFLOP/s), the rollout engine sampling `--prompts` x 4 candidates of `--new-tokens` tokens from
a Plan-Path observation (tokens/s), and one learner update on those candidates (seconds; bf16
means autocast over float32 weights, as in training). Also the CPU's bf16 flags and what auto
resolves to. Run on an idle machine; bf16 without native support is slow, so keep it small.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from mas_lab.actors.placement import set_threads
from mas_lab.config import Algorithm, Sampling, load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling import precision
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def matmul_gflops(dtype: torch.dtype, size: int = 1024, repeats: int = 5) -> float:
    a = torch.randn(size, size).to(dtype)
    a @ a  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        a @ a
    return repeats * 2 * size**3 / (time.perf_counter() - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    args = parser.parse_args()
    set_threads(args.threads)
    task = load_task(os.path.join(ROOT, "tasks", "plan_path_learns.yaml"))
    pool = ProblemPool(ENVS[task.env.name], task.env.params, 0, 0)
    prompts = [pool.make(pool.train(i)).messages("tool", 0) for i in range(args.prompts)]
    sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=args.new_tokens)
    folder = resolve(args.model)
    out: dict = {
        "cpu_bf16_flags": sorted(precision.cpu_flags() & precision.NATIVE_CPU_FLAGS),
        "auto_resolves_to": precision.resolve("auto", "cpu"),
        "threads": torch.get_num_threads(),
        "model": args.model,
        "prompts": args.prompts,
        "k": 4,
        "new_tokens": args.new_tokens,
    }
    for dtype in ("float32", "bfloat16"):
        row: dict = {"matmul_gflops": round(matmul_gflops(getattr(torch, dtype)), 2)}
        engine = HFEngine(folder, dtype=dtype, threads=args.threads)
        engine.generate("shared", prompts[:1], 1, sampling, seed=0)  # warm-up
        started = time.perf_counter()
        rows = engine.generate("shared", prompts, 4, sampling, seed=1)
        seconds = time.perf_counter() - started
        tokens = sum(len(g.response_ids) for row_ in rows for g in row_)
        row.update(generate_s=round(seconds, 2), generated_tokens=tokens, tokens_per_s=round(tokens / seconds, 2))
        samples = [
            Sample(g.prompt_ids, g.response_ids, advantage=1.0 if i % 2 else -1.0)
            for row_ in rows
            for i, g in enumerate(row_)
        ]
        learner = Learner(folder, Algorithm(lr=1e-6, micro_batch=8), dtype=dtype, threads=args.threads)
        learner.update({"shared": samples[:4]})  # warm-up
        started = time.perf_counter()
        learner.update({"shared": samples})
        row["update_s"] = round(time.perf_counter() - started, 2)
        out[dtype] = row
        del engine, learner
    fp32, bf16 = out["float32"], out["bfloat16"]
    out["bf16_over_fp32"] = {
        "matmul": round(bf16["matmul_gflops"] / fp32["matmul_gflops"], 3),
        "generate": round(bf16["tokens_per_s"] / fp32["tokens_per_s"], 3),
        "update": round(fp32["update_s"] / bf16["update_s"], 3),
    }  # > 1: bf16 faster
    print(json.dumps(out))


if __name__ == "__main__":
    main()
