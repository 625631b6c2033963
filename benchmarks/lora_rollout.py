"""Per-role LoRA generation speed: the transformers engine with each policy's adapter merged into
its own weights (lora.MergedAdapters, what the engine does) vs peft's unmerged adapters (what it
did before) vs the plain model, side by side in one process, printed as one JSON line.

    .venv/bin/python benchmarks/lora_rollout.py [tasks/plan_path_learns_per_role_lora.yaml]
        [--problems 8] [--repeats 2] [--threads 0]

On the task's real first observations of each role (its system prompt, its K, its sampling), the
adapters of the task file with random non-zero B (a trained adapter costs what a fresh one costs,
but a zero B would make the check below trivial). Each engine generates a tool turn and a planner
turn (the per-role switch a step makes); the first call is a warm-up. Reports completion tokens
per second of each and the ratios, and checks that merged and unmerged sample the same tokens
(greedy, float32) on the first prompt. Run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from rollout_speed import first_observations

from mas_lab.actors.placement import set_threads
from mas_lab.config import Sampling, load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.modeling import lora
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine


def random_adapters(task, model_dir: str) -> dict[str, dict[str, torch.Tensor]]:
    """peft adapter states of the task's LoRA policies with B ~ N(0, 0.02)."""
    from transformers import AutoModelForCausalLM

    specs = {name: p.lora for name, p in task.policies.items() if p.lora}
    model = lora.attach(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), specs)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    return {name: lora.adapter_state(model, name) for name in specs}


def engine(model_dir: str, dtype: str, task, mode: str, states, threads: int = 0) -> HFEngine:
    specs = {name: p.lora for name, p in task.policies.items() if p.lora}
    if mode == "plain":
        return HFEngine(model_dir, dtype=dtype, threads=threads)
    out = HFEngine(model_dir, dtype=dtype, threads=threads, adapters=specs)
    if mode == "peft":  # the engine before: peft's model, adapters applied at every decoded token
        out.model, out.merged = lora.attach(out.model, specs), None
        out.model.eval()
    for name, state in states.items():
        out.load_weights(state, name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task", nargs="?", default="tasks/plan_path_learns_per_role_lora.yaml")
    parser.add_argument("--problems", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    task = load_task(args.task)
    set_threads(args.threads)
    pool = ProblemPool(ENVS[task.env.name], task.env.params, task.train.seed, eval_size=1)
    model_dir = resolve(next(iter(task.policies.values())).model)
    dtype = next(iter(task.policies.values())).dtype
    states = random_adapters(task, model_dir)
    turns = [(role.policy, first_observations(pool, role, args.problems), role.sampling) for role in task.roles]
    out = {
        "task": args.task,
        "problems": args.problems,
        "k": task.algorithm.k,
        "dtype": dtype,
        "threads": torch.get_num_threads(),
    }
    for mode in ("plain", "peft", "merged"):
        e = engine(model_dir, dtype, task, mode, states, args.threads)
        policy = lambda p: p if mode != "plain" else "shared"  # noqa: E731
        for policy_name, prompts, sampling in turns:  # warm-up
            e.generate(policy(policy_name), prompts[:1], 1, sampling, seed=0)
        times, tokens = [], 0
        for repeat in range(args.repeats):
            started = time.perf_counter()
            for policy_name, prompts, sampling in turns:
                rows = e.generate(policy(policy_name), prompts, task.algorithm.k, sampling, seed=repeat)
                tokens += sum(len(g.response_ids) for row in rows for g in row)
            times.append(time.perf_counter() - started)
        out[f"{mode}_s"] = round(statistics.median(times), 2)
        out[f"{mode}_tokens_per_s"] = round(tokens / sum(times), 1)
        print(
            f"[lora_rollout] {mode}: {out[f'{mode}_s']} s, {out[f'{mode}_tokens_per_s']} tokens/s",
            file=sys.stderr,
            flush=True,
        )
        del e
    out["merged_vs_peft"] = round(out["merged_tokens_per_s"] / out["peft_tokens_per_s"], 2)
    out["merged_vs_plain"] = round(out["merged_tokens_per_s"] / out["plain_tokens_per_s"], 2)
    greedy = Sampling(temperature=0.0, max_new_tokens=24)
    policy_name, prompts, _ = turns[0]
    same = [
        engine(model_dir, "float32", task, mode, states, args.threads)
        .generate(policy_name, prompts[:1], 1, greedy, seed=0)[0][0]
        .response_ids
        for mode in ("peft", "merged")
    ]
    out["greedy_same_tokens_fp32"] = same[0] == same[1]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
