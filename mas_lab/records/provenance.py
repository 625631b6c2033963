"""Which code made a run: a fingerprint of the mas_lab package's files, recorded in every run's
store and summary, so that two runs of the same resolved task can be told apart when the code
that trained them differs (a study's `reuse:` refuses a kept run made by other code: the same task
file trained by changed code is not the same run)."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SKIPPED = ("__pycache__",)


def fingerprint(root: Path) -> str:
    """sha256 over every file under `root` (relative path and bytes, in path order), compiled
    caches aside; the first 16 hex digits."""
    digest = hashlib.sha256()
    files = sorted(p for p in root.rglob("*") if p.is_file() and not any(part in SKIPPED for part in p.parts))
    for path in files:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@lru_cache(maxsize=1)
def code_version() -> str:
    """The fingerprint of the mas_lab package this process imported, taken once: a file edited
    while a run goes on does not change what the run records."""
    return fingerprint(PACKAGE)
