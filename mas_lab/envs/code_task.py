"""Code (PAPER.md): a coder (writes the solution) and a tester (writes unit tests) act in parallel
each turn; later turns see the mismatches between the code and the generated tests. The episode
ends when the generated tests all pass on the generated code, or after T turns.

Rewards (components stored separately): team = pass rate of the code on the golden tests;
coder local = 0.1 builds + 0.1 runs + 0.8 golden pass rate; tester local = 0.2 tests valid
+ 0.8 pass rate of the reference solution on its tests (the reference code's tester term that is
always 0 is not reproduced). All code runs in the sandbox. Data (params): `train` (default mbpp)
and `eval` (default [humaneval]); any local JSONL with `prompt` and `tests` (and `solution`).
"""
from __future__ import annotations

import ast
import json
from typing import Any

from pydantic import Field

from mas_lab.envs.base import ActionResult, Problem
from mas_lab.envs.datasets import DatasetEnv, DatasetParams, code_problems
from mas_lab.envs.games import extract_code
from mas_lab.sandbox import Limits, run_python

_MARK = "__MAS_LAB_TESTS__"


def run_tests(code: str, tests: list[str], setup: str = "", wall_s: float = 10.0) -> tuple[list[bool], str]:
    """Run `code` then each test snippet in its own try block, in one sandboxed program.
    Returns one pass flag per test and the run's status."""
    harness = (
        f"{setup}\n{code}\n\nimport json as _json\n_results = []\n"
        f"for _test in {json.dumps(tests)}:\n"
        "    try:\n        exec(_test, dict(globals()))\n        _results.append(True)\n"
        "    except BaseException:\n        _results.append(False)\n"
        f"print({_MARK!r} + _json.dumps(_results))\n"
    )
    result = run_python(harness, Limits(wall_s=wall_s, cpu_s=int(wall_s) + 1, output_chars=200_000))
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK):]), result.status
    return [False] * len(tests), result.status


def split_tests(text: str) -> list[str]:
    """Test snippets from a tester's answer: every top-level assert statement of its code."""
    code = extract_code(text)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return [line.strip() for line in code.splitlines() if line.strip().startswith("assert ")]
    return [ast.unparse(node) for node in tree.body if isinstance(node, ast.Assert)]


class CodeParams(DatasetParams):
    train: str = Field("mbpp", description="training set: mbpp, humaneval, or a local JSONL with prompt and tests")
    eval: list[str] = Field(["humaneval"], description="evaluation sets (names or JSONL paths)")
    load = staticmethod(code_problems)


class CodeEnv(DatasetEnv):
    roles = ("coder", "tester")
    parallel = True
    Params = CodeParams
    system_prompts = {
        "coder": "You are the coder. Write the Python solution in one ```python code block.",
        "tester": "You are the tester. Write unit tests as Python assert statements in one ```python code block.",
        "solver": "Write the Python solution in one ```python code block.",
    }

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.code: str | None = None
        self.tests: list[str] | None = None
        self.golden_rate = 0.0
        self.mismatch = ""

    def _golden(self, code: str) -> float:
        data = self.problem.data
        passed, _ = run_tests(code, data["tests"], data.get("setup", ""))
        return sum(passed) / len(passed) if passed else 0.0

    def observe(self, role: str, turn: int) -> str:
        text = f"Task:\n{self.problem.data['prompt']}\n"
        if self.code is not None or self.tests is not None:
            text += f"\nCurrent code:\n```python\n{(self.code or '').strip()}\n```\n"
            text += "Current tests:\n" + "\n".join(self.tests or ["(none)"]) + "\n"
            text += f"Mismatches: {self.mismatch or 'none'}\nRefine your part.\n"
        return text + ("Write the unit tests." if role == "tester" else "Write the solution.")

    def act(self, role: str, turn: int, action: str) -> ActionResult:
        if role == "tester":
            tests = split_tests(action)
            valid = [t for t in tests if self._compiles(t)]
            validity = len(valid) / len(tests) if tests else 0.0
            reference = self.problem.data.get("solution", "")
            ref_rate = 0.0
            if valid and reference:
                passed, _ = run_tests(reference, valid, self.problem.data.get("setup", ""))
                ref_rate = sum(passed) / len(passed)
            self.tests = valid
            self._update_mismatch()
            return ActionResult(team=self.golden_rate, local=0.2 * validity + 0.8 * ref_rate,
                              components={"valid": validity, "reference_pass": ref_rate}, info=f"{len(valid)} tests")
        code = extract_code(action)
        builds = float(self._compiles(code))
        runs = float(builds and run_python(code, Limits(wall_s=5.0, output_chars=1000)).ok)
        self.code = code
        self.golden_rate = self._golden(code) if builds else 0.0
        self._update_mismatch()
        return ActionResult(team=self.golden_rate, local=0.1 * builds + 0.1 * runs + 0.8 * self.golden_rate,
                          components={"builds": builds, "runs": runs, "golden_pass": self.golden_rate},
                          info=f"golden pass rate {self.golden_rate:.2f}")

    @staticmethod
    def _compiles(code: str) -> bool:
        try:
            compile(code, "<answer>", "exec")
            return True
        except (SyntaxError, ValueError):
            return False

    def _update_mismatch(self) -> None:
        if self.code is None or not self.tests:
            self.mismatch, self.agreed = "", False
            return
        passed, status = run_tests(self.code, self.tests, self.problem.data.get("setup", ""))
        failing = [t for t, ok in zip(self.tests, passed) if not ok]
        self.agreed = not failing
        self.mismatch = "; ".join(f"fails: {t}" for t in failing[:5]) + (f" (status {status})" if status != "ok" else "")

    @property
    def done(self) -> bool:
        if self.history and self.history[-1][1] == self.single_role:
            return True
        return getattr(self, "agreed", False)

    @property
    def success(self) -> bool:
        return self.golden_rate >= 1.0

    def render(self) -> str:
        return f"golden pass rate {self.golden_rate:.2f}; tests {len(self.tests or [])}; mismatches: {self.mismatch or 'none'}"
