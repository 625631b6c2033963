"""What a run's held-out evaluations support, paired on the same problems (mas_lab/analysis/paired.py).

A run's summary, `mas-lab eval`, `compare` and the study report compare success rates measured on
one seeded set of held-out problems. This module reads a run store's per-problem outcomes and
pairs them: the evaluation after training against the one before, against each baseline without
a model (the best constant answer and the reading rules, replayed on the same problems). Runs of two
arms against each other: `mas_lab.paired_runs` (notebook.py), the study report and `compare`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from mas_lab.analysis.paired import Verdict, compare_paired
from mas_lab.envs import ENVS
from mas_lab.training.baselines import RuleResults, answer_turns, baseline_outcomes, rule_results, task_pool

if TYPE_CHECKING:
    from mas_lab.config import TaskConfig
    from mas_lab.envs.base import Problem
    from mas_lab.records.store import RunStore


@dataclass(frozen=True)
class HeldOut:
    """A task's held-out problems: the evaluation set and the hard split (the extra hard problems
    when the task has them, else the hard members of the evaluation set)."""

    main: tuple[Problem, ...]
    hard: tuple[Problem, ...]

    @classmethod
    def of(cls, task: TaskConfig) -> HeldOut:
        pool = task_pool(task)
        rules = (
            None if pool.hard_set else rule_results(ENVS[task.env.name], pool.params, pool.eval_set, answer_turns(task))
        )
        return cls.from_pool(pool.eval_set, pool.hard_set, rules)

    @classmethod
    def from_pool(cls, main: Sequence[Problem], hard_set: Sequence[Problem], rules: RuleResults | None) -> HeldOut:
        """The extra hard problems when there are any, else the members of `main` the rules'
        hard rule fails on (`rules`: RuleResults whose first len(main) outcomes are `main`'s)."""
        if hard_set or rules is None:
            return cls(tuple(main), tuple(hard_set))
        return cls(tuple(main), tuple(p for p, h in zip(main, rules.hard) if h))


def outcomes_of(store: RunStore, step: int, problems: Sequence[Problem]) -> list[bool] | None:
    """The team's success on each of `problems` at the evaluation of `step`, or None where that
    evaluation did not hold every one of them (a different problem set)."""
    found = store.eval_outcomes(step)
    if not problems or any(p.id not in found for p in problems):
        return None
    return [found[p.id] for p in problems]


def against_baselines(task: TaskConfig, team: Sequence[bool], problems: Sequence[Problem]) -> dict[str, Verdict]:
    """The team against every baseline without a model on the same problems: {label: verdict}."""
    return {label: compare_paired([(team, solved)]) for label, solved in baseline_outcomes(task, problems).values()}


def run_evidence(
    task: TaskConfig, store: RunStore, after: int, before: int | None = None, held: HeldOut | None = None
) -> dict:
    """The paired comparisons of the evaluation at step `after`: against the one at `before` (the
    change training made), against each baseline on the main split, and on the hard split. Values
    are `Verdict`s; an entry is missing where the evaluation lacks the problems to pair."""
    held = held or HeldOut.of(task)
    out: dict = {"problems": len(held.main), "hard_problems": len(held.hard)}
    team = outcomes_of(store, after, held.main)
    if team is None:
        return out
    if before is not None:
        earlier = outcomes_of(store, before, held.main)
        if earlier is not None:
            out["change"] = compare_paired([(team, earlier)])
    out["baselines"] = against_baselines(task, team, held.main)
    hard_team = outcomes_of(store, after, held.hard)
    if hard_team is not None:
        out["hard"] = against_baselines(task, hard_team, held.hard)
    return out
