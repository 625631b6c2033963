"""A tiny two-role toy environment for tests and the learning check.

Each problem names a letter; both roles, in turn order, answer with text, and the reward is the
fraction of the answer's characters that are that letter. A tiny random model learns it within
a minute, and a scripted fake engine can drive every invariant of Algorithm 1 through it.
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from mas_lab.envs.base import ActionResult, Env, EnvParams, Problem


class ToyParams(EnvParams):
    letters: str = Field("a", min_length=1, description="letters a problem may ask for")
    success_threshold: float = Field(0.9, ge=0.0, le=1.0, description="mean score that counts as solved")


class ToyEnv(Env):
    roles = ("first", "second")
    Params = ToyParams
    params: ToyParams

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.scores: list[float] = []

    @classmethod
    def _draw(cls, rng: random.Random, params: ToyParams, split: str) -> Problem:
        letters = params.letters
        return Problem({"letter": rng.choice(letters), "number": rng.randrange(10**6)})

    def observe(self, role: str, turn: int) -> str:
        lines = [f"#{self.problem.data['number']} {role}: write {self.problem.data['letter']}"]
        lines += [f"{r}@{t}: {a}" for t, r, a in self.history]
        return "\n".join(lines)

    def act(self, role: str, turn: int, action: str) -> ActionResult:
        letter = self.problem.data["letter"]
        score = action.count(letter) / len(action) if action else 0.0
        self.scores.append(score)
        team = sum(self.scores) / len(self.scores)
        return ActionResult(team=team, local=score, components={"letter_fraction": score})

    @property
    def success(self) -> bool:
        threshold = self.params.success_threshold
        return bool(self.scores) and sum(self.scores) / len(self.scores) >= threshold

    def team_value(self) -> float:
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    @property
    def done(self) -> bool:
        return False  # the episode always runs its T turns

    def render(self) -> str:
        return f"scores={[round(s, 3) for s in self.scores]}"
