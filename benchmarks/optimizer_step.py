"""The learner's optimizer step, side by side: torch's AdamW as the learner builds it (the per-tensor
loop, torch's CPU default), with foreach=True, and with fused=True, on one model's parameters and
the same gradients, printed as JSON: seconds per step and each variant's largest difference from the
default after the same steps.

    .venv/bin/python benchmarks/optimizer_step.py [--model smollm2-135m-instruct] [--steps 5]

Run on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from mas_lab.modeling.models import resolve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=2e-5)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve(args.model), dtype=torch.float32)
    start = [p.detach().clone() for p in model.parameters()]
    generator = torch.Generator().manual_seed(0)
    grads = [[torch.randn(p.shape, generator=generator) * 1e-3 for p in start] for _ in range(2)]
    out: dict = {"model": args.model, "parameters": sum(p.numel() for p in start), "threads": torch.get_num_threads()}
    finals = {}
    for variant, options in (("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0, **options)
        times = []
        for step in range(args.steps + 1):
            for p, g in zip(params, grads[step % 2]):
                p.grad = g
            started = time.perf_counter()
            optimizer.step()
            if step:
                times.append(time.perf_counter() - started)
        out[f"{variant}_s"] = round(statistics.fmean(times), 4)
        finals[variant] = params
    for variant in ("foreach", "fused"):
        out[f"{variant}_max_abs_diff"] = max(
            float((a - b).detach().abs().max()) for a, b in zip(finals[variant], finals["default"])
        )
        out[f"{variant}_speedup"] = round(out["default_s"] / out[f"{variant}_s"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
