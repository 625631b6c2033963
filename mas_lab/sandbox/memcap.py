"""A memory cgroup per sandboxed program, where the machine lets mas-lab make one.

RLIMIT_AS caps each process's address space, so a program that forks N processes may use N times
the limit, and the files it writes to its tmpfs (inodes included) are memory no rlimit counts. A
cgroup caps all of it together: every process of the program and the pages of its tmpfs. mas-lab
makes one folder per program under `mas-lab-sandbox/` of the memory controller (cgroup v1's
`memory/` hierarchy, or cgroup v2's root when it delegates the memory controller), sets its limit,
and the program's first process joins it before it execs bubblewrap (so everything it starts is
inside); afterwards the folder is removed. Where no cgroup can be made (no write access, no memory
controller), programs run with the rlimits alone and `available()` says why: the sandbox's
description names which one is in force.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")
GROUP = "mas-lab-sandbox"

_lock = threading.Lock()
_root: tuple[Path, int] | None | bool = False  # (parent folder, cgroup version); None: unavailable
_why = ""
_counter = 0


def available() -> tuple[Path, int] | None:
    """The parent folder of the per-program cgroups and the cgroup version, found once; None when
    this machine does not let mas-lab make memory cgroups (`reason()` says why)."""
    global _root, _why
    with _lock:
        if _root is not False:
            return _root  # type: ignore[return-value]
        found: tuple[Path, int] | None = None
        try:
            if (V1 / "memory.limit_in_bytes").is_file():
                parent = V1 / GROUP
                parent.mkdir(exist_ok=True)
                _sweep(parent)
                found = (parent, 1)
            elif "memory" in (V2 / "cgroup.controllers").read_text().split():
                if "memory" not in (V2 / "cgroup.subtree_control").read_text().split():
                    (V2 / "cgroup.subtree_control").write_text("+memory")
                parent = V2 / GROUP
                parent.mkdir(exist_ok=True)
                if "memory" not in (parent / "cgroup.subtree_control").read_text().split():
                    (parent / "cgroup.subtree_control").write_text("+memory")
                _sweep(parent)
                found = (parent, 2)
            else:
                _why = "no cgroup memory controller"
        except OSError as exc:
            _why = f"cannot make a memory cgroup ({exc.strerror or exc})"
            found = None
        _root = found
        return found


def reason() -> str:
    return _why


class MemoryCap:
    """One program's cgroup: made with its limit, joined by the program's first process
    (`join` runs in the child between fork and exec: no allocation, no import), removed after."""

    def __init__(self, limit_bytes: int):
        global _counter
        root = available()
        if root is None:
            raise OSError(_why)
        parent, self.version = root
        with _lock:
            _counter += 1
            name = f"{os.getpid()}-{threading.get_ident()}-{_counter}"
        self.path = parent / name
        self.path.mkdir()
        try:
            if self.version == 1:
                (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                swap = self.path / "memory.memsw.limit_in_bytes"
                if swap.exists():  # no escape into swap
                    swap.write_text(str(limit_bytes))
            else:
                (self.path / "memory.max").write_text(str(limit_bytes))
                swap = self.path / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")
        except OSError:
            self.path.rmdir()
            raise
        self._procs = str(self.path / "cgroup.procs").encode()

    @property
    def procs_file(self) -> str:
        """The file a process writes its pid to to join (the bwrap path's stage does: sandbox/stage.py)."""
        return self._procs.decode()

    def join(self) -> None:
        """In the child before exec: move this process into the cgroup. A refusal leaves the
        program under its rlimits (raising here would fail every program as a sandbox error)."""
        try:
            fd = os.open(self._procs, os.O_WRONLY)
        except OSError:
            return
        try:
            os.write(fd, str(os.getpid()).encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process of the program for the cgroup's limit."""
        try:
            if self.version == 1:
                return _oom_killed_v1(self.path)
            events = dict(line.split() for line in (self.path / "memory.events").read_text().splitlines())
            return int(events.get("oom_kill", "0")) > 0
        except (OSError, ValueError):
            return False

    def remove(self) -> None:
        """Remove the cgroup once its processes are gone: they were killed, but a PID namespace
        whose tmpfs holds many files takes seconds to tear down, so after a quick try a daemon
        thread keeps trying for a minute (a group left by a crashed process is swept by the next
        `available()` of any mas-lab process)."""
        if _try_rmdir(self.path, tries=20):
            return
        threading.Thread(target=_try_rmdir, args=(self.path, 6000), daemon=True).start()


def _try_rmdir(path: Path, tries: int) -> bool:
    for _ in range(tries):
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.01)
    return False


def _sweep(parent: Path) -> None:
    """Remove the groups of mas-lab processes that are gone (named <pid>-...)."""
    for child in parent.iterdir():
        pid = child.name.split("-", 1)[0]
        if child.is_dir() and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            _try_rmdir(child, tries=1)


def _oom_killed_v1(path: Path) -> bool:
    control = path / "memory.oom_control"
    if not control.is_file():
        return True
    fields = dict(line.split() for line in control.read_text().splitlines() if len(line.split()) == 2)
    return int(fields.get("oom_kill", "1")) > 0
