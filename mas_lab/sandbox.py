"""Running model-written Python in a separate, limited process.

Every program runs:
- in a fresh temporary folder, in its own process group (the wall-clock limit kills the group);
- with the isolated interpreter flags (-I -S -B) and a minimal environment (no parent secrets);
- under rlimits on CPU time, address space, file size, open files and processes;
- in a new network namespace where the machine allows it (root, or unprivileged user
  namespaces): only a loopback that is down, so no socket reaches anything;
- as the unprivileged user `nobody` when mas-lab runs as root, with the system interpreter
  (a virtual environment under /root is not readable by `nobody`), so it cannot read or signal
  the trainer's processes or write outside world-writable folders.
What the machine allows is probed once (`capabilities()`); results carry a status: ok, error,
timeout, memory, killed. Output is capped.
"""
from __future__ import annotations

import ctypes
import os
import pwd
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SYSTEM_PYTHON = "/usr/bin/python3"


@dataclass
class SandboxResult:
    status: str  # ok | error | timeout | memory | killed
    stdout: str
    stderr: str
    duration: float
    returncode: int | None = None

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
    processes: int = 32
    output_chars: int = 8192


@dataclass(frozen=True)
class Isolation:
    network: bool  # a new network namespace
    user: str | None  # run as this user (None: as ourselves)
    interpreter: str


def _unshare(flags: int) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.unshare(flags) == 0


def _preexec(limits: Limits, isolation: Isolation):
    target = pwd.getpwnam(isolation.user) if isolation.user else None

    def apply() -> None:
        if isolation.network:
            if os.geteuid() == 0:
                _unshare(CLONE_NEWNET)
            else:
                _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        mb = 1024 * 1024
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if target is not None:
            os.setgroups([])
            os.setgid(target.pw_gid)
            os.setuid(target.pw_uid)

    return apply


def _classify(returncode: int, stderr: str) -> str:
    if returncode == 0:
        return "ok"
    if "MemoryError" in stderr:
        return "memory"
    if returncode < 0:
        return "memory" if returncode == -signal.SIGKILL and "Cannot allocate memory" in stderr else "killed"
    return "error"


def _run(code: str, limits: Limits, isolation: Isolation, stdin: str = "") -> SandboxResult:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mas-lab-sandbox-") as folder:
        path = os.path.join(folder, "main.py")
        with open(path, "w") as handle:
            handle.write(code)
        if isolation.user:
            user = pwd.getpwnam(isolation.user)
            for item in (folder, path):
                os.chown(item, user.pw_uid, user.pw_gid)
        env = {"PATH": "/usr/bin:/bin", "HOME": folder, "TMPDIR": folder, "LANG": "C.UTF-8"}
        proc = subprocess.Popen(
            [isolation.interpreter, "-I", "-S", "-B", path],
            cwd=folder, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, preexec_fn=_preexec(limits, isolation), close_fds=True,
        )
        out, err, timed_out = _communicate(proc, stdin.encode(), limits)
        _kill_group(proc)
    cap = limits.output_chars
    stderr = err.decode(errors="replace")
    status = "timeout" if timed_out else _classify(proc.returncode, stderr)
    return SandboxResult(status, out.decode(errors="replace")[:cap], stderr[-cap:], time.monotonic() - started,
                         proc.returncode)


def _communicate(proc: subprocess.Popen, data: bytes, limits: Limits) -> tuple[bytes, bytes, bool]:
    """Read both pipes with a cap (a flood of output cannot fill our memory) until exit or the wall limit."""
    cap = limits.output_chars * 4 + 1024
    chunks: dict[int, list[bytes]] = {1: [], 2: []}

    def drain(stream, key: int) -> None:
        size = 0
        for block in iter(lambda: stream.read(65536), b""):
            if size < cap:
                chunks[key].append(block[: cap - size])
                size += len(block)

    readers = [threading.Thread(target=drain, args=(proc.stdout, 1), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, 2), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        if data:
            proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    timed_out = False
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        proc.wait()
    _kill_group(proc)  # children that outlive the main program, holding the pipes open
    for reader in readers:
        reader.join(timeout=2.0)
    return b"".join(chunks[1]), b"".join(chunks[2]), timed_out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@lru_cache(maxsize=1)
def capabilities() -> Isolation:
    """The strongest isolation this machine grants, found by running a probe program under it."""
    probe = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=0.5)\nexcept OSError as e:\n    print(e.errno)\n"
    options = []
    root = os.geteuid() == 0
    system = SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable
    if root:
        options += [Isolation(True, "nobody", system), Isolation(False, "nobody", system)]
    options += [Isolation(True, None, sys.executable), Isolation(False, None, sys.executable)]
    for option in options:
        try:
            result = _run(probe, Limits(wall_s=10), option)
        except (OSError, subprocess.SubprocessError):
            continue
        if result.ok:
            return option
    return options[-1]


def run_python(code: str, limits: Limits = Limits(), stdin: str = "") -> SandboxResult:
    """Run `code` under the strongest available isolation; never raises for bad code."""
    return _run(code, limits, capabilities(), stdin)


class SandboxPool:
    """Concurrent sandbox runs with a bounded queue: `submit` waits while `queue` jobs are pending."""

    def __init__(self, workers: int | None = None, queue: int = 64):
        self.executor = ThreadPoolExecutor(max_workers=workers or max(2, os.cpu_count() or 2), thread_name_prefix="sandbox")
        self.slots = threading.BoundedSemaphore(queue)

    def submit(self, code: str, limits: Limits = Limits()) -> Future:
        self.slots.acquire()
        future = self.executor.submit(run_python, code, limits)
        future.add_done_callback(lambda _: self.slots.release())
        return future

    def map(self, codes: list[str], limits: Limits = Limits()) -> list[SandboxResult]:
        return [f.result() for f in [self.submit(code, limits) for code in codes]]


_POOL: SandboxPool | None = None


def run_many(codes: list[str], limits: Limits = Limits()) -> list[SandboxResult]:
    """Run several programs concurrently through the shared pool."""
    global _POOL
    if _POOL is None:
        _POOL = SandboxPool()
    return _POOL.map(codes, limits)
