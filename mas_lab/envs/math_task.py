"""Math (paper Sec. 5, docs/algorithm.md): a reasoner (answer in \\boxed{}) and a tool agent (Python that prints the
answer) act in parallel each turn; later turns see both answers and select or refine. The
episode ends when their answers agree, or after T turns.

Rewards (components stored separately): team = correctness of the team's answer (the reasoner's,
or the tool's while the reasoner has none); reasoner local = 0.2 format + 0.8 match; tool local =
0.1 builds + 0.1 executes + 0.8 match. The single-agent `solver` is scored as the reasoner.
Grading uses math-verify in worker processes with a time limit (math_grading.py): an answer
that takes longer to grade counts as wrong.
Data (params): `train` (default math_train: the MATH test set minus MATH-500) and `eval` (a list,
default [math500, gsm8k]); any local JSONL with `problem` and `answer` fields.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from pydantic import Field
from typing_extensions import Self

from mas_lab.envs.base import ActionResult, Problem
from mas_lab.envs.datasets import DatasetEnv, DatasetParams, last_boxed, math_problems
from mas_lab.envs.games import extract_code
from mas_lab.envs.math_grading import grade
from mas_lab.sandbox.isolation import Limits, run_python

logging.getLogger("math_verify").setLevel(logging.ERROR)


_VARIABLE = re.compile(r"[A-Za-z](_\{?\w+\}?)?")


def stated_answer(text: str) -> str | None:
    """The reasoner's answer: the last \\boxed{...}, when it holds one. Empty is no answer (it
    earned the format term), nor is a relation between two expressions ("7 = 6" was graded as 6):
    an "=" is allowed only after a variable ("x = 6")."""
    answer = last_boxed(text)
    if answer is None or not answer.strip():
        return None
    if "=" in answer:
        left = answer.split("=", 1)[0].strip()
        if not _VARIABLE.fullmatch(left):
            return None
    return answer.strip()


def _answers_agree(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and (a.strip() == b.strip() or grade(a, b))


class MathParams(DatasetParams):
    train: str = Field(
        "math_train",
        description="training set: math_train (the MATH test set minus MATH-500), "
        "math500, gsm8k, or a local JSONL with problem and answer",
    )
    eval: list[str] = Field(["math500", "gsm8k"], description="evaluation sets (names or JSONL paths)")
    tool_timeout_s: float = Field(5.0, gt=0.0, le=60.0, description="wall-clock limit of one tool program (s)")

    @staticmethod
    def load(name: str) -> tuple[dict, ...]:
        return math_problems(name)


class MathEnv(DatasetEnv):
    roles = ("reasoner", "tool")
    parallel = True
    Params = MathParams
    params: MathParams
    system_prompts = {
        "reasoner": "You are the reasoner. Solve the problem step by step and put the final answer in \\boxed{}.",
        "tool": "You are the tool agent. Write a short Python program that computes the answer and prints only it. "
        "Reply with one ```python code block.",
        "solver": "Solve the problem step by step and put the final answer in \\boxed{}.",
    }

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.answers: dict[str, str | None] = {}
        self.notes: dict[str, str] = {}

    @property
    def gold(self) -> str:
        return self.problem.data["answer"]

    def team_answer(self) -> str | None:
        return self.answers.get("reasoner") or self.answers.get("solver") or self.answers.get("tool")

    def observe(self, role: str, turn: int) -> str:
        text = f"Problem:\n{self.problem.data['problem']}\n"
        if self.answers:
            text += "\nAnswers so far:\n" + "".join(
                f"- {r}: {self.answers.get(r) or '(none)'}{self.notes.get(r, '')}\n" for r in sorted(self.answers)
            )
            text += "Select or refine the answer.\n"
        if role == "tool":
            return text + "Write the Python program that prints the answer."
        return text + "Give the final answer in \\boxed{}."

    def act(self, role: str, turn: int, action: str) -> ActionResult:
        if role == "tool":
            code = extract_code(action)
            try:
                compile(code, "<tool>", "exec")
                builds = 1.0
            except (SyntaxError, ValueError):
                builds = 0.0
            result = run_python(code, Limits(wall_s=self.params.tool_timeout_s, output_chars=2000)) if builds else None
            executes = float(result is not None and result.ok)
            lines = [line for line in (result.stdout if result else "").splitlines() if line.strip()]
            answer = lines[-1].strip() if executes and lines else None
            self.notes[role] = f" (program output: {answer})" if answer else " (program failed)"
            components = {"builds": builds, "executes": executes}
            weights = (0.1 * builds + 0.1 * executes, 0.8)
        else:
            answer = stated_answer(action)
            fmt = float(answer is not None)
            components = {"format": fmt}
            weights = (0.2 * fmt, 0.8)
        self.answers[role] = answer
        match = float(grade(answer, self.gold))
        components["match"] = match
        team = float(grade(self.team_answer(), self.gold))
        return ActionResult(
            team=team,
            local=weights[0] + weights[1] * match,
            components=components,
            info=f"answer={answer!r} gold={self.gold!r}",
        )

    def adopt(self, role: str, branch: Self) -> None:
        self.answers[role] = branch.answers.get(role)
        if role in branch.notes:
            self.notes[role] = branch.notes[role]

    @property
    def done(self) -> bool:
        if self.single_role in self.answers:
            return self.answers[self.single_role] is not None
        return _answers_agree(self.answers.get("reasoner"), self.answers.get("tool"))

    @property
    def success(self) -> bool:
        return grade(self.team_answer(), self.gold)

    def render(self) -> str:
        return f"answers={self.answers} gold={self.gold!r}"
