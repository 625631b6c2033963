"""Plan-Path: move from S to G on a grid with walls (paper Sec. 5, games / planning).

Tool agent + planner (envs/games.py): the tool's program prints a move list, the planner answers
"Moves: ...", executed on the live state. Problems come from a seeded generator and are solvable
by construction: the goal is chosen among cells that breadth-first search reaches from the start,
and the shortest-path length is stored.

Team reward: 1 at the goal, else 0.5 * progress, progress = (d0 - d) / d0 in BFS distance.
"""
from __future__ import annotations

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




class PlanPathParams(GameParams):
    size: int = Field(5, ge=2, le=32, description="grid side length")
    wall_prob: float = Field(0.2, ge=0.0, le=0.9, description="probability that a cell is a wall")
    min_distance: int = Field(2, ge=1, description="least BFS distance from start to goal")


class PlanPathEnv(ToolPlannerEnv):
    Params = PlanPathParams
    program_hint = "prints the list of moves from S to G, for example print(['R', 'D'])"
    answer_hint = "End with one line 'Moves: R D ...' using U, D, L, R."
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
        """Apply moves from pos until one is illegal or the goal is reached; (end, all legal)."""
        grid = self.problem.data["grid"]
        limit = 4 * len(grid) * len(grid[0])
        for move in moves[:limit]:
            if pos == self.goal:
                break
            dr, dc = MOVES[move]
            r, c = pos[0] + dr, pos[1] + dc
            if not (0 <= r < len(grid) and 0 <= c < len(grid[0])) or grid[r][c] == "#":
                return pos, False
            pos = (r, c)
        return pos, len(moves) <= limit

    def parse(self, text: str) -> list[str] | None:
        return parse_moves(text) or None

    def parse_answer(self, text: str) -> list[str] | None:
        return parse_answer_moves(text)

    def apply(self, moves: list[str]) -> bool:
        self.pos, legal = self.follow(self.pos, moves)
        return legal

    def task_text(self) -> str:
        grid = [list(row) for row in self.problem.data["grid"]]
        gr, gc = self.goal
        grid[gr][gc] = "G"
        grid[self.pos[0]][self.pos[1]] = "S"
        rows = "\n".join("".join(row) for row in grid)
        return (
            f"Grid ({len(grid)}x{len(grid[0])}, '#' wall, '.' free, row 0 at the top):\n{rows}\n"
            f"S (you) is at row {self.pos[0]}, col {self.pos[1]}; G is at row {gr}, col {gc}.\n"
            "Moves: U (row-1), D (row+1), L (col-1), R (col+1)."
        )

    def render(self) -> str:
        grid = [list(row) for row in self.problem.data["grid"]]
        grid[self.goal[0]][self.goal[1]] = "G"
        grid[self.pos[0]][self.pos[1]] = "A"
        return "\n".join("".join(row) for row in grid)
