"""Sandbox throughput and per-run overhead, printed as JSON.

    .venv/bin/python benchmarks/sandbox.py [--runs 200] [--resident-gb 0]

Overhead: mean wall time of one run of an empty program, sequentially (process start, limits,
namespaces, user switch, temp folder), for the isolation in use (bubblewrap where it works) and,
side by side in the same run, for the weaker fallback (process group, rlimits, network namespace,
user nobody: the sandbox before bubblewrap). Throughput: runs per second of the empty program and
of a small BFS program through the shared pool (as many workers as cores).

--resident-gb G: first make this process hold G GB of touched memory, as a `mas-lab run --no-ray`
process holds its model, optimizer and caches (4-6 GB for SmolLM2-135M): what a sandbox start costs
in a large process (a start that forks our process copies its page tables; one that vforks does not).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from mas_lab.sandbox.isolation import SYSTEM_PYTHON, Isolation, Limits, _run, capabilities, run_many

BFS = """
from collections import deque
grid = ['.....', '.###.', '.....', '.#.#.', '.....']
start, goal = (0, 0), (4, 4)
prev = {start: None}; queue = deque([start])
while queue:
    r, c = queue.popleft()
    for dr, dc, m in ((1, 0, 'D'), (-1, 0, 'U'), (0, 1, 'R'), (0, -1, 'L')):
        n = (r + dr, c + dc)
        if 0 <= n[0] < 5 and 0 <= n[1] < 5 and grid[n[0]][n[1]] == '.' and n not in prev:
            prev[n] = ((r, c), m); queue.append(n)
path, cell = [], goal
while prev[cell]:
    cell, m = prev[cell]; path.append(m)
print(path[::-1])
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--resident-gb", type=float, default=0.0)
    args = parser.parse_args()
    ballast = b"\x01" * int(args.resident_gb * 2**30)  # written, so resident  # noqa: F841
    isolation = capabilities()
    rss_mb = int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) // 1024
    out = {"isolation": isolation.describe(), "cores": os.cpu_count(), "resident_mb": rss_mb}
    fallback = Isolation(
        "fallback",
        True,
        "nobody" if os.geteuid() == 0 else None,
        SYSTEM_PYTHON if os.geteuid() == 0 else isolation.interpreter,
    )
    for name, option in (("", isolation), ("fallback_", fallback)):
        durations = [_run("pass", Limits(), option).duration for _ in range(30)]
        out[f"{name}overhead_ms_mean"] = round(1000 * statistics.fmean(durations), 1)
        out[f"{name}overhead_ms_p95"] = round(1000 * sorted(durations)[int(0.95 * len(durations))], 1)
    out["overhead_ratio_vs_fallback"] = round(out["overhead_ms_mean"] / out["fallback_overhead_ms_mean"], 2)
    for name, code in (("empty", "pass"), ("bfs", BFS)):
        started = time.perf_counter()
        results = run_many([code] * args.runs)
        elapsed = time.perf_counter() - started
        out[f"throughput_{name}_runs_per_s"] = round(args.runs / elapsed, 1)
        out[f"{name}_ok"] = sum(r.ok for r in results)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
