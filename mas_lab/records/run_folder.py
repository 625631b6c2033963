"""One loader for every run folder: a live or finished run (`run.db`), and a run a study kept
(`run.db.xz` + task.yaml + summary.json, results/ and sample runs) alike. Every command that reads
a run (replay, tui, plot, status, export, runs, compare, the notebook API) finds its store here.

A kept run is unpacked once into the cache (keyed by the packed file's path, size and time), with
its task.yaml and summary.json beside it, and read from there; the kept folder is never written.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
from pathlib import Path

from mas_lab.modeling.models import cache_dir

PACKED = "run.db.xz"
STORE = "run.db"


class NotARunFolder(FileNotFoundError):
    """A path that is neither a run folder nor a kept run; the message says which it is not."""


def is_run_folder(path: Path) -> bool:
    return (path / STORE).is_file() or (path / PACKED).is_file()


def run_folder(path: Path) -> Path:
    """A folder with `run.db` for the run at `path`: `path` itself, or the unpacked copy of a kept
    run. Raises NotARunFolder (with what `path` is) otherwise, or for a kept store that does not
    unpack (truncated, not xz)."""
    path = Path(path)
    if (path / STORE).is_file():
        return path
    packed = path / PACKED
    if not packed.is_file():
        what = "no such folder" if not path.exists() else "not a folder" if not path.is_dir() else "no run.db"
        raise NotARunFolder(f"{path}: not a run folder ({what}, nor {PACKED})")

    stat = packed.stat()
    key = hashlib.sha256(f"{packed.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir() / "unpacked" / f"{path.name}-{key}"
    if not (target / STORE).is_file():
        target.mkdir(parents=True, exist_ok=True)
        partial = target / f"{STORE}.partial-{os.getpid()}"
        try:
            with lzma.open(packed) as source, open(partial, "wb") as plain:
                shutil.copyfileobj(source, plain)
        except (lzma.LZMAError, EOFError) as exc:
            partial.unlink(missing_ok=True)
            raise NotARunFolder(f"{packed}: damaged, it does not unpack ({exc})") from None
        for name in ("task.yaml", "summary.json"):
            if (path / name).is_file():
                shutil.copyfile(path / name, target / name)
        partial.replace(target / STORE)  # whole or absent: a reader never sees half a store
    return target
