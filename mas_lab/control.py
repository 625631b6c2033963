"""The control API of a running controller: pause, resume, stop, status.

Requests are rows in the run store's `control` table, so the same call works in-process (the
dashboard) and from another process (`mas-lab pause RUN_DIR`), and a pause outlives the client
that asked for it. The controller reads requests at its safe points: step boundaries, after a
step's rows are committed and before the next step samples. There, every actor is idle, the store
holds whole steps only, and a checkpoint captures the run exactly; mid-step, half-sampled trees
and unsent updates would exist only in memory.

The controller publishes its state (pid, step, phase, paused, last checkpoint, heartbeat) in the
store's meta table under `state`.
"""
from __future__ import annotations

import os
import socket
import time

from mas_lab.store import RunStore

COMMANDS = ("pause", "resume", "stop")


class ControlError(Exception):
    """A control request that cannot be served; the message says why."""


class RunControl:
    def __init__(self, store: RunStore):
        self.store = store

    # --- clients -------------------------------------------------------------------------------
    def request(self, command: str) -> None:
        if command not in COMMANDS:
            raise ControlError(f"unknown command '{command}'; allowed: {list(COMMANDS)}")
        self.store.add_control(command)

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
        state["running"] = is_alive(state) and state["status"] == "running"
        state["pending"] = self.store.pending_controls()
        return state

    # --- the controller ------------------------------------------------------------------------
    def take(self) -> list[str]:
        """Pending requests in order, marked as served."""
        return self.store.take_controls()

    def publish(self, **state) -> None:
        current = dict(self.store.meta().get("state") or {})
        current.update(state, pid=os.getpid(), host=socket.gethostname(), heartbeat=time.time())
        self.store.set_meta(state=current)


def is_alive(state: dict) -> bool:
    """Whether the process that published `state` still exists (on this host)."""
    pid = state.get("pid")
    if not pid or state.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
