"""The shared protocol of the game tasks (Plan-Path, Sokoban, Sudoku), PAPER.md "Games / planning".

Roles, in turn order: the tool agent writes a short Python program whose printed output is an
answer (a move list, a grid); it runs in the sandbox and its output is parsed. The planner sees
the task, the tool's code and output, and gives the answer that is applied to the live state.
The single-agent baseline's `solver` sees only the task and answers.

Rewards (stored as separate components, alpha per role in the task file):
- team: `value(state)`, 1 when solved, partial credit below 1 otherwise (per game);
- tool agent local: 0.1 ran + 0.1 printed a parseable answer + 0.8 * value of applying it;
- planner / solver local: 0.2 format (parseable and legal) + 0.8 * value of the state after it.
"""
from __future__ import annotations

import re
from abc import abstractmethod
from typing import Any

from pydantic import Field

from mas_lab.envs.base import ActionResult, Env, EnvParams, Problem
from mas_lab.sandbox import Limits, run_python

_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)
_OPEN_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*)$", re.DOTALL)


def extract_code(text: str) -> str:
    """The program in a reply: the last closed ```python block; else the text after an opening
    fence that was never closed (the model ran out of tokens), not the prose before it; else the
    whole reply."""
    blocks = _CODE_BLOCK.findall(text)
    if blocks:
        return blocks[-1]
    opened = _OPEN_BLOCK.search(text)
    return opened.group(1) if opened else text


class GameParams(EnvParams):
    tool_timeout_s: float = Field(3.0, gt=0.0, le=60.0, description="wall-clock limit of one tool program (s)")


class ToolPlannerEnv(Env):
    roles = ("tool", "planner")
    answer_role = "planner"  # the solver of the single-agent baseline answers the same way
    Params = GameParams
    answer_hint = ""  # how the planner states its answer, e.g. "Moves: R D"
    program_hint = ""  # what the tool agent's program must print
    answer_example = ""  # a worked example for the system prompt (its answer is among constant_answers)
    program_example = ""

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.tool_code = ""
        self.tool_output = ""

    # --- what each game defines ------------------------------------------------------------------
    @abstractmethod
    def task_text(self) -> str:
        """The problem and the current state, as the agents read it."""

    @abstractmethod
    def parse(self, text: str) -> Any:
        """An answer from a tool program's output, or None when there is none."""

    def parse_answer(self, text: str) -> Any:
        """The planner's (or solver's) stated answer in its reply (`answer_hint` says the form)."""
        return self.parse(text)

    @abstractmethod
    def apply(self, answer: Any) -> bool:
        """Apply a parsed answer to this state (mutates); False when any part was illegal."""

    @abstractmethod
    def value(self) -> float:
        """Team reward of the current state: 1 when solved."""

    # --- the protocol ------------------------------------------------------------------------------
    @property
    def system_prompts(self) -> dict[str, str]:
        return {
            "tool": f"You are the tool agent. Write a short Python program that {self.program_hint}. "
                    f"Reply with one ```python code block.{self.program_example}",
            "planner": f"You are the planner. Solve the task. {self.answer_hint}{self.answer_example}",
            "solver": f"Solve the task. {self.answer_hint}{self.answer_example}",
        }

    def observe(self, role: str, turn: int) -> str:
        text = self.task_text()
        if role == "tool":
            return text + f"\nWrite the Python program that {self.program_hint}."
        if role == self.single_role:
            return text + f"\n{self.answer_hint}"
        return (
            text
            + f"\nThe tool agent's code:\n```python\n{self.tool_code.strip()}\n```\n"
            + f"Its output:\n{self.tool_output.strip() or '(nothing)'}\n"
            + self.answer_hint
        )

    def act(self, role: str, turn: int, action: str) -> ActionResult:
        if role == "tool":
            return self._act_tool(action)
        answer = self.parse_answer(action)
        legal = answer is not None and self.apply(answer)
        fmt = 1.0 if legal else 0.0
        value = self.value()
        return ActionResult(team=value, local=0.2 * fmt + 0.8 * value, components={"format": fmt, "value": value},
                          info=f"answer={answer!r} legal={legal}")

    def _act_tool(self, action: str) -> ActionResult:
        self.tool_code = extract_code(action)
        wall = self.params.tool_timeout_s
        # the wall limit decides; the CPU limit (one second later) is only a backstop
        result = run_python(self.tool_code, Limits(wall_s=wall, cpu_s=int(wall) + 1, output_chars=2000))
        self.tool_output = result.stdout if result.ok else f"[{result.status}] {result.stderr[-300:]}"
        answer = self.parse(result.stdout) if result.ok else None
        ran, parsed = float(result.ok), float(answer is not None)
        value = 0.0
        if answer is not None:
            trial = self.clone()  # what the tool's answer would do, without acting on the live state
            trial.apply(answer)
            value = trial.value()
        return ActionResult(team=self.value(), local=0.1 * ran + 0.1 * parsed + 0.8 * value,
                          components={"ran": ran, "parsed": parsed, "value": value},
                          info=f"status={result.status} answer={answer!r}")

    @property
    def success(self) -> bool:
        return self.value() >= 1.0
