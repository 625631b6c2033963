"""Task families of reasoning-gym (procedural, offline generators, each with its own scorer) as a
mas-lab environment: a tool agent writes a short Python program whose output the solver reads,
then the solver answers; or, with `algorithm.mode: single_agent`, the solver alone.

Problems are drawn from the package's seeded generator (one dataset of one entry per draw, its
seed from the pool's generator), held out by content hash like every generated problem, and scored
by the dataset's own `score_answer` (in [0, 1]; 1 is solved). Team reward: that score of the
solver's answer. Tool local: 0.1 ran + 0.1 printed something + 0.8 * the score of its output's
output as an answer; solver local: 0.2 format ("Answer:" line) + 0.8 * the score. The package
(reasoning-gym, pinned in pyproject.toml) brings no torch; it is imported on first use.
"""

from __future__ import annotations

import functools
import json
import random
import re
from typing import Any

from pydantic import Field, field_validator

from mas_lab.envs.base import ActionResult, Env, EnvParams, Problem
from mas_lab.envs.games import extract_code
from mas_lab.sandbox.isolation import Limits, run_python

_ANSWER = re.compile(r"^\s*answer\s*:", re.IGNORECASE | re.MULTILINE)


class ReasoningGymParams(EnvParams):
    dataset: str = Field(
        "maze",
        description="the reasoning-gym dataset (e.g. maze, mini_sudoku, countdown, "
        "shortest_path; `python -c 'import reasoning_gym; print(reasoning_gym.factory.DATASETS)'`)",
    )
    config: dict[str, Any] = Field(
        default_factory=dict,
        description="the dataset's own settings (its config class's fields, e.g. min_dist for maze)",
    )
    tool_timeout_s: float = Field(3.0, gt=0.0, le=60.0, description="wall-clock limit of one tool program (s)")

    @field_validator("dataset")
    @classmethod
    def _known(cls, name: str) -> str:
        names = available()
        if name not in names:
            raise ValueError(f"unknown reasoning-gym dataset '{name}'; allowed, e.g.: {sorted(names)[:40]}")
        return name


def available() -> set[str]:
    """The dataset names the installed reasoning-gym offers (empty where it is not installed)."""
    try:
        # lazy: reasoning_gym, an optional extra
        from reasoning_gym.factory import DATASETS
    except ImportError:
        return set()
    return set(DATASETS)


@functools.lru_cache(maxsize=4096)
def _dataset(name: str, config: str, seed: int):
    # lazy: reasoning_gym, an optional extra
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=1, seed=seed, **json.loads(config))


def score(problem: Problem, answer: str | None) -> float:
    """The dataset's own score of `answer` for this problem's entry (regenerated from its seed)."""
    data = problem.data
    dataset = _dataset(data["dataset"], json.dumps(data["config"], sort_keys=True), data["seed"])
    return float(dataset.score_answer(answer, dataset[0]))


def stated(text: str) -> str | None:
    """The answer a reply states: what follows its last "Answer:" (a grid may span lines); None
    without one, or when nothing follows it."""
    found = list(_ANSWER.finditer(text or ""))
    if not found:
        return None
    answer = text[found[-1].end() :].strip()
    return answer or None


class ReasoningGymEnv(Env):
    roles = ("tool", "solver")
    answer_role = "solver"
    Params = ReasoningGymParams
    params: ReasoningGymParams
    system_prompts = {
        "tool": "You are the tool agent. Write a short Python program that computes the answer to the task and "
        "prints it. Reply with one ```python code block.",
        "solver": "Solve the task. End with one line 'Answer: ' followed by your answer.",
    }

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.tool_output = ""
        self.answer: str | None = None
        self.score = 0.0

    @classmethod
    def _draw(cls, rng: random.Random, params: ReasoningGymParams, split: str) -> Problem:
        seed = rng.randrange(2**31)
        dataset = _dataset(params.dataset, json.dumps(params.config, sort_keys=True), seed)
        entry = dataset[0]
        return Problem(
            {
                "dataset": params.dataset,
                "config": params.config,
                "seed": seed,
                "question": entry["question"],
                "answer": str(entry["answer"]),
            }
        )

    @classmethod
    def constant_answers(cls, params: EnvParams) -> list[str]:
        """The 20 most frequent answers of 400 training draws: the best of them replied to every
        problem is what an answer that ignores the question scores (baselines.py)."""
        assert isinstance(params, ReasoningGymParams)
        rng = random.Random("constant-answers")
        answers: dict[str, int] = {}
        for _ in range(400):
            answer = cls._draw(rng, params, "train").data["answer"]
            answers[answer] = answers.get(answer, 0) + 1
        common = sorted(answers, key=lambda a: -answers[a])[:20]
        return [f"Answer: {a}" for a in common]

    def observe(self, role: str, turn: int) -> str:
        text = f"Task:\n{self.problem.data['question']}\n"
        if role == "tool":
            return text + "Write the Python program that prints the answer."
        if role == "solver" and self.tool_output:
            text += f"The tool agent's program printed:\n{self.tool_output.strip()[-1000:]}\n"
        if self.answer is not None:
            text += f"Your last answer, {self.answer!r}, was not right.\n"
        return text + "End with one line 'Answer: ' followed by your answer."

    def act(self, role: str, turn: int, action: str) -> ActionResult:
        if role == "tool":
            code = extract_code(action)
            result = run_python(
                code,
                Limits(wall_s=self.params.tool_timeout_s, cpu_s=int(self.params.tool_timeout_s) + 1, output_chars=2000),
            )
            self.tool_output = result.stdout if result.ok else f"[{result.status}] {result.stderr[-300:]}"
            output = result.stdout.strip() if result.ok else ""
            value = score(self.problem, output) if output else 0.0
            ran, printed = float(result.ok), float(bool(output))
            return ActionResult(
                team=self.score,
                local=0.1 * ran + 0.1 * printed + 0.8 * value,
                components={"ran": ran, "printed": printed, "value": value},
                info=f"status={result.status}",
            )
        answer = stated(action)
        self.answer = answer
        self.score = score(self.problem, answer) if answer is not None else 0.0
        fmt = float(answer is not None)
        return ActionResult(
            team=self.score,
            local=0.2 * fmt + 0.8 * self.score,
            components={"format": fmt, "score": self.score},
            info=f"answer={answer!r}",
        )

    @property
    def success(self) -> bool:
        return self.score >= 1.0

    def team_value(self) -> float:
        return self.score

    def render(self) -> str:
        return f"answer={self.answer!r} score={self.score:.2f} (expected {self.problem.data['answer']!r})"
