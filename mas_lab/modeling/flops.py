"""Floating-point operations a model did, counted from the shapes of its real forward calls, and
the machine's matmul peak they are measured against (model-FLOPs utilisation, as the field reports
it for GPUs: e.g. PaLM's MFU, Chowdhery et al. 2022, App. B).

6N per token is wrong for this code: the rollout prefills a shared prefix once and runs the output
layer at the last position only, the learner runs each distinct prompt once for its K candidates
and the output layer at response positions only, padding is computed, and filtered groups are not
trained. So a `FlopMeter` hooks the decoder and the output layer of one model and adds, for every
call, what its shapes make the matmuls do:

- the decoder's linear layers: 2 * in * out per token (each nn.Linear under the decoder);
- attention: 4 * heads * head_dim per (query token, key token) per layer (QK^T and AV), every key
  the call attends over (cached keys included, masked ones too: the kernel computes them);
- the output layer: 2 * hidden * vocab per row it is run on.

A call made with gradients enabled is counted once more for its backward pass: the input
gradients (as many FLOPs as the forward), the weight gradients of every weight that is trained
(as many again), and attention's backward (twice its forward). These are the counts torch's
FlopCounterMode makes for the same calls (tests/test_flops.py checks equality for a learner update
and a sampling loop), with the attention kernel it misses on the CPU counted by the same rule.
Norms, activations and the softmax are not matmuls and are not counted (nor are they by torch).
Not counted either: the frozen reference model's forward under `algorithm.kl_coef` (it has no meter).
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mas_lab.modeling.models import cache_dir

PEAK_FILE = "matmul_peak.json"  # under the model cache (modeling/models.cache_dir)


@dataclass(frozen=True)
class Dims:
    """What one model's matmuls cost per token."""

    linear: int  # sum of in * out over the decoder's linear layers
    trained_linear: int  # the same over those whose weight is trained (requires grad)
    attention: int  # layers * heads * head_dim: per (query, key) pair, half the multiply-adds of QK^T and AV
    head: int  # hidden * vocab of the output layer
    head_trained: bool
    hidden: int
    intermediate: int


def dims_of(model: Any) -> Dims:
    """The per-token costs of a causal LM (transformers, Llama family and alike), from its modules
    and config."""
    decoder = model.get_decoder()
    linears = [m for m in decoder.modules() if isinstance(m, torch.nn.Linear)]
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    head = model.get_output_embeddings()
    return Dims(
        linear=sum(m.in_features * m.out_features for m in linears),
        trained_linear=sum(m.in_features * m.out_features for m in linears if m.weight.requires_grad),
        attention=config.num_hidden_layers * heads * head_dim,
        head=head.in_features * head.out_features,
        head_trained=bool(head.weight.requires_grad),
        hidden=config.hidden_size,
        intermediate=getattr(config, "intermediate_size", 4 * config.hidden_size),
    )


class FlopMeter:
    """Counts the FLOPs of every forward call of one model (and of the backward of those made with
    gradients enabled) until `take()`. Hooks, so the calling code does not change; the learner's
    chunked log-probabilities use the output layer's weight without calling it and say so with
    `head_rows`."""

    def __init__(self, model: Any):
        self.model = model
        self.dims = dims_of(model)
        self.flops = 0.0
        self._hooks = [
            model.get_decoder().register_forward_pre_hook(self._decoder_call, with_kwargs=True),
            model.get_output_embeddings().register_forward_hook(self._head_call),
        ]

    def refresh(self) -> None:
        """Re-read which weights are trained (after adapters are attached or frozen)."""
        self.dims = dims_of(self.model)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def take(self) -> float:
        """The FLOPs counted since the last take."""
        flops, self.flops = self.flops, 0.0
        return flops

    def decoder(self, rows: int, new: int, past: int, grad: bool) -> None:
        """One decoder call: `rows` sequences of `new` tokens on top of `past` cached ones."""
        d = self.dims
        tokens = rows * new
        linear = 2.0 * tokens * d.linear
        attention = 4.0 * d.attention * tokens * (past + new)
        self.flops += linear + attention
        if grad:
            self.flops += 2.0 * tokens * (d.linear + d.trained_linear) + 2.0 * attention

    def head_rows(self, rows: int, grad: bool, recomputed: bool = False) -> None:
        """The output layer on `rows` hidden states (`recomputed`: its backward runs the forward
        matmul again, as the learner's chunked log-probabilities do)."""
        forward = 2.0 * rows * self.dims.head
        backward = forward * (1 + self.dims.head_trained + recomputed) if grad else 0.0
        self.flops += forward + backward

    def _decoder_call(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs["inputs_embeds"]
        cache = kwargs.get("past_key_values", kwargs.get("cache"))
        past = int(cache.get_seq_length()) if cache is not None else 0
        self.decoder(ids.shape[0], ids.shape[1], past, torch.is_grad_enabled())

    def _head_call(self, module, args, output) -> None:
        hidden = args[0]
        self.head_rows(hidden.numel() // hidden.shape[-1], torch.is_grad_enabled())


# --- the peak: what this machine's matmuls reach at the model's own shapes ------------------------
def machine_key(device: str, dtype: str, threads: int, dims: Dims) -> str:
    """Which peak a run compares against: the processor (or card), the dtype, the threads, the
    model's shapes."""
    if device.startswith("cuda") and torch.cuda.is_available():
        chip = torch.cuda.get_device_name(torch.device(device))
    else:
        chip = _cpu_model()
    return f"{chip} | {dtype} | {threads} threads | {dims.hidden}x{dims.intermediate}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure_peak(dims: Dims, dtype: str = "float32", device: str = "cpu", tokens: int = 512, seconds: float = 2.0):
    """GFLOP/s of the model's largest matmuls ([tokens, hidden] x [hidden, intermediate] and its
    transpose, the MLP's), best of repeated timings over about `seconds`, in the current thread
    setting. The number a step's utilisation divides by."""
    kind = getattr(torch, dtype)
    x = torch.randn(tokens, dims.hidden, dtype=kind, device=device)
    w = torch.randn(dims.hidden, dims.intermediate, dtype=kind, device=device)
    back = torch.randn(dims.intermediate, dims.hidden, dtype=kind, device=device)
    flops = 2.0 * tokens * dims.hidden * dims.intermediate * 2

    def once() -> None:
        (x @ w) @ back
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    for _ in range(3):
        once()
    best, deadline = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        for _ in range(4):
            once()
        best = min(best, (time.perf_counter() - started) / 4)
    return flops / best / 1e9


def peak_file() -> Path:
    return cache_dir() / PEAK_FILE


def cached_peak(key: str) -> float | None:
    """The measured peak for this key (GFLOP/s), or None where benchmarks/matmul_peak.py has not
    measured it on this machine."""
    try:
        return float(json.loads(peak_file().read_text())[key]["gflops"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_peak(key: str, gflops: float) -> None:
    path = peak_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    known[key] = {"gflops": gflops, "measured": time.strftime("%Y-%m-%d %H:%M:%S")}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
    os.replace(tmp, path)


def peak_for(dims: Dims, dtype: str, device: str = "cpu") -> float | None:
    """The cached peak for a model of these shapes on this machine at the current thread count."""
    return cached_peak(machine_key(device, dtype, torch.get_num_threads(), dims))
