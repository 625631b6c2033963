"""The constant-answer baseline: the held-out success of a team that ignores what it sees.

A policy under RL can raise its success without reading the problem: it can learn one fixed
answer that happens to solve some problems (the SmolLM2 teams of docs/results.md collapsed onto the
prompt's example "Moves: R D", which solved 10 of 64 held-out Plan-Path problems). A lift counts
as learning to solve the task only where it beats the best such answer. An environment lists the
fixed replies worth trying (`Env.constant_answers`); the baseline plays each of them as the
answering role's reply on every turn of every evaluation problem, without a model, and keeps the
best. Other roles are left out: in the games a constant tool program only changes what the
answering role reads, and a constant answer does not read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from mas_lab.envs import ENVS
from mas_lab.envs.base import Env, EnvParams, Problem

if TYPE_CHECKING:
    from mas_lab.config import TaskConfig


@dataclass(frozen=True)
class ConstantBaseline:
    """The best fixed answer on a problem set: its text and how many problems it solves."""

    answer: str
    solved: int
    problems: int

    @property
    def success(self) -> float:
        return self.solved / self.problems if self.problems else 0.0


def solves(env_cls: type[Env], problem: Problem, params: EnvParams, answer: str, max_turns: int) -> bool:
    """Whether replying `answer` on every turn solves `problem`."""
    env = env_cls(problem, params)
    for turn in range(max_turns):
        env.step(env_cls.answer_role, turn, answer)
        if env.done:
            break
    return env.success


def best_constant(env_cls: type[Env], params: EnvParams, problems: Sequence[Problem],
                  max_turns: int) -> ConstantBaseline | None:
    """The fixed answer (of `env_cls.constant_answers`) that solves the most of `problems`; the
    first one listed on ties. None when the environment lists none."""
    best: ConstantBaseline | None = None
    for answer in env_cls.constant_answers(params):
        solved = sum(solves(env_cls, p, params, answer, max_turns) for p in problems)
        if best is None or solved > best.solved:
            best = ConstantBaseline(answer, solved, len(problems))
    return best


def task_baseline(task: "TaskConfig", problems: Sequence[Problem]) -> ConstantBaseline | None:
    """`best_constant` with a task's environment, parameters and number of turns."""
    env_cls = ENVS[task.env.name]
    return best_constant(env_cls, env_cls.Params.coerce(task.env.params), problems, task.env.max_turns)
