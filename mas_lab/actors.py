"""What an actor (rollout worker or learner) can say about where it runs."""
from __future__ import annotations

import socket


def node_id() -> str:
    """The Ray node this process runs on, or `local:<host>` outside Ray."""
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:  # Ray absent or not in a worker
        pass
    return f"local:{socket.gethostname()}"
