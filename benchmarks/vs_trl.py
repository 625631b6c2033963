"""One GRPO step, side by side: mas-lab, a plain transformers + torch loop, and TRL's GRPOTrainer,
on the same prompts, model, K, max new tokens, lr, dtype and reward; prints JSON.

    make bench-peer                      # TRL in .venv-peer (never a dependency of mas-lab)
    .venv/bin/python benchmarks/vs_trl.py [--task tasks/plan_path_single_agent.yaml] [--problems 4]
        [--k 4] [--max-new-tokens 64] [--steps 3] [--dtype bfloat16] [--trl-micro-batches 16 4]

Prompts: the first observations of the task's training problems (Plan-Path by default), as chat
messages. Reward (the same function for all three, see `reward`): 1 for a reply that holds a
`Moves:` line of U/D/L/R letters, else 0, plus a length term, so groups have different rewards
and every sample is trained. Each system runs `--steps` + 1 steps; the first is a warm-up.
Reported per system: seconds per step and per 1,000 completion tokens (the tokens generated,
each up to its first stop token), then the ratios against mas-lab. Run on an idle machine.

- mas-lab: the calls the trainer makes (our engine's shared-prefill sampling loop, our learner's
  shared prompt forward, the weight sync), three ways: `mas_lab_ray`, through Ray actors as
  `mas-lab run` starts them (one machine: the learner and rollout worker in one actor,
  `resources.colocate: auto`); `mas_lab_ray_apart`, the two as separate actors, the weights
  through Ray's object store (`colocate: false`, the cross-node case); `mas_lab`, in one process
  (`Backend(use_ray=False)`). Each reports its weight sync's share of the step.
- plain: one `model.generate(num_return_sequences=K)`, one padded forward/backward over the
  whole batch in micro-batches, AdamW; the model generates with the weights it trains.
- TRL: `GRPOTrainer` (benchmarks/_trl_grpo.py, in .venv-peer) with its CPU settings: no vLLM,
  no gradient checkpointing, `bf16` as asked, beta 0 (no reference model), one iteration per
  generation batch (one generation of problems x K per optimizer step, reached by gradient
  accumulation over micro-batches); timed per optimizer step by a callback. A peer is measured at
  its best setting: TRL runs once per `--trl-micro-batches` size (default: the whole step, 8 and 4),
  `trl` reports the fastest and `trl_by_micro_batch` every one.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MOVES = re.compile(r"Moves:\s*[UDLR](?:[\s,]*[UDLR])*", re.IGNORECASE)


def reward(text: str) -> float:
    return (1.0 if MOVES.search(text) else 0.0) + min(len(text), 200) / 1000.0


def prompts_of(task_file: str, problems: int) -> tuple[list[list[dict[str, str]]], str]:
    from mas_lab.config import load_task
    from mas_lab.envs import ENVS, ProblemPool
    from mas_lab.modeling.models import resolve
    from mas_lab.training.episodes import with_system

    task = load_task(task_file)
    role = task.roles[0]
    pool = ProblemPool(ENVS[task.env.name], task.env.params, task.train.seed, eval_size=1)
    messages = [
        with_system(pool.make(pool.train(i)).messages(role.name, 0), role.system_prompt) for i in range(problems)
    ]
    return messages, resolve(task.policies[role.policy].model)


def run_mas_lab(task_file: str, messages, args, ray: bool = False, colocate: str = "auto") -> list[dict]:
    """mas-lab's step: in one process (`ray` False), or through Ray actors exactly as `mas-lab run`
    starts them (a local Ray instance; `colocate` auto: one actor per base, false: a rollout
    worker and a learner apart, the weights through the object store)."""
    from mas_lab.actors.backend import Backend, start_ray
    from mas_lab.config import Sampling, load_task
    from mas_lab.learner.samples import Sample

    overrides = [
        f"policies.shared.dtype={args.dtype}",
        f"algorithm.k={args.k}",
        f"algorithm.lr={args.lr}",
        "algorithm.filter=none",
        "algorithm.kl_probe=0",
        f"algorithm.micro_batch={args.micro_batch}",
        f"resources.colocate={colocate}",
    ]
    task = load_task(task_file, overrides)
    sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=args.max_new_tokens)
    if ray:
        res = task.resources
        start_ray(None, res.rollout_cpus * res.rollout_workers + res.learner_cpus)
    backend = Backend(task, use_ray=ray)
    steps = []
    for step in range(args.steps + 1):
        started = time.perf_counter()
        rows = backend.generate("shared", messages, args.k, sampling, seed=step)
        rollout_s = time.perf_counter() - started
        samples = []
        for row in rows:
            rewards = [reward(g.text) for g in row]
            mean = statistics.fmean(rewards)
            std = statistics.pstdev(rewards)
            samples += [
                Sample(g.prompt_ids, g.response_ids, (r - mean) / (std + 1e-6), 1.0, tuple(g.logprobs))
                for g, r in zip(row, rewards)
            ]
        update = backend.update({"shared": samples})["shared"]
        sync = backend.sync_weights(step + 1)  # its seconds, as the trainer records them
        flops = [g.flops for row in rows for g in row if g.flops is not None]
        steps.append(
            {
                "s": time.perf_counter() - started,
                "sync_s": sync,
                "tokens": sum(len(s.response_ids) for s in samples),
                # counted FLOPs (mas_lab/modeling/flops.py) and the measured peak (benchmarks/matmul_peak.py)
                "rollout_s": rollout_s,
                "rollout_gflop": sum(flops) / 1e9 if flops else None,
                "rollout_peak": next((g.peak_gflops for row in rows for g in row if g.peak_gflops), None),
                "learner_gflop": update.get("learner_gflop"),
                "learner_gflops_per_s": update.get("learner_gflops_per_s"),
                "learner_util": update.get("learner_util"),
            }
        )
    backend.shutdown()
    if ray:
        import ray as ray_module

        ray_module.shutdown()
    return steps


def run_plain(model_dir: str, messages, args) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mas_lab.actors.placement import set_threads
    from mas_lab.algo.loss import clipped_policy_loss
    from mas_lab.rollout.engine import stop_ids

    set_threads(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    stops = stop_ids(tokenizer, model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    autocast = args.dtype == "bfloat16"
    encoded = [
        tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        for m in messages
    ]
    steps = []
    for step in range(args.steps + 1):
        started = time.perf_counter()
        width = max(map(len, encoded))
        ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(e)) + list(e) for e in encoded])
        attention = (torch.arange(width) >= torch.tensor([width - len(e) for e in encoded]).unsqueeze(1)).long()
        model.eval()
        torch.manual_seed(step)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model.generate(
                input_ids=ids,
                attention_mask=attention,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=None,
                max_new_tokens=args.max_new_tokens,
                num_return_sequences=args.k,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=sorted(stops),
            )
        rows = []
        for r, seq in enumerate(out[:, width:].tolist()):
            cut = next((i + 1 for i, t in enumerate(seq) if t in stops), len(seq))
            rows.append((list(encoded[r // args.k]), seq[:cut]))
        rewards = [reward(tokenizer.decode(resp, skip_special_tokens=True)) for _, resp in rows]
        advantages = []
        for p in range(len(encoded)):
            group = rewards[p * args.k : (p + 1) * args.k]
            mean, std = statistics.fmean(group), statistics.pstdev(group)
            advantages += [(r - mean) / (std + 1e-6) for r in group]
        model.train()
        optimizer.zero_grad(set_to_none=True)
        tokens = sum(len(resp) for _, resp in rows)
        for i in range(0, len(rows), args.micro_batch):
            chunk = rows[i : i + args.micro_batch]
            seqs = [p + r for p, r in chunk]
            w = max(map(len, seqs))
            x = torch.zeros(len(chunk), w, dtype=torch.long)
            att = torch.zeros(len(chunk), w, dtype=torch.long)
            mask = torch.zeros(len(chunk), w - 1)
            for row, ((p, _response), seq) in enumerate(zip(chunk, seqs)):
                x[row, : len(seq)] = torch.tensor(seq)
                att[row, : len(seq)] = 1
                mask[row, len(p) - 1 : len(seq) - 1] = 1
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = model(input_ids=x, attention_mask=att).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)
            loss, _ = clipped_policy_loss(
                logp, logp.detach(), torch.tensor(advantages[i : i + len(chunk)]), mask, normalizer=float(tokens)
            )
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        steps.append({"s": time.perf_counter() - started, "tokens": tokens})
    return steps


def run_trl_sweep(model_dir: str, messages, args) -> tuple[list[dict] | str, dict]:
    """TRL at each micro-batch size: the fastest run's steps, and every size's summary."""
    sizes = args.trl_micro_batches or sorted({len(messages) * args.k, 8, 4}, reverse=True)
    runs = {size: run_trl(model_dir, messages, args, size) for size in sizes}
    table = {str(size): summary(steps) for size, steps in runs.items()}
    timed = {size: table[str(size)]["s_per_1k_tokens"] for size in sizes if "s_per_1k_tokens" in table[str(size)]}
    if not timed:
        return next(iter(runs.values())), table
    return runs[min(timed, key=lambda size: timed[size])], table


def run_trl(model_dir: str, messages, args, micro_batch: int | None = None) -> list[dict] | str:
    python = ROOT / ".venv-peer" / "bin" / "python"
    if not python.exists():
        return "TRL not installed: run `make bench-peer`"
    with tempfile.TemporaryDirectory(prefix="mas-lab-trl-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(
            json.dumps(
                {
                    "model": model_dir,
                    "messages": messages,
                    "k": args.k,
                    "lr": args.lr,
                    "max_new_tokens": args.max_new_tokens,
                    "steps": args.steps + 1,
                    "dtype": args.dtype,
                    "micro_batch": micro_batch,
                    "output": tmp,
                }
            )
        )
        proc = subprocess.run(
            [str(python), str(ROOT / "benchmarks" / "_trl_grpo.py"), str(spec)], capture_output=True, text=True
        )
        if proc.returncode:
            return "TRL failed: " + proc.stderr[-1500:]
        return json.loads(proc.stdout.strip().splitlines()[-1])["steps"]


def summary(steps) -> dict:
    if isinstance(steps, str):
        return {"error": steps}
    measured = steps[1:]
    seconds, tokens = sum(s["s"] for s in measured), sum(s["tokens"] for s in measured)
    syncs = [s["sync_s"] for s in measured if "sync_s" in s]
    return {
        "s_per_step": round(seconds / len(measured), 2),
        **({"weight_sync_share": round(sum(syncs) / seconds, 4)} if syncs else {}),
        **utilisation(measured),
        "completion_tokens_per_step": round(tokens / len(measured), 1),
        "s_per_1k_tokens": round(1000 * seconds / tokens, 2),
        "steps": [round(s["s"], 2) for s in steps],
    }


def utilisation(measured: list[dict]) -> dict:
    """mas-lab's rollout and learner: counted GFLOP/s and their share of the measured peak."""
    if not measured or measured[0].get("rollout_gflop") is None:
        return {}
    rollout = sum(s["rollout_gflop"] for s in measured) / sum(s["rollout_s"] for s in measured)
    learner = [s["learner_gflops_per_s"] for s in measured]
    out = {"rollout_gflops_per_s": round(rollout, 1), "learner_gflops_per_s": round(statistics.fmean(learner), 1)}
    if measured[0].get("rollout_peak"):
        out["rollout_util"] = round(rollout / measured[0]["rollout_peak"], 3)
    if measured[0].get("learner_util") is not None:
        out["learner_util"] = round(statistics.fmean(s["learner_util"] for s in measured), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default=str(ROOT / "tasks" / "plan_path_single_agent.yaml"))
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--trl-micro-batches",
        type=int,
        nargs="+",
        default=None,
        help="TRL's micro-batch sizes to try (the fastest counts)",
    )
    parser.add_argument("--only", nargs="+", default=["mas_lab_ray", "mas_lab", "mas_lab_ray_apart", "plain", "trl"])
    args = parser.parse_args()
    messages, model_dir = prompts_of(args.task, args.problems)
    out = {
        "task": args.task,
        "problems": args.problems,
        "k": args.k,
        "max_new_tokens": args.max_new_tokens,
        "dtype": args.dtype,
        "lr": args.lr,
        "measured_steps": args.steps,
    }
    runners = {
        "mas_lab": lambda: run_mas_lab(args.task, messages, args),
        "mas_lab_ray": lambda: run_mas_lab(args.task, messages, args, ray=True),
        "mas_lab_ray_apart": lambda: run_mas_lab(args.task, messages, args, ray=True, colocate="false"),
        "plain": lambda: run_plain(model_dir, messages, args),
    }
    for name in args.only:
        if name == "trl":
            steps, out["trl_by_micro_batch"] = run_trl_sweep(model_dir, messages, args)
            out[name] = summary(steps)
        else:
            out[name] = summary(runners[name]())
        print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)
    for ours in ("mas_lab_ray", "mas_lab"):  # the product's path first, then one process
        base = out.get(ours, {}).get("s_per_1k_tokens")
        if base:
            out[f"ratio_vs_{ours}"] = {
                name: round(out[name]["s_per_1k_tokens"] / base, 2)
                for name in args.only
                if name != ours and "s_per_1k_tokens" in out[name]
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
