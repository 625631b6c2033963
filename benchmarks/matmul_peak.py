"""This machine's matmul peak at a model's own shapes (the MLP's [tokens, hidden] x [hidden,
intermediate] and back), in each dtype and thread count asked, printed as JSON and kept in the model
cache (matmul_peak.json), where every run's rollout and learner look it up to report utilisation
(rollout_util, learner_util/<policy>: mas_lab/modeling/flops.py).

    .venv/bin/python benchmarks/matmul_peak.py [--model smollm2-135m-instruct] [--dtypes float32 bfloat16]
        [--threads 0] [--seconds 3]

--threads 0 means every core (what an actor uses by default, resources.torch_threads 0). bfloat16 is
skipped where the CPU has no native bf16 (emulated, it is not a peak). Run on an idle machine: the
number is kept and every later run divides by it.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from mas_lab.modeling import flops
from mas_lab.modeling.models import resolve
from mas_lab.modeling.precision import native_bf16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, nargs="+", default=[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve(args.model), dtype=torch.float32)
    dims = flops.dims_of(model)
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads or os.cpu_count() or 1)
        for dtype in args.dtypes:
            if dtype == "bfloat16" and not native_bf16(args.device):
                rows.append({"dtype": dtype, "skipped": "no native bf16 on this device"})
                continue
            gflops = flops.measure_peak(dims, dtype, args.device, seconds=args.seconds)
            key = flops.machine_key(args.device, dtype, torch.get_num_threads(), dims)
            flops.save_peak(key, gflops)
            rows.append({"key": key, "dtype": dtype, "threads": torch.get_num_threads(), "gflops": round(gflops, 1)})
    print(json.dumps({"model": args.model, "cache": str(flops.peak_file()), "peaks": rows}, indent=1))


if __name__ == "__main__":
    main()
