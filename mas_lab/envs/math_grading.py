"""Math answers graded by math-verify, bounded in time.

Parsing and verifying LaTeX with sympy can run for minutes (`9^{9^{9}}` against "6" ran past 40 s)
and math-verify's own timeouts use signals, which work only in the main thread, while rewards are
scored in worker threads. So grading runs in a small pool of worker processes (`python -m
mas_lab.envs.math_grading`, one JSON line per request); a request that outlives its limit kills
its worker (a new one starts on the next request) and is scored as wrong.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import select
import subprocess
import sys
from functools import lru_cache

TIMEOUT_S = 5.0
WORKERS = 2


def grade_in_process(predicted: str | None, gold: str) -> bool:
    """Whether a predicted answer equals the gold one (fractions, intervals, units, \\left/\\right,
    thousands separators handled by math-verify). Unbounded: call it through `grade`."""
    if predicted is None or not predicted.strip():
        return False
    # lazy: math_verify, an optional extra (math tasks)
    from math_verify import parse, verify

    gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    pred_parsed = parse(f"${predicted}$", parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return predicted.strip() == gold.strip()
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


class _Pool:
    def __init__(self, workers: int):
        self.idle: "queue.Queue[subprocess.Popen | None]" = queue.Queue()
        for _ in range(workers):
            self.idle.put(None)  # a free place; its process starts on first use

    def grade(self, predicted: str, gold: str, timeout_s: float) -> bool:
        worker = self.idle.get()
        try:
            if worker is None or worker.poll() is not None:
                worker = subprocess.Popen(
                    [sys.executable, "-m", "mas_lab.envs.math_grading"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ},
                )
            assert worker.stdin is not None and worker.stdout is not None  # both piped above
            worker.stdin.write((json.dumps({"predicted": predicted, "gold": gold}) + "\n").encode())
            worker.stdin.flush()
            ready, _, _ = select.select([worker.stdout], [], [], timeout_s)
            line = worker.stdout.readline() if ready else b""
            if not line:  # timed out (or died): this worker is gone, the answer counts as wrong
                worker.kill()
                worker.wait()
                worker = None
                return False
            return line.strip() == b"1"
        except OSError:
            worker = None
            return False
        finally:
            self.idle.put(worker)


_POOL = _Pool(WORKERS)


@lru_cache(maxsize=65536)
def grade(predicted: str | None, gold: str, timeout_s: float = TIMEOUT_S) -> bool:
    """`grade_in_process` in a worker process, at most `timeout_s` seconds (then: wrong)."""
    if predicted is None or not predicted.strip():
        return False
    if predicted.strip() == gold.strip():
        return True
    return _POOL.grade(predicted, gold, timeout_s)


def main() -> None:
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            ok = grade_in_process(request["predicted"], request["gold"])
        except Exception:
            ok = False
        sys.stdout.write("1\n" if ok else "0\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
