"""A tiny two-role toy environment for tests and the learning check.

Each problem names a letter; both roles, in turn order, answer with text, and the reward is the
fraction of the answer's characters that are that letter. A tiny random model learns it within
a minute, and a scripted fake engine can drive every invariant of Algorithm 1 through it.
"""
from __future__ import annotations

import random
from typing import Any

from mas_lab.envs.base import Env, Problem, StepResult


class ToyEnv(Env):
    roles = ("first", "second")

    def __init__(self, problem: Problem, params: dict[str, Any]):
        super().__init__(problem, params)
        self.scores: list[float] = []

    @classmethod
    def generate(cls, rng: random.Random, params: dict[str, Any], split: str = "train") -> Problem:
        letters = str(params.get("letters", "a"))
        return Problem({"letter": rng.choice(letters), "number": rng.randrange(10**6)})

    def observe(self, role: str, turn: int) -> str:
        lines = [f"#{self.problem.data['number']} {role}: write {self.problem.data['letter']}"]
        lines += [f"{r}@{t}: {a}" for t, r, a in self.history]
        return "\n".join(lines)

    def act(self, role: str, turn: int, action: str) -> StepResult:
        letter = self.problem.data["letter"]
        score = action.count(letter) / len(action) if action else 0.0
        self.scores.append(score)
        team = sum(self.scores) / len(self.scores)
        return StepResult(team=team, local=score, components={"letter_fraction": score})

    @property
    def success(self) -> bool:
        threshold = float(self.params.get("success_threshold", 0.9))
        return bool(self.scores) and sum(self.scores) / len(self.scores) >= threshold

    @property
    def done(self) -> bool:
        return False  # the episode always runs its T turns

    def render(self) -> str:
        return f"scores={[round(s, 3) for s in self.scores]}"
