"""Learner speed on one step's real samples: mas-lab's Learner.update vs a plain loop, side by
side in one process, printed as JSON.

    .venv/bin/python benchmarks/learner_speed.py tasks/plan_path.yaml [--problems 4] [--k 4]
        [--dtype bfloat16] [--repeats 3] [--micro-batch 4] [--logp-chunk 256] [--profile]

Samples: E problems' first tool observations, K candidates each from the task's sampling (the
same for both). The plain loop is what a first implementation does: each micro-batch of samples
as right-padded prompt + response rows through the whole model, log-softmax over every position,
the clipped loss, backward, AdamW step. Ours shares each prompt's forward among its K candidates
and runs the output layer at response positions only. Reports seconds per update and per 1k
completion tokens, and the ratio; --logp-chunk N times ours again with the output layer's
log-probabilities in chunks of N tokens (mas_lab/learner/logprobs.py), --profile lists the operators
one update of ours spends its CPU time in (torch.profiler, self time shares). The first update of each
is a warm-up. Run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mas_lab.actors.placement import set_threads
from mas_lab.algo.loss import clipped_policy_loss
from mas_lab.config import load_task
from mas_lab.envs import ENVS, ProblemPool
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine
from mas_lab.training.episodes import with_system


def plain_update(model, optimizer, samples: list[Sample], micro_batch: int, autocast: bool) -> None:
    optimizer.zero_grad(set_to_none=True)
    tokens = sum(len(s.response_ids) for s in samples)
    for i in range(0, len(samples), micro_batch):
        chunk = samples[i : i + micro_batch]
        seqs = [s.prompt_ids + s.response_ids for s in chunk]
        width = max(map(len, seqs))
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        attention = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width - 1)
        for row, (s, seq) in enumerate(zip(chunk, seqs)):
            ids[row, : len(seq)] = torch.tensor(seq)
            attention[row, : len(seq)] = 1
            mask[row, len(s.prompt_ids) - 1 : len(seq) - 1] = 1
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
        logp = torch.log_softmax(logits / chunk[0].temperature, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        advantages = torch.tensor([s.advantage for s in chunk])
        loss, _ = clipped_policy_loss(logp, logp.detach(), advantages, mask, normalizer=float(tokens))
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def first_turn_samples(task, role, problems: int, k: int, dtype: str, threads: int) -> list[Sample]:
    """The role's first observations of `problems` training problems, K candidates each sampled
    once by our engine (seed 0), as learner samples with advantages +1/-1 alternating. Sets the
    torch threads (`threads`, 0: as a run sets them) for what follows."""
    pool = ProblemPool(ENVS[task.env.name], task.env.params, task.train.seed, eval_size=1)
    set_threads(threads)
    engine = HFEngine(resolve(task.policies[role.policy].model), dtype=dtype, threads=threads)
    messages = [
        with_system(pool.make(pool.train(i)).messages(role.name, 0), role.system_prompt) for i in range(problems)
    ]
    rows = engine.generate(role.policy, messages, k, role.sampling, seed=0)
    return [
        Sample(g.prompt_ids, g.response_ids, 1.0 if c % 2 else -1.0, role.sampling.temperature or 1.0)
        for row in rows
        for c, g in enumerate(row)
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("task")
    parser.add_argument("--problems", type=int, default=4)
    parser.add_argument("--k", type=int, default=None)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--logp-chunk", type=int, default=0, help="also time ours with algorithm.logp_chunk=N")
    parser.add_argument("--profile", action="store_true", help="where one update of ours spends its CPU time")
    args = parser.parse_args()

    task = load_task(args.task)
    role = task.roles[0]
    k = args.k or task.algorithm.k
    algorithm = task.algorithm.model_copy(
        update={"micro_batch": args.micro_batch or task.algorithm.micro_batch, "kl_probe": 0}
    )
    model_dir = resolve(task.policies[role.policy].model)
    samples = first_turn_samples(task, role, args.problems, k, args.dtype, args.threads)
    tokens = sum(len(s.response_ids) for s in samples)

    def timed_updates(algo) -> tuple[list[float], Learner]:
        torch.manual_seed(0)
        learner = Learner(model_dir, algo, dtype=args.dtype, threads=args.threads)
        times = []
        for repeat in range(args.repeats + 1):
            started = time.perf_counter()
            learner.update({role.policy: samples})
            if repeat:
                times.append(time.perf_counter() - started)
        return times, learner

    ours, learner = timed_updates(algorithm)
    extra: dict = {}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            learner.update({role.policy: samples})
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:15]
        extra["profile_self_cpu_share"] = {e.key: round(e.self_cpu_time_total / total, 3) for e in top}
    del learner
    if args.logp_chunk:
        chunked, learner = timed_updates(algorithm.model_copy(update={"logp_chunk": args.logp_chunk}))
        del learner
        extra["logp_chunk"] = args.logp_chunk
        extra["ours_chunked_s"] = round(statistics.fmean(chunked), 2)
        extra["chunked_vs_dense"] = round(statistics.fmean(ours) / statistics.fmean(chunked), 3)

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=algorithm.lr, weight_decay=algorithm.weight_decay)
    plain = []
    for repeat in range(args.repeats + 1):
        started = time.perf_counter()
        plain_update(model, optimizer, samples, algorithm.micro_batch, args.dtype == "bfloat16")
        if repeat:
            plain.append(time.perf_counter() - started)
    ours_s, plain_s = statistics.fmean(ours), statistics.fmean(plain)
    print(
        json.dumps(
            {
                "task": task.name,
                "dtype": args.dtype,
                "samples": len(samples),
                "completion_tokens": tokens,
                "prompt_tokens_mean": round(statistics.fmean(len(s.prompt_ids) for s in samples), 1),
                "micro_batch": algorithm.micro_batch,
                "threads": torch.get_num_threads(),
                "ours_s": round(ours_s, 2),
                "plain_s": round(plain_s, 2),
                "ours_s_per_1k_tokens": round(1000 * ours_s / tokens, 2),
                "plain_s_per_1k_tokens": round(1000 * plain_s / tokens, 2),
                "speedup": round(plain_s / ours_s, 2),
                **extra,
            }
        )
    )


if __name__ == "__main__":
    main()
