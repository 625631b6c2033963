"""Plan-Path: move from S to G on a grid with walls (paper Sec. 5, games / planning).

Tool agent + planner (envs/games.py): the tool's program prints a move list, the planner answers
"Moves: ...", executed on the live state. Problems come from a seeded generator and are solvable
by construction: the goal is chosen among cells that breadth-first search reaches from the start,
and the shortest-path length is stored.

Team reward: 1 at the goal, else 0.5 * progress, progress = (d0 - d) / d0 in BFS distance. A
plan is walked to its end (passing through G is not arriving) and only when every move is legal.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import deque
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from mas_lab.envs.base import ActionResult, Problem
from mas_lab.envs.games import DEFAULT_WORKFLOW, GameParams, ToolPlannerEnv

MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
_WORDS = {"UP": "U", "DOWN": "D", "LEFT": "L", "RIGHT": "R"}
_MOVE_TOKEN = re.compile(r"\b(UP|DOWN|LEFT|RIGHT|U|D|L|R)\b", re.IGNORECASE)


def distances(grid: list[str], goal: tuple[int, int]) -> list[list[int]]:
    """BFS distance from every cell to the goal (-1 where unreachable)."""
    rows, cols = len(grid), len(grid[0])
    dist = [[-1] * cols for _ in range(rows)]
    dist[goal[0]][goal[1]] = 0
    queue = deque([goal])
    while queue:
        r, c = queue.popleft()
        for dr, dc in MOVES.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < rows and 0 <= nc < cols and grid[nr][nc] != "#" and dist[nr][nc] < 0:
                dist[nr][nc] = dist[r][c] + 1
                queue.append((nr, nc))
    return dist


def shortest_path(grid: list[str], start: tuple[int, int], goal: tuple[int, int]) -> list[str]:
    """One shortest move list from start to goal (the solver used by tests)."""
    dist = distances(grid, goal)
    path, (r, c) = [], start
    while (r, c) != goal:
        for name, (dr, dc) in MOVES.items():
            nr, nc = r + dr, c + dc
            if 0 <= nr < len(grid) and 0 <= nc < len(grid[0]) and dist[nr][nc] == dist[r][c] - 1 and dist[nr][nc] >= 0:
                path.append(name)
                r, c = nr, nc
                break
    return path


# tool_helper: solver defines this before the tool agent's program (it runs in the sandbox)
PLAN_PATH_SOLVER = """
def solve(grid):
    from collections import deque
    rows = [str(r) for r in grid]
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    starts = [p for p, ch in cells.items() if ch == "S"]
    if not starts:
        return []
    steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    came, queue = {starts[0]: None}, deque(starts[:1])
    while queue:
        here = queue.popleft()
        if cells[here] == "G":
            path = []
            while came[here] is not None:
                here, move = came[here]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in steps.items():
            there = (here[0] + dr, here[1] + dc)
            if cells.get(there, "#") != "#" and there not in came:
                came[there] = (here, move)
                queue.append(there)
    return []
"""

_ANSWER_CHARS = re.compile(r"[A-Za-z\s,.;:\-\[\]'\"*`]*")  # move words, separators, markdown emphasis
_ANSWER_LINE = re.compile(r"moves\s*:(.*)$", re.IGNORECASE | re.MULTILINE)


def parse_answer_moves(text: str) -> list[str] | None:
    """A planner's stated answer: the last line "Moves: ...", holding only moves (U/D/L/R or
    up/down/left/right) and separators. Moves scattered in prose are not an answer (a reply with
    "built-in u import" must not earn the format reward)."""
    lines = _ANSWER_LINE.findall(text)
    if not lines or not _ANSWER_CHARS.fullmatch(lines[-1]):
        return None  # anything but move words and separators (a fullwidth 'Ｕ' was dropped silently)
    words = re.findall(r"[A-Za-z]+", lines[-1])
    if not words or any(w.upper() not in MOVES and w.upper() not in _WORDS for w in words):
        return None
    return [_WORDS.get(w.upper(), w.upper()) for w in words]


def parse_moves(text: str) -> list[str]:
    """Moves from free text: U/D/L/R or up/down/left/right, after the last 'moves:' if present."""
    lowered = text.lower()
    if "moves:" in lowered:
        text = text[lowered.rindex("moves:") + len("moves:") :]
    return [_WORDS.get(m.upper(), m.upper()) for m in _MOVE_TOKEN.findall(text)]


def offset_text(rows: int, cols: int, thing: str = "G", origin: str = "S", letters: bool = True) -> str:
    """Where `thing` lies from `origin` in words (" G is 1 row down and 2 columns right of S."),
    with the move letters of the straight way when `letters` (" G is 1 row down (D) and 2 columns
    right (R R) of S."); empty where they meet. Walls can block the straight way, and the order of
    the moves is the agent's to choose."""
    parts = [
        f"{abs(n)} {unit}{'s' if abs(n) > 1 else ''} {word}"
        + (f" ({' '.join(word[0].upper() * abs(n))})" if letters else "")
        for n, unit, word in (
            (rows, "row", "down" if rows > 0 else "up"),
            (cols, "column", "right" if cols > 0 else "left"),
        )
        if n
    ]
    return f" {thing} is {' and '.join(parts)} of {origin}." if parts else ""


def straight_moves(rows: int, cols: int, rows_first: bool = True) -> list[str]:
    """The straight way's letters for an offset: the vertical moves then the horizontal ones (or
    the other order)."""
    vertical = ["D" if rows > 0 else "U"] * abs(rows)
    horizontal = ["R" if cols > 0 else "L"] * abs(cols)
    return vertical + horizontal if rows_first else horizontal + vertical


Hint = Literal["none", "offsets", "letters"]
ToolHelper = Literal["none", "solver"]
TOOL_HELPER_DESCRIPTION = (
    "none: the tool agent's program has only the standard library (the paper's setting, where the "
    "tool agent writes its own search); solver: a function solve(grid) is defined before its "
    "program, taking the grid as the list of its rows as drawn in the observation and returning "
    "the moves of a shortest solution; the agent must copy the grid into the call (mas-lab's "
    "CPU-scale stand-in for a tool agent that writes a BFS)"
)
HINT_DESCRIPTION = (
    "what the observation says beyond the grid and the coordinates: none (the paper's observation), "
    "offsets (where the goal lies, in words, and a worked example that turns words into moves), "
    "letters (the offsets with the straight way's move letters spelled out, as every run before this "
    "option had: reading them is most of the answer)"
)


class MovesGame(ToolPlannerEnv):
    """The games played by moving (Plan-Path, Sokoban): answers are move lists, "Moves: ..." for
    the planner and a printed list for the tool agent."""

    @classmethod
    def move_answers(cls, longest: int = 4) -> list[str]:
        """Every "Moves: ..." answer of 1 to `longest` moves."""
        return ["Moves: " + " ".join(m) for k in range(1, longest + 1) for m in itertools.product("UDLR", repeat=k)]

    @classmethod
    def constant_answers(cls, params: Any) -> list[str]:
        return cls.move_answers(4)

    has_format_demos = True
    params: "MovesParams"

    # The system prompts' examples, by hint. `none` shows only the form of an answer (the paper's
    # observation gives no offsets to compute it from); `offsets` and `letters` show how an answer is
    # read from the stated offset. Every example's answer is one the constant-answer baseline tries,
    # so copying it is measured, not rewarded.
    answer_examples: dict[str, str] = {}
    program_examples: dict[str, str] = {}

    @property
    def answer_example(self) -> str:
        return self.answer_examples.get(self.params.hint, "")

    @property
    def program_example(self) -> str:
        if self.params.tool_helper == "solver":
            return self.solver_example
        return self.program_examples.get(self.params.hint, "")

    solver_source = ""  # the solve(grid) of tool_helper: solver, for this game's grid
    solver_example = ""  # how the tool's system prompt shows a call to it

    @property
    def tool_library(self) -> str:
        return self.solver_source if self.params.tool_helper == "solver" else ""

    def demo_grid(self, rng: random.Random) -> list[str]:
        """A random grid of this game's size and symbols, for the tool's format warm-up with
        `tool_demo: random` (never the problem's: the warm-up teaches the form of a call only)."""
        raise NotImplementedError

    def drawn_grid(self) -> list[str]:
        """The grid's rows exactly as the observation draws them (what solve(grid) takes)."""
        raise NotImplementedError

    # --- the plans of the reading rules (baselines.py): what a few lines of code answer -------------
    def straight_plan(self, rows_first: bool = True) -> list[str]:
        """The straight way to the goal from the current state, vertical moves first (or last)."""
        raise NotImplementedError

    def toward_move(self) -> list[str]:
        """One legal move toward the goal from the current state: the first move of the straight
        way's two orders (vertical first) that is legal; [] when there is none."""
        for rows_first in (True, False):
            plan = self.straight_plan(rows_first)
            if plan and self.legal(plan[:1]):
                return plan[:1]
        return []

    def optimal_plan(self) -> list[str] | None:
        """A shortest plan that solves the problem from the current state (breadth-first search)."""
        raise NotImplementedError

    def legal(self, moves: list[str]) -> bool:
        """Whether every move of `moves` is legal from the current state (nothing changes)."""
        return self.clone().apply(moves)

    # the longest reply walked move by move, in moves per cell (as all-or-nothing's walk limit)
    MOVES_PER_CELL = 4
    moves_taken = 0  # moves applied in the episode so far (the paper's optimality bonus compares them)

    def potential(self) -> float:
        """The paper reward's potential of the current state: minus the distance to the goal in
        units of the start's (0 at the goal, -1 at the start)."""
        raise NotImplementedError

    def optimal_moves(self) -> int:
        """The length of a shortest plan from the problem's start."""
        raise NotImplementedError

    def apply_each(self, moves: list[str]) -> int:
        """Move-by-move execution (`execution: move_by_move`, the paper's environment): each move
        applied in order where it is legal, skipped where it is not; returns how many were skipped.
        A reply longer than MOVES_PER_CELL moves per cell counts its excess as skipped (padding
        never pays). Passing through the goal is not arriving: the state is where the walk ends."""
        limit = self.MOVES_PER_CELL * len(self.drawn_grid()) * len(self.drawn_grid()[0])
        skipped = max(0, len(moves) - limit)
        for move in moves[:limit]:
            if not self.apply([move]):
                skipped += 1
        return skipped

    def execute(self, answer: list[str]) -> None:
        if self.params.execution == "move_by_move":
            self.apply_each(answer)
        else:
            self.apply(answer)

    def act(self, role: str, turn: int, action: str) -> ActionResult:
        spec = self.spec(role) if role != self.single_role else None
        if self.params.execution == "all_or_nothing" or (spec is not None and spec.kind_at(turn) == "program"):
            return super().act(role, turn, action)
        answer = self.parse_answer(action)
        before = self.potential()
        skipped = self.apply_each(answer) if answer is not None else 0
        self.moves_taken += len(answer or []) - skipped
        value = self.value()
        self.replies[role] = (action, "")
        components = {"format": float(answer is not None), "value": value, "illegal_moves": float(skipped)}
        penalty = self.params.illegal_penalty * skipped
        if self.params.reward == "paper":  # the paper's environment: shaping, goal and optimality bonuses
            components["shaping"] = self.potential() - before  # telescoped over the applied moves
            components["goal"] = float(self.success)
            components["optimal"] = float(self.success and self.moves_taken == self.optimal_moves())
            local = components["shaping"] + components["goal"] + 0.5 * components["optimal"] - penalty
        else:
            weights = (spec or DEFAULT_WORKFLOW[1]).weights_at(turn)
            local = sum(weights[k] * components[k] for k in weights) - penalty
        return ActionResult(team=value, local=local, components=components, info=f"answer={answer!r} skipped={skipped}")

    def format_demo(self, role: str, rng: random.Random, turn: int = 0) -> str:
        """One to three random moves in the role's format: a program printing them, or the
        "Moves:" line; with tool_helper: solver, the tool's demonstration calls solve() on a random
        grid, or (`tool_demo: observed`) on the problem's grid as drawn: a demonstration of copying
        the observation into the call, never of the moves (the planner's demonstration stays random)."""
        moves = [rng.choice("UDLR") for _ in range(rng.randint(1, 3))]
        spec = self.spec(role) if role != self.single_role else None
        program = spec is not None and spec.kind_at(turn) == "program"
        if program and self.params.tool_helper == "solver":
            grid = self.drawn_grid() if self.params.tool_demo == "observed" else self.demo_grid(rng)
            return "```python\nprint(solve(" + repr(grid) + "))\n```"
        if program:
            return "```python\nprint(" + repr(moves) + ")\n```"
        return "Moves: " + " ".join(moves)

    def parse(self, text: str) -> list[str] | None:
        return parse_moves(text) or None

    def parse_answer(self, text: str) -> list[str] | None:
        return parse_answer_moves(text)


class MovesParams(GameParams):
    hint: Hint = Field("none", description=HINT_DESCRIPTION)
    execution: Literal["all_or_nothing", "move_by_move"] = Field(
        "all_or_nothing",
        description="how an answer's moves act on the state: all_or_nothing (a reply with any illegal move "
        "is rejected whole and the state stays: every run before this option) or move_by_move (the "
        "paper's environment: legal moves are applied in order, each illegal one is skipped and costs "
        "illegal_penalty; the answer's format part then pays for a parsed reply, not for a legal one)",
    )
    illegal_penalty: float = Field(
        0.1,
        ge=0.0,
        le=10.0,
        description="move_by_move: subtracted from the answering role's local reward for each skipped "
        "(illegal) move (the paper's -0.1)",
    )
    reward: Literal["shaped", "paper"] = Field(
        "shaped",
        description="the answering role's local reward: shaped (0.2 format + 0.8 value, every run before this "
        "option) or paper (needs execution: move_by_move; the paper's environment: per-move potential "
        "shaping, the change in the normalised distance to the goal summed over the applied moves, +1 on "
        "reaching the goal, +0.5 more when the episode's moves so far are a shortest plan, minus the "
        "illegal-move penalty)",
    )

    @model_validator(mode="after")
    def _paper_reward_walks_move_by_move(self) -> "MovesParams":
        if self.reward == "paper" and self.execution != "move_by_move":
            raise ValueError("reward: paper shapes each applied move: it needs execution: move_by_move")
        return self

    tool_helper: ToolHelper = Field("none", description=TOOL_HELPER_DESCRIPTION)
    tool_demo: Literal["random", "observed"] = Field(
        "random",
        description="with tool_helper: solver, what grid the tool agent's format warm-up passes to "
        "solve(): random (a random grid: only the form of a call) or observed (the problem's grid as "
        "drawn: the warm-up also demonstrates copying it; the moves are never shown)",
    )


class PlanPathParams(MovesParams):
    size: int = Field(5, ge=2, le=32, description="grid side length")
    wall_prob: float = Field(0.2, ge=0.0, le=0.9, description="probability that a cell is a wall")
    min_distance: int = Field(2, ge=1, description="least BFS distance from start to goal")
    max_distance: Optional[int] = Field(
        None, ge=1, description="most BFS distance from start to goal (default: no limit)"
    )

    @model_validator(mode="after")
    def _distance_range(self) -> "PlanPathParams":
        if self.max_distance is not None and self.max_distance < self.min_distance:
            raise ValueError(f"max_distance ({self.max_distance}) must be at least min_distance ({self.min_distance})")
        return self


class PlanPathEnv(MovesGame):
    Params = PlanPathParams
    params: PlanPathParams
    # no legal answer in either hint: a model that echoes the prompt's example must not score
    # (trained SmolLM2 teams collapsed onto an example "Moves: R D ..." that solved 10/64 problems)
    program_hint = "prints the list of moves from S to G as a Python list of the letters 'U', 'D', 'L', 'R'"
    answer_hint = "End with one line 'Moves:' followed by your moves, one letter each (U, D, L or R)."
    answer_examples = {
        "none": " Example of the last line: Moves: U U R",
        "offsets": " Example: if G is 2 rows up and 1 column right of S and no wall is in the way, the last line is: "
        "Moves: U U R",
        "letters": " Example: if G is 2 rows up (U U) and 1 column right (R) of S and no wall is in the way,"
        " the last line is: Moves: U U R",
    }
    program_examples = {
        "none": " Example of the form: print(['U', 'U', 'R'])",
        "offsets": " Example: if G is 2 rows up and 1 column right of S, the program is print(['U', 'U', 'R'])",
        "letters": " Example: if G is 2 rows up (U U) and 1 column right (R) of S, the program is "
        "print(['U', 'U', 'R'])",
    }
    shared = ToolPlannerEnv.shared + ("_dist",)  # BFS distances depend only on the problem
    solver_example = (
        " A function solve(grid) is defined for your program: it returns the moves of a shortest way "
        "from S to G on a grid given as the list of its rows, e.g. print(solve(['S.#', '...', '#.G']))"
    )
    solver_source = PLAN_PATH_SOLVER

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.pos: tuple[int, int] = tuple(problem.data["start"])
        self._dist = distances(problem.data["grid"], tuple(problem.data["goal"]))

    @classmethod
    def _draw(cls, rng: random.Random, params: PlanPathParams, split: str) -> Problem:
        size, wall_prob, min_dist = params.size, params.wall_prob, params.min_distance
        max_dist = params.max_distance or size * size
        for _ in range(1000):
            cells = [["#" if rng.random() < wall_prob else "." for _ in range(size)] for _ in range(size)]
            start = (rng.randrange(size), rng.randrange(size))
            cells[start[0]][start[1]] = "."
            grid = ["".join(row) for row in cells]
            dist = distances(grid, start)  # symmetric: distance from start
            reachable = [(r, c) for r in range(size) for c in range(size) if min_dist <= dist[r][c] <= max_dist]
            if reachable:
                goal = rng.choice(reachable)
                return Problem(
                    {"grid": grid, "start": list(start), "goal": list(goal), "shortest": dist[goal[0]][goal[1]]}
                )
        raise ValueError(
            f"plan_path: no solvable grid with size={size}, wall_prob={wall_prob}, distance {min_dist}-{max_dist}"
        )

    @property
    def goal(self) -> tuple[int, int]:
        return tuple(self.problem.data["goal"])

    def value_at(self, pos: tuple[int, int]) -> float:
        """Team reward of a position: 1 at the goal, else half the fraction of distance covered."""
        if pos == self.goal:
            return 1.0
        d0 = self.problem.data["shortest"]
        return 0.5 * max(0.0, (d0 - self._dist[pos[0]][pos[1]]) / d0)

    def value(self) -> float:
        return self.value_at(self.pos)

    def potential(self) -> float:
        d = self._dist[self.pos[0]][self.pos[1]]
        return -d / self.problem.data["shortest"] if d >= 0 else -1.0

    def optimal_moves(self) -> int:
        return int(self.problem.data["shortest"])

    def follow(self, pos: tuple[int, int], moves: list[str]) -> tuple[tuple[int, int], bool]:
        """Apply moves from pos until one is illegal; (end, all legal). The whole plan is walked:
        passing through G on the way is not arriving (else one fixed sweep of the grid would solve
        most problems without reading them; tests/test_reward_hacks.py)."""
        grid = self.problem.data["grid"]
        limit = 4 * len(grid) * len(grid[0])
        for move in moves[:limit]:
            dr, dc = MOVES[move]
            r, c = pos[0] + dr, pos[1] + dc
            if not (0 <= r < len(grid) and 0 <= c < len(grid[0])) or grid[r][c] == "#":
                return pos, False
            pos = (r, c)
        return pos, len(moves) <= limit

    def apply(self, moves: list[str]) -> bool:
        """All or nothing: a plan with an illegal move is rejected and S stays where it was (else
        a fixed plan could use walls and the border as stops and reach G from many starts)."""
        end, legal = self.follow(self.pos, moves)
        if legal:
            self.pos = end
        return legal

    def drawn_grid(self) -> list[str]:
        grid = [list(row) for row in self.problem.data["grid"]]
        grid[self.goal[0]][self.goal[1]] = "G"
        grid[self.pos[0]][self.pos[1]] = "S"
        return ["".join(row) for row in grid]

    def task_text(self) -> str:
        grid = self.drawn_grid()
        gr, gc = self.goal
        rows = "\n".join(grid)
        hint = self.params.hint
        offset = "" if hint == "none" else offset_text(gr - self.pos[0], gc - self.pos[1], letters=hint == "letters")
        return (
            f"Grid ({len(grid)}x{len(grid[0])}, '#' wall, '.' free, row 0 at the top):\n{rows}\n"
            f"S (you) is at row {self.pos[0]}, col {self.pos[1]}; G is at row {gr}, col {gc}."
            f"{offset}\n"
            "Moves: U (row-1), D (row+1), L (col-1), R (col+1)."
        )

    def straight_plan(self, rows_first: bool = True) -> list[str]:
        return straight_moves(self.goal[0] - self.pos[0], self.goal[1] - self.pos[1], rows_first)

    def optimal_plan(self) -> list[str] | None:
        return (
            shortest_path(self.problem.data["grid"], self.pos, self.goal)
            if self._dist[self.pos[0]][self.pos[1]] >= 0
            else None
        )

    def render(self) -> str:
        grid = [list(row) for row in self.problem.data["grid"]]
        grid[self.goal[0]][self.goal[1]] = "G"
        grid[self.pos[0]][self.pos[1]] = "A"
        return "\n".join("".join(row) for row in grid)

    def demo_grid(self, rng: random.Random) -> list[str]:
        size = self.params.size
        cells = [["#" if rng.random() < self.params.wall_prob else "." for _ in range(size)] for _ in range(size)]
        start, goal = rng.sample([(r, c) for r in range(size) for c in range(size)], 2)
        cells[start[0]][start[1]], cells[goal[0]][goal[1]] = "S", "G"
        return ["".join(row) for row in cells]
