"""A run store of a million candidates, written the way a run writes it, with its write rate, as JSON.

    .venv/bin/python benchmarks/store_scale.py runs/million [--candidates 1000000]
    .venv/bin/python benchmarks/tui_store.py runs/million      # the dashboard on it
    .venv/bin/python benchmarks/tools_store.py runs/million    # runs, export, plot on it

The toy task (tasks/toy.yaml) with K 16 and 64 problems a step (2 roles x 2 turns: 4,096 candidates
a step) goes through the real Trainer.train_step: tree sampling, rewards, groups, advantages, the
step's metrics and `RunStore.write_step`, into RUN_DIR/run.db (with RUN_DIR/task.yaml, so the
folder opens in `mas-lab replay` and the dashboard). Only the model is left out: a scripted engine
answers (each candidate a different mix of letters, so rewards and groups vary) and the learner
does not learn, since what is measured is the store, not generation. Reports the candidates written
per second inside write_step (the transaction a run's step waits on), the file size, and the
whole build time. Run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from mas_lab.config import load_task, task_to_yaml
from mas_lab.records.store import RunStore
from mas_lab.rollout.engine import Generation
from mas_lab.training.trainer import Trainer

ROOT = Path(__file__).resolve().parent.parent


class ScriptedEngine:
    """Candidate c of row r answers a mix of 'a' and 'b' that varies with (c, r, call)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, policy, prompts, n, sampling, seed):
        self.calls += 1
        out = []
        for r, messages in enumerate(prompts):
            prompt_ids = [ord(ch) % 97 for ch in messages[-1]["content"][:48]]
            row = []
            for c in range(n):
                mix = (c * 7 + r * 3 + self.calls) % 9
                text = "a" * mix + "b" * (8 - mix) or "b"
                row.append(
                    Generation(
                        prompt_ids=prompt_ids,
                        response_ids=[ord(ch) for ch in text],
                        text=text,
                        logprobs=[-0.5] * len(text),
                    )
                )
            out.append(row)
        return out


class StillBackend:
    """A backend whose learner does not learn (the store is what is measured)."""

    def __init__(self) -> None:
        self.generate = ScriptedEngine()

    def update(self, samples):
        return {
            name: {"loss": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "samples": len(s), "tokens": 0}
            for name, s in samples.items()
        }

    def sync_weights(self, version):
        return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--candidates", type=int, default=1_000_000)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--problems", type=int, default=64)
    args = parser.parse_args()
    sets = [f"algorithm.k={args.k}", f"train.problems_per_step={args.problems}", "train.eval_every=0"]
    task = load_task(ROOT / "tasks" / "toy.yaml", sets)
    per_step = args.k * args.problems * len(task.roles) * task.env.max_turns
    steps = -(-args.candidates // per_step)
    args.run_dir.mkdir(parents=True, exist_ok=False)
    (args.run_dir / "task.yaml").write_text(task_to_yaml(task))
    store = RunStore(args.run_dir / "run.db")
    store.set_meta(run_id=args.run_dir.name, task=task.model_dump(mode="json"), benchmark="benchmarks/store_scale.py")
    write_s = 0.0
    original = store.write_step

    def timed_write(*a, **kw):
        nonlocal write_s
        started = time.perf_counter()
        original(*a, **kw)
        write_s += time.perf_counter() - started

    store.write_step = timed_write  # type: ignore[method-assign]
    trainer = Trainer(task, StillBackend(), store)  # type: ignore[arg-type]
    started = time.perf_counter()
    for step in range(1, steps + 1):
        trainer.train_step(step)
    build_s = time.perf_counter() - started
    store.set_meta(status="finished")
    store.finish()
    count = store.rows("SELECT COUNT(*) AS n FROM candidates")[0]["n"]
    print(
        json.dumps(
            {
                "run_dir": str(args.run_dir),
                "steps": steps,
                "candidates": count,
                "store_mb": round((args.run_dir / "run.db").stat().st_size / 2**20, 1),
                "write_step_s": round(write_s, 2),
                "candidates_per_s_written": round(count / write_s),
                "write_ms_per_step": round(1000 * write_s / steps, 1),
                "build_s": round(build_s, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
