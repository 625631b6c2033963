"""The control API of a running trainer: pause, resume, stop, status.

Requests are rows in the run store's `control` table, so the same call works in-process (the
dashboard) and from another process (`mas-lab pause RUN_DIR`), and a pause outlives the client
that asked for it. The trainer reads requests at its safe points: step boundaries, after a
step's rows are committed and before the next step samples. There, every actor is idle, the store
holds whole steps only, and a checkpoint captures the run exactly; mid-step, half-sampled trees
and unsent updates would exist only in memory.

The trainer publishes its state (pid, step, phase, paused, last checkpoint, heartbeat) in the
store's meta table under `state`. Whether a run is alive is not read from a pid (a reused pid made
a crashed run look alive): the process that runs it holds an exclusive lock on RUN_DIR/run.lock
for its whole life, and the kernel drops the lock when the process dies, however it dies.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

from mas_lab.records.store import RunStore

LOCK_FILE = "run.lock"
_held: dict[str, int] = {}  # run folders whose lock this process holds: path -> fd

COMMANDS = ("pause", "resume", "stop")


class ControlError(Exception):
    """A control request that cannot be served; the message says why."""


class RunControl:
    def __init__(self, store: RunStore):
        self.store = store

    # --- clients -------------------------------------------------------------------------------
    def request(self, command: str) -> None:
        """Queue a request; the store may be open read-only, so it goes through a writable one."""
        if command not in COMMANDS:
            raise ControlError(f"unknown command '{command}'; allowed: {list(COMMANDS)}")
        writer = RunStore(self.store.path)
        try:
            writer.add_control(command)
        finally:
            writer.close()

    def pause(self) -> None:
        self.request("pause")

    def resume(self) -> None:
        self.request("resume")

    def stop(self) -> None:
        self.request("stop")

    def status(self) -> dict:
        meta = self.store.meta()
        state = dict(meta.get("state") or {})
        state["status"] = meta.get("status", "unknown")
        state["error"] = meta.get("error")
        alive = lock_held(self.store.path.parent)
        state["running"] = alive and state["status"] == "running"
        if state["status"] in ("running", "starting") and not alive:
            state["status"] = "crashed"  # its process died without recording how it ended
        elif state["running"] and state.get("paused"):
            state["status"] = "paused"  # alive, held at a step boundary (`running` stays true: it can resume)
        if not state["running"]:  # the last heartbeat's word does not outlive the run: its actors went with it
            state["actors_alive"] = False
        state["pending"] = self.store.pending_controls()
        return state

    # --- the trainer ------------------------------------------------------------------------
    def take(self) -> list[str]:
        """Pending requests in order, marked as served."""
        return self.store.take_controls()

    def publish(self, **state) -> None:
        current = dict(self.store.meta().get("state") or {})
        current.update(state, pid=os.getpid(), host=socket.gethostname(), heartbeat=time.time())
        self.store.set_meta(state=current)


def acquire_lock(run_dir: Path) -> bool:
    """Take the run folder's exclusive lock for the life of this process; False when another
    process holds it."""
    key = str(Path(run_dir).resolve())
    if key in _held:
        return True
    fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    _held[key] = fd
    return True


def release_lock(run_dir: Path) -> None:
    fd = _held.pop(str(Path(run_dir).resolve()), None)
    if fd is not None:
        os.close(fd)


def lock_held(run_dir: Path) -> bool:
    """Whether a process (this one included) holds the run folder's lock: the run is alive."""
    if str(Path(run_dir).resolve()) in _held:
        return True
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
