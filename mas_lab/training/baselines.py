"""Baselines without a model: the constant answer, and the reading rules of the move games and Sudoku.

A policy under RL can raise its success without reading the problem: it can learn one fixed
answer that happens to solve some problems (the SmolLM2 teams of docs/results.md collapsed onto the
prompt's example "Moves: R D", which solved 10 of 64 held-out Plan-Path problems). A lift counts
as learning to solve the task only where it beats the best such answer. An environment lists the
fixed replies worth trying (`Env.constant_answers`); the baseline plays each of them as the
answering role's reply on every turn of every evaluation problem, without a model, and keeps the
best. Other roles are left out: in the games a constant tool program only changes what the
answering role reads, and a constant answer does not read.

A team that reads the observation but does not plan is bounded by the reading rules: a few lines
of code that read the state and answer (the straight way to the goal rows first, or in the other
order when that is blocked, or one legal move toward the goal per turn), and the breadth-first
optimum. The problems the either-order rule does not solve (a detour is needed) form the hard
split, reported on its own: a team above the rules there has learned to plan, not to read. Sudoku's
reading rule fills the blanks its row, column and box force, again and again (no search); it has no
hard split.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from mas_lab.envs import ENVS, ProblemPool
from mas_lab.envs.base import Env, EnvParams, Problem
from mas_lab.envs.sudoku import SudokuEnv, allowed_digits

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


def best_constant(
    env_cls: type[Env], params: EnvParams, problems: Sequence[Problem], max_turns: int
) -> ConstantBaseline | None:
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
    return best_constant(env_cls, env_cls.Params.coerce(task.env.params), problems, answer_turns(task))


# --- reading rules: what a few lines of code that read the state (no model) solve ---------------------
@dataclass(frozen=True)
class Rule:
    """A baseline that reads the state and answers without a model: `plan(env)` gives the items it
    answers on a turn (moves, or a grid's rows; None: it has no answer)."""

    name: str
    label: str  # how the verdict names it
    row: str  # how a results table names it ("": not a row of its own)
    plan: Callable[[Any], "list[str] | None"]


@dataclass(frozen=True)
class RuleSet:
    """An environment's reading rules, how a plan becomes the answering role's reply, and the rule
    whose failures form the hard split (None: the environment has no hard split)."""

    rules: tuple[Rule, ...]
    reply: Callable[[list[str]], str]
    hard: str | None = None


def _either_order(env: Any) -> list[str]:
    rows_first = env.straight_plan(True)
    return rows_first if env.legal(rows_first) else env.straight_plan(False)


# In the order of the issue that asked for them: each reads more than the one before, except the
# optimum, which searches. The hard split is the problems `either_order` leaves unsolved.
MOVE_RULES = RuleSet(
    (
        Rule(
            "rows_first",
            "the rows-first reading rule (the straight way in one answer, vertical moves first)",
            "reading rule, rows first (no model)",
            lambda env: env.straight_plan(True),
        ),
        Rule(
            "either_order",
            "the either-order reading rule (the straight way, columns first when rows first is blocked)",
            "reading rule, either order (no model)",
            _either_order,
        ),
        Rule(
            "one_step",
            "one legal move toward the goal per turn",
            "one move toward the goal a turn (no model)",
            lambda env: env.toward_move(),
        ),
        Rule(
            "tool_first",
            "the tool's first move each turn (the first move of a shortest plan, what solve() prints)",
            "the tool's first move a turn (no model)",
            lambda env: (env.optimal_plan() or [])[:1],
        ),
        # the BFS optimum: what applying solve()'s whole output does; its move count is a table's note
        Rule("optimum", "the BFS optimum", "apply solve(): the BFS optimum (no model)", lambda env: env.optimal_plan()),
    ),
    reply=lambda moves: "Moves: " + " ".join(moves),
    hard="either_order",
)


def single_candidates(puzzle: list[list[int]]) -> list[list[int]]:
    """Sudoku's reading rule: fill every blank whose row, column and box leave one digit, again
    until none is left with one; then each remaining blank takes the smallest digit still allowed
    there (1 where none is), so the reply is a whole grid. No search, no backtracking."""
    grid = [row[:] for row in puzzle]
    forced = True
    while forced:
        forced = False
        for r, row in enumerate(grid):
            for c, v in enumerate(row):
                if v == 0 and len(options := allowed_digits(grid, r, c)) == 1:
                    grid[r][c] = options.pop()
                    forced = True
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if v == 0:
                grid[r][c] = min(allowed_digits(grid, r, c), default=1)
    return grid


SUDOKU_RULES = RuleSet(
    (
        Rule(
            "single_candidates",
            "the single-candidate rule (fill each blank its row, column and box allow one digit, repeated)",
            "single-candidate rule (no model)",
            lambda env: [" ".join(map(str, row)) for row in single_candidates(env.problem.data["puzzle"])],
        ),
    ),
    reply=lambda rows: "Grid:\n" + "\n".join(rows),
)
RULE_SETS = (MOVE_RULES, SUDOKU_RULES)
RULE_LABELS = {rule.name: rule.label.split(" (")[0] for rules in RULE_SETS for rule in rules.rules}  # verdicts
RULE_ROWS = {rule.name: rule.row for rules in RULE_SETS for rule in rules.rules if rule.row}  # results tables
# rows a results table shows only for a task whose tool agent may call a helper (tool_helper: solver):
# the controls that say what the helper alone does (the claims issue)
HELPER_ROWS = ("tool_first", "optimum")


def rules_of(env_cls: type[Env]) -> RuleSet | None:
    """The reading rules of an environment: the move games' (they draw a straight way), Sudoku's, or none."""
    if hasattr(env_cls, "straight_plan"):
        return MOVE_RULES
    if issubclass(env_cls, SudokuEnv):
        return SUDOKU_RULES
    return None


def play_rule(env_cls: type[Env], problem: Problem, params: EnvParams, rule: Rule, max_turns: int) -> tuple[bool, int]:
    """Play `rule` as the answering role on every turn of `problem`, in the reply form of the
    environment's rule set: (solved, items answered)."""
    rules = rules_of(env_cls)
    if rules is None:
        raise ValueError(f"env '{env_cls.__name__}' has no reading rules")
    env = env_cls(problem, params)
    moves = 0
    for turn in range(max_turns):
        plan = rule.plan(env)
        if not plan:
            break
        moves += len(plan)
        env.step(env_cls.answer_role, turn, rules.reply(plan))
        if env.done:
            break
    return env.success, moves


@dataclass(frozen=True)
class RuleResults:
    """Each rule's outcome on each problem of a set, in the set's order, and the rule whose
    failures form the hard split (None: no hard split)."""

    solved: dict[str, list[bool]]
    moves: dict[str, list[int]]
    hard_rule: str | None

    @property
    def hard(self) -> list[bool]:
        """Which problems the hard split holds: those the hard rule (the move games' either-order
        reading rule) does not solve; none where the environment has no hard rule."""
        if self.hard_rule is None:
            return [False] * len(next(iter(self.solved.values()), []))
        return [not s for s in self.solved[self.hard_rule]]


def rule_results(
    env_cls: type[Env], params: EnvParams, problems: Sequence[Problem], max_turns: int
) -> RuleResults | None:
    """Every reading rule on every problem, or None for an environment without them."""
    rules = rules_of(env_cls)
    if rules is None:
        return None
    solved: dict[str, list[bool]] = {}
    moves: dict[str, list[int]] = {}
    for rule in rules.rules:
        outcomes = [play_rule(env_cls, p, params, rule, max_turns) for p in problems]
        solved[rule.name] = [s for s, _ in outcomes]
        moves[rule.name] = [m for _, m in outcomes]
    return RuleResults(solved, moves, rules.hard)


def is_hard(env_cls: type[Env], params: EnvParams, problem: Problem, max_turns: int) -> bool:
    """Whether `problem` belongs to the hard split (the hard rule, the either-order reading rule of
    the move games, fails on it)."""
    rules = rules_of(env_cls)
    if rules is None or rules.hard is None:
        raise ValueError(f"env '{env_cls.__name__}' has no reading rule that defines a hard split")
    rule = next(r for r in rules.rules if r.name == rules.hard)
    return not play_rule(env_cls, problem, params, rule, max_turns)[0]


def answer_turns(task: "TaskConfig") -> int:
    """The turns of the task whose answers a rule or a constant answer plays: max_turns, or half of
    them where the answering agent writes a program first (Env.answer_turns), so that a single
    agent with the tool meets the rules, and the hard split, of the team's two answer turns."""
    env_cls = ENVS[task.env.name]
    return env_cls.answer_turns(env_cls.Params.coerce(task.env.params), task.env.max_turns)


def task_pool(task: "TaskConfig") -> ProblemPool:
    """A task's problems: training draws, the held-out evaluation set and, with
    train.hard_eval_problems, the extra hard split (held-out problems the either-order reading rule
    does not solve). Raises ValueError when the environment's parameters cannot make them."""
    env_cls = ENVS[task.env.name]
    params = env_cls.Params.coerce(task.env.params)
    hard = None
    if task.train.hard_eval_problems:
        hard = functools.partial(is_hard, env_cls, params, max_turns=answer_turns(task))
    return ProblemPool(
        env_cls, params, task.train.seed, task.train.eval_problems, hard=hard, hard_size=task.train.hard_eval_problems
    )


def baseline_outcomes(task: "TaskConfig", problems: Sequence[Problem]) -> dict[str, tuple[str, list[bool]]]:
    """Per problem, whether each baseline without a model solves it, for paired comparisons on the
    same problems (mas_lab/analysis/paired.py): {name: (label, solved per problem)}, the best constant answer
    (chosen on `problems`) first, then each reading rule of the environment."""
    env_cls = ENVS[task.env.name]
    params = env_cls.Params.coerce(task.env.params)
    out: dict[str, tuple[str, list[bool]]] = {}
    turns = answer_turns(task)
    best = best_constant(env_cls, params, problems, turns) if problems else None
    if best is not None:
        out["constant"] = (
            f"the best constant answer ({best.answer!r})",
            [solves(env_cls, p, params, best.answer, turns) for p in problems],
        )
    rules = rule_results(env_cls, params, problems, turns)
    helper = getattr(params, "tool_helper", "none") != "none"
    for name, solved in (rules.solved if rules else {}).items():
        if name == "tool_first" and not helper:  # a control of the helper: meaningless without one
            continue
        out[name] = (RULE_LABELS[name], solved)
    return out


# --- reading the observation's own letters (experiments/reading_baseline.py plays them) --------------
SENTENCE = re.compile(r"[^.\n]*\([UDLR](?: [UDLR])*\)[^.\n]*\.")
GROUP = re.compile(r"\(([UDLR](?: [UDLR])*)\)")


def reading_answers(observation: str) -> dict[str, str]:
    """rule -> "Moves: ..." built from the move letters an observation states in parentheses
    (`hint: letters`: "G is 2 rows up (U U) and 1 column right (R) of S."): each sentence's letters
    in the stated order, its two groups swapped, and all sentences' letters together."""
    sentences = [GROUP.findall(s) for s in SENTENCE.findall(observation)]
    rules = {}
    for k, groups in enumerate(sentences, 1):
        rules[f"sentence {k}"] = " ".join(groups)
        if len(groups) == 2:
            rules[f"sentence {k} swapped"] = " ".join(groups[::-1])
    if len(sentences) > 1:
        rules["all sentences"] = " ".join(g for groups in sentences for g in groups)
    return {rule: f"Moves: {letters}" for rule, letters in rules.items() if letters}
