"""Code (paper Sec. 5, docs/algorithm.md): a coder (writes the solution) and a tester (writes unit tests) act in parallel
each turn; later turns see the mismatches between the code and the generated tests. The episode
ends when the generated tests all pass on the generated code, or after T turns.

Rewards (components stored separately): team = pass rate of the code on the golden tests;
coder local = 0.1 builds + 0.1 runs + 0.8 golden pass rate; tester local = 0.2 valid (the share of
its asserts that compile and call the function under test) + 0.8 the share that are meaningful:
they pass on the reference solution, and reject both the reference with every answer changed and
trivially wrong implementations (code_judge.py). The reference code's tester term that is always
0 is not reproduced. Code is judged in two sandboxes (code_judge.py), so the code under test can
neither see the tests nor forge their verdict. Data (params): `train` (default mbpp) and `eval`
(default [humaneval]); any local JSONL with `prompt` and `tests` (and `solution`).
"""

from __future__ import annotations

import ast
from typing import Any

from pydantic import Field
from typing_extensions import Self

from mas_lab.envs.base import ActionResult, Problem
from mas_lab.envs.code_judge import (
    MUTANTS,
    PERTURBATIONS,
    PERTURBED,
    PERTURBED_FUNCTION,
    Verdict,
    functions,
    judge,
    judge_apart,
    served_names,
)
from mas_lab.envs.datasets import DatasetEnv, DatasetParams, code_problems
from mas_lab.envs.games import extract_code
from mas_lab.sandbox.isolation import Limits, run_python


def golden_verdict(record: dict, code: str) -> Verdict:
    """`code` judged by the record's golden tests (code_judge: the code never sees a test)."""
    tests, setup = record["tests"], record.get("setup", "")
    return judge(tests, code, served_names(code, tests, setup, expected_functions(record)), setup)


def expected_functions(record: dict) -> tuple[str, ...]:
    """The functions the task asks for: the reference solution's, or its entry point."""
    return tuple(functions(record.get("solution", ""))) or (
        (record["entry_point"],) if record.get("entry_point") else ()
    )


def split_tests(text: str) -> list[str]:
    """Test snippets from a tester's answer: every top-level assert statement of its code."""
    code = extract_code(text)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return [line.strip() for line in code.splitlines() if line.strip().startswith("assert ")]
    return [ast.unparse(node) for node in tree.body if isinstance(node, ast.Assert)]


MIN_REJECTED = 4  # of the len(MUTANTS) = 6 trivially wrong implementations a test must reject


def _loaded_names(code: str) -> set[str]:
    try:
        return {n.id for n in ast.walk(ast.parse(code)) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    except (SyntaxError, ValueError):
        return set()


class CodeParams(DatasetParams):
    train: str = Field("mbpp", description="training set: mbpp, humaneval, or a local JSONL with prompt and tests")
    eval: list[str] = Field(["humaneval"], description="evaluation sets (names or JSONL paths)")

    @staticmethod
    def load(name: str) -> tuple[dict, ...]:
        return code_problems(name)


class CodeEnv(DatasetEnv):
    roles = ("coder", "tester")
    parallel = True
    Params = CodeParams
    params: CodeParams
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

    @property
    def function_names(self) -> tuple[str, ...]:
        return expected_functions(self.problem.data)

    def _meaningful(self, tests: list[str]) -> list[bool]:
        """Per test: it passes on the reference solution and calls the function under test, it
        rejects the reference with every answer changed (PERTURBED), and at least MIN_REJECTED of
        the trivially wrong MUTANTS. `assert True`, `assert f(x) is not None` or a type check earn
        nothing. Without a reference solution in the record no test can be checked: none counts."""
        data, names = self.problem.data, list(self.function_names)
        setup, reference = data.get("setup", ""), data.get("solution", "")
        if not tests or not names or not reference:
            return [False] * len(tests)

        def verdicts(code: str, keep: list[bool]) -> list[bool]:
            """Pass flags of the kept tests against `code` (False for the others), each test judged
            in a process of its own (code_judge.judge_apart: no test speaks for another)."""
            out, chosen = [False] * len(tests), [i for i, k in enumerate(keep) if k]
            for index, passed in zip(chosen, judge_apart([tests[i] for i in chosen], code, names, setup).passed):
                out[index] = passed
            return out

        on_reference = judge_apart(tests, reference, names, setup)
        keep = [p and e for p, e in zip(on_reference.passed, on_reference.exercised)]
        for way in range(PERTURBATIONS):
            perturbed = PERTURBED.format(reference=reference) + "".join(
                PERTURBED_FUNCTION.format(name=n, way=way) for n in names
            )
            keep = [k and not passed for k, passed in zip(keep, verdicts(perturbed, keep))]
        rejected = [0] * len(tests)
        for mutant in MUTANTS:
            for index, passed in enumerate(verdicts("".join(mutant.format(name=n) for n in names), keep)):
                rejected[index] += not passed
        return [k and r >= MIN_REJECTED for k, r in zip(keep, rejected)]

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
            names = set(self.function_names)
            valid = [t for t in tests if self._compiles(t) and names & _loaded_names(t)]
            validity = len(valid) / len(tests) if tests else 0.0
            meaningful = self._meaningful(valid)
            rate = sum(meaningful) / len(tests) if tests else 0.0
            self.tests = [t for t, m in zip(valid, meaningful) if m]
            self._update_mismatch()
            return ActionResult(
                team=self.golden_rate,
                local=0.2 * validity + 0.8 * rate,
                components={"valid": validity, "reference_pass": rate},
                info=f"{len(valid)} valid, {len(self.tests)} meaningful of {len(tests)} tests",
            )
        code = extract_code(action)
        builds = float(self._compiles(code))
        runs = float(builds and run_python(code, Limits(wall_s=5.0, output_chars=1000)).ok)
        self.code = code
        self.golden_rate = golden_verdict(self.problem.data, code).rate if builds else 0.0
        self._update_mismatch()
        return ActionResult(
            team=self.golden_rate,
            local=0.1 * builds + 0.1 * runs + 0.8 * self.golden_rate,
            components={"builds": builds, "runs": runs, "golden_pass": self.golden_rate},
            info=f"golden pass rate {self.golden_rate:.2f}",
        )

    def adopt(self, role: str, branch: Self) -> None:
        if role == "tester":
            self.tests = branch.tests
        else:
            self.code, self.golden_rate = branch.code, branch.golden_rate
        self._update_mismatch()

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
        setup = self.problem.data.get("setup", "")
        verdict = judge(self.tests, self.code, served_names(self.code, self.tests, setup, self.function_names), setup)
        failing = [t for t, ok in zip(self.tests, verdict.passed) if not ok]
        self.agreed = not failing
        self.mismatch = "; ".join(f"fails: {t}" for t in failing[:5]) + (
            f" (status {verdict.status})" if verdict.status != "ok" else ""
        )

    @property
    def done(self) -> bool:
        if self.history and self.history[-1][1] == self.single_role:
            return True
        return getattr(self, "agreed", False)

    @property
    def success(self) -> bool:
        return self.golden_rate >= 1.0

    def team_value(self) -> float:
        return self.golden_rate

    def render(self) -> str:
        return f"golden pass rate {self.golden_rate:.2f}; tests {len(self.tests or [])}; mismatches: {self.mismatch or 'none'}"
