"""Checkpoints: everything an exact resume needs, written atomically.

A checkpoint is a folder runs/<run>/checkpoints/step-NNNNNN/ holding, per policy, the model
weights (safetensors), the optimizer state and the learner's torch RNG state, plus state.json
(step, problem cursor, MLflow run id, the task) and the driver's RNG states. It is assembled in a
hidden temporary folder; manifest.json (every file with its size and SHA-256) is written last and
the folder is renamed into place, so a folder named step-* is complete by construction and a
later truncation or corruption is caught by the manifest.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

PREFIX = "step-"


class CheckpointError(Exception):
    """A checkpoint that cannot be used; the message names it and says why."""


def folder(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Pending:
    """A checkpoint being assembled in its temporary folder (policies go to tmp/policies)."""

    run_dir: Path
    step: int
    tmp: Path
    final: Path
    started: float


def begin(run_dir: Path, step: int, state: dict, extra: dict[str, bytes] | None = None) -> Pending:
    """Start checkpoint `step`: its temporary folder with state.json, the driver's RNG states as
    they are now and any `extra` files (name -> bytes: the trainer's rollout made ahead under
    algorithm.overlap); the policies are written next, possibly in the background."""
    # listing checkpoints (a failed run's one line, under the memory limit that failed it) needs no numpy
    # lazy: numpy, only where RNG states are written
    import numpy as np

    started = time.perf_counter()
    root = folder(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / "state.json").write_text(json.dumps(state, indent=1))
    with open(tmp / "driver_rng.pkl", "wb") as handle:
        pickle.dump({"python": random.getstate(), "numpy": np.random.get_state()}, handle)
    for name, data in (extra or {}).items():
        (tmp / name).write_bytes(data)
    return Pending(Path(run_dir), step, tmp, final, started)


def finish(pending: Pending, keep_last: int) -> tuple[Path, float]:
    """Seal a checkpoint whose files are all written: manifest (sizes, SHA-256) last, fsync, rename
    into place, prune. Returns the final folder and the seconds since `begin`."""
    tmp, final, root = pending.tmp, pending.final, pending.final.parent
    files = sorted(p for p in tmp.rglob("*") if p.is_file())
    manifest = {str(p.relative_to(tmp)): {"size": p.stat().st_size, "sha256": _sha256(p)} for p in files}
    for p in files:
        _fsync(p)
    (tmp / "manifest.json").write_text(json.dumps({"step": pending.step, "files": manifest}, indent=1))
    _fsync(tmp / "manifest.json")
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync(root)
    prune(pending.run_dir, keep_last)
    return final, time.perf_counter() - pending.started


def save(
    run_dir: Path, step: int, state: dict, write_policies, keep_last: int, extra: dict[str, bytes] | None = None
) -> tuple[Path, float]:
    """Write checkpoint `step`; `write_policies(tmp)` saves every policy under tmp/policies/<name>.
    Returns the final folder and the seconds it took."""
    pending = begin(run_dir, step, state, extra)
    write_policies(pending.tmp / "policies")
    return finish(pending, keep_last)


def complete(run_dir: Path) -> list[Path]:
    """Checkpoint folders in step order (temporary folders are never listed)."""
    root = folder(run_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def prune(run_dir: Path, keep_last: int) -> None:
    for old in complete(run_dir)[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    for stale in folder(run_dir).glob(f".tmp-{PREFIX}*"):
        if not stale.name.endswith(f"-{os.getpid()}"):
            shutil.rmtree(stale, ignore_errors=True)


def verify(path: Path) -> dict:
    """Check every file against the manifest; return state.json's content or raise CheckpointError."""
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise CheckpointError(f"{path}: incomplete checkpoint (no manifest.json)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        raise CheckpointError(f"{path}: corrupt checkpoint (manifest.json is not valid JSON)") from None
    for name, expected in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"{path}: corrupt checkpoint ({name} is missing)")
        if file.stat().st_size != expected["size"]:
            raise CheckpointError(
                f"{path}: truncated checkpoint ({name} has {file.stat().st_size} bytes, expected {expected['size']})"
            )
        if _sha256(file) != expected["sha256"]:
            raise CheckpointError(f"{path}: corrupt checkpoint ({name} does not match its SHA-256)")
    return json.loads((path / "state.json").read_text())


def restore_driver_rng(path: Path) -> None:
    # lazy: numpy, only where RNG states are read
    import numpy as np

    with open(path / "driver_rng.pkl", "rb") as handle:
        states = pickle.load(handle)
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
