"""The floating-point type a model computes in, decided where the model runs.

`dtype: auto` (the shipped task files) resolves, in each rollout worker and learner, to bfloat16
where that device computes it natively and to float32 elsewhere. Native means: a CUDA device with
bf16 support, or a CPU whose flags list `avx512_bf16` or `amx_bf16` (x86) or `bf16` (aarch64).
Elsewhere torch emulates bf16 matrix products: on a 2-core AMD EPYC without AVX-512 (Zen 3) a
1024 x 1024 bf16 product ran at 0.85 GFLOP/s against 52 in float32, and one format warm-up step
of the per-role LoRA task took 710 s instead of 9 s (docs/measurements.md, `benchmarks/precision.py`).
An explicit `bfloat16` is kept as asked; the run then records that it is emulated.

vLLM on a CPU resolves `auto` to float32 whatever the flags: its bf16 CPU path once gave garbage
text here, and float32 is the one known to agree with the learner.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

NATIVE_CPU_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})
DTYPES = ("auto", "float32", "bfloat16")


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (x86 `flags`, aarch64 `Features`); empty where
    there is no such file (then bf16 counts as not native)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def native_bf16(device: str) -> bool:
    """Whether `device` ("cpu", "cuda", "cuda:N") computes bfloat16 natively."""
    if device.startswith("cuda"):
        # lazy: torch (~1.4 s), only where a model is built or the CPU is probed
        import torch

        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return bool(cpu_flags() & NATIVE_CPU_FLAGS)


def resolve(dtype: str, device: str) -> str:
    """ "float32" or "bfloat16": `auto` by the device's hardware, the others as given."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: allowed are {', '.join(DTYPES)}")
    if dtype != "auto":
        return dtype
    return "bfloat16" if native_bf16(device) else "float32"


def report(requested: str, device: str) -> dict[str, object]:
    """What an actor tells the run about its precision: the requested and resolved dtype, the
    device, and whether bf16 is emulated there (slow: see the module docstring)."""
    resolved = resolve(requested, device)
    return {
        "requested": requested,
        "dtype": resolved,
        "device": device,
        "emulated_bf16": resolved == "bfloat16" and not native_bf16(device),
        "native_bf16": native_bf16(device),
    }
