"""Sudoku (paper Sec. 5: 4x4; here also 9x9): fill the grid so every row, column and box holds each
digit once. Puzzles have a unique solution by construction: a random full grid is generated, and
clues are removed one by one only while a solution counter still finds exactly one solution.

An answer is a full grid (rows of digits). It must keep every given digit: a grid that changes a
given clue is illegal and changes nothing (the reference code's hack of accepting any Latin
square is not a solution here). Tool agent + planner as in envs/games.py.

Team reward: 1 when the grid equals the solution, else 0.5 * the fraction of blanks filled right.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from mas_lab.envs.base import Problem
from mas_lab.envs.games import GameParams, ToolPlannerEnv

Grid = list[list[int]]


def _box(n: int) -> int:
    return int(math.isqrt(n))


def allowed_digits(grid: Grid, r: int, c: int) -> set[int]:
    """The digits that row r, column c and their box leave for cell (r, c)."""
    n, b = len(grid), _box(len(grid))
    used = set(grid[r]) | {grid[i][c] for i in range(n)}
    br, bc = r - r % b, c - c % b
    used |= {grid[i][j] for i in range(br, br + b) for j in range(bc, bc + b)}
    return set(range(1, n + 1)) - used


def count_solutions(grid: Grid, limit: int = 2) -> int:
    """How many solutions (stops at `limit`): backtracking on the cell with fewest candidates."""
    best = None
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if v == 0:
                options = allowed_digits(grid, r, c)
                if best is None or len(options) < len(best[2]):
                    best = (r, c, options)
    if best is None:
        return 1
    r, c, options = best
    total = 0
    for v in options:
        grid[r][c] = v
        total += count_solutions(grid, limit - total)
        grid[r][c] = 0
        if total >= limit:
            break
    return total


def _fill(grid: Grid, rng: random.Random) -> bool:
    for r, row in enumerate(grid):
        for c, v in enumerate(row):
            if v == 0:
                options = list(allowed_digits(grid, r, c))
                rng.shuffle(options)
                for option in options:
                    grid[r][c] = option
                    if _fill(grid, rng):
                        return True
                grid[r][c] = 0
                return False
    return True


def is_solution(grid: Grid) -> bool:
    n, b = len(grid), _box(len(grid))
    digits = set(range(1, n + 1))
    rows = all(set(row) == digits for row in grid)
    cols = all({grid[r][c] for r in range(n)} == digits for c in range(n))
    boxes = all(
        {grid[r][c] for r in range(br, br + b) for c in range(bc, bc + b)} == digits
        for br in range(0, n, b)
        for bc in range(0, n, b)
    )
    return rows and cols and boxes


class SudokuParams(GameParams):
    size: Literal[4, 9] = Field(4, description="side length: 4 (2x2 boxes) or 9 (3x3 boxes)")
    blanks: Optional[int] = Field(
        None, ge=1, description="empty cells (default size*size/2); a unique solution is kept"
    )

    @model_validator(mode="after")
    def _blanks_fit(self) -> "SudokuParams":
        if self.blanks is not None and self.blanks >= self.size * self.size:
            raise ValueError(f"blanks must be below size*size = {self.size * self.size}")
        return self


def _drawn(grid: Grid) -> str:
    return "\n".join(" ".join(str(v) if v else "." for v in row) for row in grid)


class SudokuEnv(ToolPlannerEnv):
    Params = SudokuParams
    program_hint = "prints the solved grid, one row per line, digits separated by spaces"
    answer_hint = "End with the solved grid: one row per line, digits separated by spaces, after a line 'Grid:'."

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.grid: Grid = [list(row) for row in problem.data["puzzle"]]

    @classmethod
    def _draw(cls, rng: random.Random, params: SudokuParams, split: str) -> Problem:
        n = params.size
        solution = [[0] * n for _ in range(n)]
        _fill(solution, rng)
        puzzle = [row[:] for row in solution]
        cells = [(r, c) for r in range(n) for c in range(n)]
        rng.shuffle(cells)
        target_blanks = params.blanks if params.blanks is not None else n * n // 2
        blanks = 0
        for r, c in cells:
            if blanks >= target_blanks:
                break
            keep, puzzle[r][c] = puzzle[r][c], 0
            if count_solutions([row[:] for row in puzzle]) == 1:
                blanks += 1
            else:
                puzzle[r][c] = keep
        return Problem({"puzzle": puzzle, "solution": solution})

    def parse(self, text: str) -> Grid | None:
        n = len(self.grid)
        lowered = text.lower()
        if "grid:" in lowered:
            text = text[lowered.rindex("grid:") + len("grid:") :]
        rows = []
        for line in text.splitlines():
            digits = [int(d) for d in re.findall(r"\d", line)]
            if len(digits) == n:
                rows.append(digits)
        return rows[-n:] if len(rows) >= n else None

    def apply(self, answer: Grid) -> bool:
        puzzle = self.problem.data["puzzle"]
        n = len(puzzle)
        if any(not 1 <= v <= n for row in answer for v in row):
            return False
        if any(puzzle[r][c] and answer[r][c] != puzzle[r][c] for r in range(n) for c in range(n)):
            return False  # a given digit was changed: not an answer to this puzzle
        self.grid = [row[:] for row in answer]
        return True

    def value(self) -> float:
        puzzle, solution = self.problem.data["puzzle"], self.problem.data["solution"]
        if self.grid == solution:
            return 1.0
        blanks = [(r, c) for r, row in enumerate(puzzle) for c, v in enumerate(row) if v == 0]
        right = sum(self.grid[r][c] == solution[r][c] for r, c in blanks)
        return 0.5 * right / len(blanks) if blanks else 0.0

    def render(self) -> str:
        return _drawn(self.grid)

    def task_text(self) -> str:
        """The puzzle as given (its digits are the clues to keep), and below it the team's last
        answer when there is one: a wrong answer shown as the grid would read as clues."""
        puzzle = self.problem.data["puzzle"]
        n = len(puzzle)
        b = _box(n)
        text = (
            f"Sudoku {n}x{n} ({b}x{b} boxes): fill each '.' so that every row, column and box holds 1-{n} once. "
            "Keep every given digit.\n" + _drawn(puzzle)
        )
        if self.grid != puzzle:
            text += "\nThe last answer, not yet the solution:\n" + _drawn(self.grid)
        return text
