"""The shared protocol of the game tasks (Plan-Path, Sokoban, Sudoku), paper Sec. 5 (docs/algorithm.md, "Roles, turns and rewards").

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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mas_lab.envs.base import ActionResult, Env, EnvParams, Problem
from mas_lab.sandbox.isolation import Limits, run_python

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


OUTPUT_HEADER = "Its output:\n"  # what a program printed starts after this line in an observation


def shown_output(output: str) -> str:
    """A program's printed output as an observation shows it (to the planner that sees the tool, or
    to a program_then_answer role after its own program)."""
    return f"{OUTPUT_HEADER}{output.strip() or '(nothing)'}"


KIND_WEIGHTS = {  # the local reward of each kind of role: weight x component (the paper's shaping)
    "program": {"ran": 0.1, "parsed": 0.1, "value": 0.8},
    "answer": {"format": 0.2, "value": 0.8},
}


class WorkflowRole(BaseModel):
    """One agent of a game's workflow (`env.params.workflow`), in turn order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str = Field(pattern=r"^[a-z][a-z0-9_]{0,31}$", description="the role's name (roles[].name)")
    kind: Literal["program", "answer", "program_then_answer"] = Field(
        description="program: writes a Python program whose printed output is parsed as an answer and "
        "scored on a trial copy of the state (the live state does not change); answer: states an "
        "answer that is applied to the live state; program_then_answer: one agent that does both, a "
        "program at turns 0, 2, 4, ... and, having read its code and output, an answer at the next turn "
        "(the single agent with the tool: give it twice the team's turns)"
    )
    sees: list[str] = Field(
        [],
        description="the other roles whose latest reply this one reads: a program role's code and "
        "output, an answer role's reply",
    )
    system: str | None = Field(None, description="its system prompt (default: its kind's, naming the role)")
    weights: dict[str, float] | None = Field(
        None,
        description="its local reward: weight per component (program: ran, parsed, value; answer: "
        "format, value; default 0.1/0.1/0.8 and 0.2/0.8)",
    )

    @model_validator(mode="after")
    def _known_components(self) -> "WorkflowRole":
        allowed = {k for kind in self.kinds for k in KIND_WEIGHTS[kind]}
        unknown = sorted(set(self.weights or {}) - allowed)
        if unknown:
            raise ValueError(f"weights of a {self.kind} role: unknown {unknown}; allowed: {sorted(allowed)}")
        return self

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of turn this role takes: one, or program then answer."""
        return ("program", "answer") if self.kind == "program_then_answer" else (self.kind,)

    def kind_at(self, turn: int) -> str:
        """What this role does at `turn`: program or answer."""
        return self.kinds[turn % len(self.kinds)]

    def weights_at(self, turn: int) -> dict[str, float]:
        """Every component's weight of the turn's kind, in the kind's order (the sum is taken in it)."""
        return {
            k: (self.weights or {}).get(k, w if self.weights is None else 0.0)
            for k, w in KIND_WEIGHTS[self.kind_at(turn)].items()
        }


DEFAULT_WORKFLOW = (
    WorkflowRole(role="tool", kind="program"),
    WorkflowRole(role="planner", kind="answer", sees=["tool"]),
)


class GameParams(EnvParams):
    tool_timeout_s: float = Field(3.0, gt=0.0, le=60.0, description="wall-clock limit of one tool program (s)")
    workflow: list[WorkflowRole] | None = Field(
        None,
        description="the team's roles in turn order, each a program or an answer role with what it "
        "sees and its local reward (default: tool (program) then planner (answer, sees tool), the "
        "paper's workflow); e.g. a third role verifier (answer, sees tool and planner)",
    )

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, workflow: list[WorkflowRole] | None) -> list[WorkflowRole] | None:
        if workflow is None:
            return workflow
        names = [r.role for r in workflow]
        if len(set(names)) != len(names):
            raise ValueError(f"role names repeat: {names}")
        if "solver" in names:
            raise ValueError("'solver' is the single-agent baseline's role; name the role otherwise")
        if not any("answer" in r.kinds for r in workflow):
            raise ValueError("no answer role (one role must state the answer applied to the state)")
        for r in workflow:
            for seen in r.sees:
                if seen not in names or seen == r.role:
                    raise ValueError(f"{r.role} sees '{seen}'; allowed: {[n for n in names if n != r.role]}")
                if next(o for o in workflow if o.role == seen).kind == "program_then_answer":
                    raise ValueError(f"{r.role} sees '{seen}', a program_then_answer role: it reads only itself")
        return workflow


class ToolPlannerEnv(Env):
    """The game protocol as a workflow of program and answer roles (`env.params.workflow`; by
    default the paper's tool agent then planner)."""

    roles = ("tool", "planner")
    answer_role = "planner"  # the solver of the single-agent baseline answers the same way
    Params = GameParams
    params: GameParams
    answer_hint = ""  # how the planner states its answer, e.g. "Moves: R D"
    program_hint = ""  # what the tool agent's program must print

    @property
    def answer_example(self) -> str:
        """A worked example for the system prompt (its answer is among constant_answers); none here."""
        return ""

    @property
    def program_example(self) -> str:
        return ""

    @property
    def tool_library(self) -> str:
        """Python source the sandbox runs before the tool agent's program (functions it may call);
        empty by default. Only the agent's own code is shown to the planner and stored."""
        return ""

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.tool_code = ""  # the latest program role's code and output
        self.tool_output = ""
        self.replies: dict[str, tuple[str, str]] = {}  # role -> (code, output) or (reply, "")

    @classmethod
    def roles_for(cls, params: Any) -> tuple[str, ...]:
        return tuple(r.role for r in cls.workflow_of(cls.Params.coerce(params)))

    @classmethod
    def workflow_of(cls, params: Any) -> tuple[WorkflowRole, ...]:
        return tuple(params.workflow) if params.workflow is not None else DEFAULT_WORKFLOW

    @classmethod
    def answers_at(cls, params: Any, role: str, turn: int) -> bool:
        """The single agent's replies, and a workflow role's at the turns its kind answers (a
        program_then_answer role's first answer is at turn 1, after its program)."""
        if role == cls.single_role:
            return True
        spec = cls.spec_of(params, role)
        return spec is not None and spec.kind_at(turn) == "answer"

    @classmethod
    def spec_of(cls, params: Any, role: str) -> WorkflowRole | None:
        """`role`'s entry in the workflow under `params` (None: not a workflow role)."""
        return next((r for r in cls.workflow_of(params) if r.role == role), None)

    def spec(self, role: str) -> WorkflowRole | None:
        return self.spec_of(self.params, role)

    @classmethod
    def answer_turns(cls, params: Any, max_turns: int) -> int:
        """Half the turns where the only answering agent writes a program first (program, answer,
        program, answer): a single agent with the tool on 4 turns answers twice, as the team's
        planner does on 2."""
        workflow = cls.workflow_of(cls.Params.coerce(params))
        return max_turns if any(r.kind == "answer" for r in workflow) else max_turns // 2

    def demo_turns(self, role: str) -> tuple[int, ...]:
        spec = self.spec(role)
        return tuple(range(len(spec.kinds))) if spec is not None else (0,)

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

    def execute(self, answer: Any) -> None:
        """Act out an answer under the game's execution rule (all or nothing here)."""
        self.apply(answer)

    @abstractmethod
    def value(self) -> float:
        """Team reward of the current state: 1 when solved."""

    # --- the protocol ------------------------------------------------------------------------------
    @property  # computed from the hints (Env declares a plain class attribute for fixed prompts)
    def system_prompts(self) -> dict[str, str]:  # type: ignore[override]
        prompts = {}
        for r in self.workflow_of(self.params):
            if r.system is not None:
                prompts[r.role] = r.system
            elif r.kind == "program":
                prompts[r.role] = (
                    f"You are the {r.role} agent. Write a short Python program that {self.program_hint}. "
                    f"Reply with one ```python code block.{self.program_example}"
                )
            elif r.kind == "program_then_answer":
                prompts[r.role] = (
                    f"You are the {r.role}. When asked for a program, write a short Python program "
                    f"that {self.program_hint}; reply with one ```python code block.{self.program_example} "
                    f"When shown your program's output, solve the task. {self.answer_hint}{self.answer_example}"
                )
            else:
                prompts[r.role] = f"You are the {r.role}. Solve the task. {self.answer_hint}{self.answer_example}"
        prompts["solver"] = f"Solve the task. {self.answer_hint}{self.answer_example}"
        return prompts

    def _seen(self, role: str) -> str:
        """What `role` reads of the roles it sees: their latest replies (nothing before they acted)."""
        spec = self.spec(role)
        text = ""
        for seen in spec.sees if spec else ():
            other = self.spec(seen)
            code, output = self.replies.get(seen, ("", ""))
            if other is not None and other.kind == "program":
                text += f"\nThe {seen} agent's code:\n```python\n{code.strip()}\n```\n"
                text += shown_output(output)
            else:
                text += f"\nThe {seen}'s reply:\n{code.strip() or '(nothing yet)'}"
        return text

    def observe(self, role: str, turn: int) -> str:
        text = self.task_text()
        if role == self.single_role:
            return text + f"\n{self.answer_hint}"
        spec = self.spec(role)
        if spec is None:
            raise KeyError(f"{type(self).__name__}: no role '{role}' in the workflow")
        if spec.kind_at(turn) == "program":
            return text + self._seen(role) + f"\nWrite the Python program that {self.program_hint}."
        if spec.kind == "program_then_answer":  # its own program of the turn before, and what it printed
            text += f"\nYour program:\n```python\n{self.tool_code.strip()}\n```\n"
            text += shown_output(self.tool_output)
        return text + self._seen(role) + "\n" + self.answer_hint

    def act(self, role: str, turn: int, action: str) -> ActionResult:
        spec = self.spec(role) if role != self.single_role else None
        if spec is not None and spec.kind_at(turn) == "program":
            return self._act_tool(action, spec, turn)
        answer = self.parse_answer(action)
        legal = answer is not None and self.apply(answer)
        fmt = 1.0 if legal else 0.0
        value = self.value()
        self.replies[role] = (action, "")
        components = {"format": fmt, "value": value}
        weights = (spec or DEFAULT_WORKFLOW[1]).weights_at(turn)
        return ActionResult(
            team=value,
            local=sum(weights[k] * components[k] for k in weights),
            components=components,
            info=f"answer={answer!r} legal={legal}",
        )

    def _act_tool(self, action: str, spec: WorkflowRole = DEFAULT_WORKFLOW[0], turn: int = 0) -> ActionResult:
        self.tool_code = extract_code(action)
        wall = self.params.tool_timeout_s
        # the wall limit decides; the CPU limit (one second later) is only a backstop
        program = f"{self.tool_library}\n{self.tool_code}" if self.tool_library else self.tool_code
        result = run_python(program, Limits(wall_s=wall, cpu_s=int(wall) + 1, output_chars=2000))
        self.tool_output = result.stdout if result.ok else f"[{result.status}] {result.stderr[-300:]}"
        self.replies[spec.role] = (self.tool_code, self.tool_output)
        answer = self.parse(result.stdout) if result.ok else None
        ran, parsed = float(result.ok), float(answer is not None)
        value = 0.0
        if answer is not None:
            trial = self.clone()  # what the tool's answer would do, without acting on the live state
            trial.execute(answer)
            value = trial.value()
        components = {"ran": ran, "parsed": parsed, "value": value}
        weights = spec.weights_at(turn)
        return ActionResult(
            team=self.value(),
            local=sum(weights[k] * components[k] for k in weights),
            components=components,
            info=f"status={result.status} answer={answer!r}",
        )

    @property
    def success(self) -> bool:
        return self.value() >= 1.0

    def team_value(self) -> float:
        return self.value()
