"""Running model-written programs isolated: bubblewrap or the fallback, memory cgroups, child processes.

The public API of isolation.py (run_python, run_many, Limits, SandboxPool, ...) is
re-exported here: `from mas_lab.sandbox.isolation import run_python`."""

from mas_lab.sandbox.isolation import (
    Isolation,
    Limits,
    SandboxPool,
    SandboxResult,
    SandboxUnavailable,
    capabilities,
    configure,
    raise_refusal,
    run_many,
    run_python,
    take_refusal,
)

__all__ = [
    "Isolation",
    "Limits",
    "SandboxPool",
    "SandboxResult",
    "SandboxUnavailable",
    "capabilities",
    "configure",
    "raise_refusal",
    "run_many",
    "run_python",
    "take_refusal",
]
