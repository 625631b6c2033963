"""How much of a learner update's token positions are padding, replayed from a run store; prints JSON.

    .venv/bin/python benchmarks/padding_share.py RUN.db [--micro-batch 8]

What packing sequences could save: the learner (mas_lab/learner/learner.py) runs each distinct
prompt once per micro-batch, left-padded to the longest prompt of its micro-batch, and every
response right-padded to the longest response of its micro-batch. This replays that layout over the
store's trained samples (the candidates of kept groups in training steps): per step and policy,
the samples grouped by prompt (the K candidates of one observation together), prompts in role
order (the learner sorts prompts by their tokens, so one role's prompts, which share a system
prompt, sit together; within a role the order here is the prompt hash's, an approximation),
micro-batches filled by the learner's own `pack_groups`. Prompt lengths are whole prompts: the common prefix
the learner runs once per micro-batch is not subtracted, so the prompt share is an upper bound of
the real prompt positions and the padding share a lower bound of its real share (by at most that
prefix). Counts positions, not FLOPs: a prompt position costs a forward and a backward through the
body like a response position; the output layer runs at response positions only.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from mas_lab.learner.learner import pack_groups
from mas_lab.records.store import RunStore


def replay(rows: list[tuple], micro_batch: int) -> dict[str, int]:
    """rows: (step, policy, role, prompt_hash, prompt_tokens, response_tokens) of trained samples."""
    by_update: dict[tuple, dict[tuple, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for step, policy, role, prompt, p_len, r_len in rows:
        by_update[(step, policy)][(role, prompt)].append((p_len, r_len))
    out = {"prompt_real": 0, "prompt_slots": 0, "response_real": 0, "response_slots": 0, "updates": len(by_update)}
    for prompts in by_update.values():
        chunks = pack_groups([[(key, s) for s in prompts[key]] for key in sorted(prompts)], micro_batch)
        for chunk in chunks:
            distinct = {key: p_len for key, (p_len, _) in chunk}
            out["prompt_real"] += sum(distinct.values())
            out["prompt_slots"] += max(distinct.values()) * len(distinct)
            out["response_real"] += sum(r for _, (_, r) in chunk)
            out["response_slots"] += max(r for _, (_, r) in chunk) * len(chunk)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("--micro-batch", type=int, default=8)
    args = parser.parse_args()
    rows = RunStore(args.store, create=False).trained_lengths()
    counts = replay(rows, args.micro_batch)
    real = counts["prompt_real"] + counts["response_real"]
    slots = counts["prompt_slots"] + counts["response_slots"]
    print(
        json.dumps(
            {
                "store": args.store,
                "micro_batch": args.micro_batch,
                "trained_samples": len(rows),
                **counts,
                "response_padding_share": round(1 - counts["response_real"] / max(counts["response_slots"], 1), 4),
                "prompt_padding_share": round(1 - counts["prompt_real"] / max(counts["prompt_slots"], 1), 4),
                "padding_share_of_all_positions": round(1 - real / max(slots, 1), 4),
                "response_share_of_positions": round(counts["response_slots"] / max(slots, 1), 4),
            }
        )
    )


if __name__ == "__main__":
    main()
