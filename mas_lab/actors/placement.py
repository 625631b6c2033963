"""What an actor (rollout worker or learner) can say about where it runs, and how many threads it uses."""

from __future__ import annotations

import os
import socket

import torch


def node_id() -> str:
    """The Ray node this process runs on, or `local:<host>` outside Ray."""
    try:
        # lazy: ray (~0.4 s), only where the actors run
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # Ray absent or not in a worker
        pass
    return f"local:{socket.gethostname()}"


def set_threads(threads: int) -> None:
    """Ray sets torch threads from an actor's num_cpus; on this machine the phases alternate, so
    each actor may use every core during its phase (0 = all cores)."""
    torch.set_num_threads(threads or os.cpu_count() or 1)
