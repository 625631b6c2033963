"""Running model-written Python in a separate, limited process.

Each program runs in a fresh temporary folder, in its own process group, with the isolated
interpreter flags (-I -S), a minimal environment, and limits on CPU time, address space, file
size, open files and processes; the wall-clock limit kills the whole group. Output is capped.
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass


@dataclass
class SandboxResult:
    status: str  # ok | error | timeout | killed
    stdout: str
    stderr: str
    duration: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Limits:
    wall_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    file_mb: int = 8
    open_files: int = 64
    processes: int = 64
    output_chars: int = 8192


def _set_limits(limits: Limits):
    def apply() -> None:
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))

    return apply


def run_python(code: str, limits: Limits = Limits(), stdin: str = "") -> SandboxResult:
    """Run `code` with the isolated interpreter in a fresh folder; never raises for bad code."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mas-lab-sandbox-") as folder:
        path = os.path.join(folder, "main.py")
        with open(path, "w") as handle:
            handle.write(code)
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", path],
            cwd=folder,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_set_limits(limits),
        )
        try:
            out, err = proc.communicate(stdin.encode(), timeout=limits.wall_s)
            status = "ok" if proc.returncode == 0 else ("killed" if proc.returncode < 0 else "error")
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            status = "timeout"
        finally:
            _kill_group(proc)
    cap = limits.output_chars
    return SandboxResult(
        status=status,
        stdout=out.decode(errors="replace")[:cap],
        stderr=err.decode(errors="replace")[-cap:],
        duration=time.monotonic() - started,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2), thread_name_prefix="sandbox")


def run_many(codes: list[str], limits: Limits = Limits()) -> list[SandboxResult]:
    """Run several programs concurrently (a bounded thread pool of subprocesses)."""
    return list(_POOL.map(lambda code: run_python(code, limits), codes))
