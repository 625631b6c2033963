"""Checkpoint write and load time and size for a task's policies, printed as JSON.

    .venv/bin/python benchmarks/checkpoint_io.py tasks/plan_path.yaml tasks/plan_path_per_role_lora.yaml

Write = checkpoint.save (every policy's weights or adapter, optimizer state after one update so
AdamW has its moments, RNG states, manifest with SHA-256, fsync, rename). Load = checkpoint.verify
(re-hash every file) + loading every policy into the learners + weight sync to the engines.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mas_lab.actors.backend import Backend
from mas_lab.config import load_task
from mas_lab.learner.samples import Sample
from mas_lab.records import checkpoint


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(task_file: str) -> dict:
    task = load_task(task_file)
    backend = Backend(task, use_ray=False)
    prompt, response = list(range(10, 60)), list(range(60, 80))
    backend.update({name: [Sample(prompt, response, 1.0), Sample(prompt, response, -1.0)] for name in task.policies})
    run_dir = Path(tempfile.mkdtemp(prefix="mas-lab-ckpt-"))
    try:
        path, write_s = checkpoint.save(run_dir, 1, {"step": 1, "cursor": 0}, backend.save_policies, keep_last=1)
        started = time.perf_counter()
        checkpoint.verify(path)
        verify_s = time.perf_counter() - started
        started = time.perf_counter()
        backend.load_policies(path / "policies", 1)
        load_s = time.perf_counter() - started
        files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
        return {
            "task": task_file,
            "policies": {n: ("lora" if p.lora else "full") for n, p in task.policies.items()},
            "write_s": round(write_s, 2),
            "verify_s": round(verify_s, 2),
            "load_and_sync_s": round(load_s, 2),
            "size_mb": round(folder_size(path) / 2**20, 1),
            "files_mb": {k: round(v / 2**20, 2) for k, v in files.items()},
        }
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    for task_file in sys.argv[1:]:
        print(json.dumps(measure(task_file)), flush=True)
