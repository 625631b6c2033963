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
from typing import Any

from pydantic import Field

from mas_lab.envs.base import Problem
from mas_lab.envs.games import GameParams, ToolPlannerEnv

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


_ANSWER_LINE = re.compile(r"moves\s*:(.*)$", re.IGNORECASE | re.MULTILINE)


def parse_answer_moves(text: str) -> list[str] | None:
    """A planner's stated answer: the last line "Moves: ...", holding only moves (U/D/L/R or
    up/down/left/right) and separators. Moves scattered in prose are not an answer (a reply with
    "built-in u import" must not earn the format reward)."""
    lines = _ANSWER_LINE.findall(text)
    if not lines:
        return None
    words = re.findall(r"[A-Za-z]+", lines[-1])
    if not words or any(w.upper() not in MOVES and w.upper() not in _WORDS for w in words):
        return None
    return [_WORDS.get(w.upper(), w.upper()) for w in words]


def parse_moves(text: str) -> list[str]:
    """Moves from free text: U/D/L/R or up/down/left/right, after the last 'moves:' if present."""
    lowered = text.lower()
    if "moves:" in lowered:
        text = text[lowered.rindex("moves:") + len("moves:"):]
    return [_WORDS.get(m.upper(), m.upper()) for m in _MOVE_TOKEN.findall(text)]




def offset_text(rows: int, cols: int, thing: str = "G", origin: str = "S") -> str:
    """Where `thing` lies from `origin` in words, with the move letters of the straight way
    (" G is 1 row down (D) and 2 columns right (R R) of S."); empty where they meet. Walls can
    block the straight way, and the order of the moves is the agent's to choose."""
    parts = [f"{abs(n)} {unit}{'s' if abs(n) > 1 else ''} {word} ({' '.join(word[0].upper() * abs(n))})"
             for n, unit, word in ((rows, "row", "down" if rows > 0 else "up"),
                                   (cols, "column", "right" if cols > 0 else "left")) if n]
    return f" {thing} is {' and '.join(parts)} of {origin}." if parts else ""


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

    def format_demo(self, role: str, rng: random.Random) -> str:
        """One to three random moves in the role's format: a program printing them, or the
        "Moves:" line."""
        moves = [rng.choice("UDLR") for _ in range(rng.randint(1, 3))]
        if role == "tool":
            return "```python\nprint(" + repr(moves) + ")\n```"
        return "Moves: " + " ".join(moves)

    def parse(self, text: str) -> list[str] | None:
        return parse_moves(text) or None

    def parse_answer(self, text: str) -> list[str] | None:
        return parse_answer_moves(text)


class PlanPathParams(GameParams):
    size: int = Field(5, ge=2, le=32, description="grid side length")
    wall_prob: float = Field(0.2, ge=0.0, le=0.9, description="probability that a cell is a wall")
    min_distance: int = Field(2, ge=1, description="least BFS distance from start to goal")


class PlanPathEnv(MovesGame):
    Params = PlanPathParams
    # no legal answer in either hint: a model that echoes the prompt's example must not score
    # (trained SmolLM2 teams collapsed onto an example "Moves: R D ..." that solved 10/64 problems)
    program_hint = "prints the list of moves from S to G as a Python list of the letters 'U', 'D', 'L', 'R'"
    answer_hint = "End with one line 'Moves:' followed by your moves, one letter each (U, D, L or R)."
    # a worked example (fair for a 135M model, issue 12): it shows reading G's place from S, and its
    # answer is one the constant-answer baseline tries, so copying it is measured, not rewarded
    answer_example = (" Example: if G is 2 rows up (U U) and 1 column right (R) of S and no wall is in the way,"
                      " the last line is: Moves: U U R")
    program_example = " Example: if G is 2 rows up (U U) and 1 column right (R) of S, the program is print(['U', 'U', 'R'])"
    shared = ToolPlannerEnv.shared + ("_dist",)  # BFS distances depend only on the problem

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.pos: tuple[int, int] = tuple(problem.data["start"])
        self._dist = distances(problem.data["grid"], tuple(problem.data["goal"]))

    @classmethod
    def _draw(cls, rng: random.Random, params: PlanPathParams, split: str) -> Problem:
        size, wall_prob, min_dist = params.size, params.wall_prob, params.min_distance
        for _ in range(1000):
            cells = [["#" if rng.random() < wall_prob else "." for _ in range(size)] for _ in range(size)]
            start = (rng.randrange(size), rng.randrange(size))
            cells[start[0]][start[1]] = "."
            grid = ["".join(row) for row in cells]
            dist = distances(grid, start)  # symmetric: distance from start
            reachable = [(r, c) for r in range(size) for c in range(size) if dist[r][c] >= min_dist]
            if reachable:
                goal = rng.choice(reachable)
                return Problem({"grid": grid, "start": list(start), "goal": list(goal), "shortest": dist[goal[0]][goal[1]]})
        raise ValueError(f"plan_path: no solvable grid with size={size}, wall_prob={wall_prob}")

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

    def task_text(self) -> str:
        grid = [list(row) for row in self.problem.data["grid"]]
        gr, gc = self.goal
        grid[gr][gc] = "G"
        grid[self.pos[0]][self.pos[1]] = "S"
        rows = "\n".join("".join(row) for row in grid)
        return (
            f"Grid ({len(grid)}x{len(grid[0])}, '#' wall, '.' free, row 0 at the top):\n{rows}\n"
            f"S (you) is at row {self.pos[0]}, col {self.pos[1]}; G is at row {gr}, col {gc}."
            f"{offset_text(gr - self.pos[0], gc - self.pos[1])}\n"
            "Moves: U (row-1), D (row+1), L (col-1), R (col+1)."
        )

    def render(self) -> str:
        grid = [list(row) for row in self.problem.data["grid"]]
        grid[self.goal[0]][self.goal[1]] = "G"
        grid[self.pos[0]][self.pos[1]] = "A"
        return "\n".join("".join(row) for row in grid)
