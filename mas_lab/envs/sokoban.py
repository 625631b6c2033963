"""Sokoban (paper Sec. 5: 6x6, 1 box; here 1-2 boxes): push every box onto a target.

Generated backwards from a solved state, so every problem is solvable: boxes start on their
targets and the player walks and *pulls* boxes at random; the state reached is the start.
A breadth-first solver over (player, boxes) then gives the optimal number of moves (and rejects
starts that are already solved). Tool agent + planner as in envs/games.py; answers are move lists.

Team reward: 1 when every box is on a target, else 0.5 * the fraction of boxes on targets. As in
Plan-Path, a plan is walked to its end (a box pushed over its target and on is not on it) and only
when every move is legal (else nothing moves): a fixed sweep cannot use "stop when solved", walls
or the border to solve many problems.
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any, Optional

from pydantic import Field, model_validator

from mas_lab.envs.base import Problem
from mas_lab.envs.plan_path import MOVES, MovesGame, MovesParams, offset_text, straight_moves

Pos = tuple[int, int]


def _step(walls: frozenset, player: Pos, boxes: frozenset, move: str) -> tuple[Pos, frozenset] | None:
    """One move with pushing; None when illegal (into a wall, or a box into a wall or a box)."""
    dr, dc = MOVES[move]
    nxt = (player[0] + dr, player[1] + dc)
    if nxt in walls:
        return None
    if nxt in boxes:
        beyond = (nxt[0] + dr, nxt[1] + dc)
        if beyond in walls or beyond in boxes:
            return None
        boxes = (boxes - {nxt}) | {beyond}
    return nxt, boxes


def solve(
    walls: frozenset, player: Pos, boxes: frozenset, targets: frozenset, limit: int = 200_000
) -> list[str] | None:
    """A shortest move list that puts every box on a target (BFS), or None."""
    start = (player, boxes)
    parents: dict = {start: None}
    queue = deque([start])
    while queue and len(parents) < limit:
        state = queue.popleft()
        if state[1] == targets:
            path = []
            while parents[state] is not None:
                state, move = parents[state]
                path.append(move)
            return path[::-1]
        for move in MOVES:
            nxt = _step(walls, state[0], state[1], move)
            if nxt is not None and nxt not in parents:
                parents[nxt] = (state, move)
                queue.append(nxt)
    return None


class SokobanParams(MovesParams):
    size: int = Field(6, ge=4, le=12, description="grid side length, walls included")
    boxes: int = Field(1, ge=1, le=4, description="boxes (and targets)")
    wall_prob: float = Field(0.1, ge=0.0, le=0.5, description="probability that an inner cell is a wall")
    reverse_steps: int = Field(30, ge=1, le=1000, description="random pulls from the solved state")
    min_moves: int = Field(3, ge=1, description="least moves of the optimal solution")
    max_moves: Optional[int] = Field(None, ge=1, description="most moves of the optimal solution (default: no limit)")

    @model_validator(mode="after")
    def _moves_range(self) -> "SokobanParams":
        if self.max_moves is not None and self.max_moves < self.min_moves:
            raise ValueError(f"max_moves ({self.max_moves}) must be at least min_moves ({self.min_moves})")
        return self


# tool_helper: solver defines this before the tool agent's program (it runs in the sandbox)
SOKOBAN_SOLVER = """
def solve(grid):
    from collections import deque
    rows = [str(r) for r in grid]
    cells = {(r, c): ch for r, row in enumerate(rows) for c, ch in enumerate(row)}
    walls = {p for p, ch in cells.items() if ch == "#"}
    targets = frozenset(p for p, ch in cells.items() if ch in "O*+")
    boxes = frozenset(p for p, ch in cells.items() if ch in "B*")
    players = [p for p, ch in cells.items() if ch in "P+"]
    if not players or not boxes:
        return []
    steps = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    start = (players[0], boxes)
    came, queue = {start: None}, deque([start])
    while queue and len(came) < 200000:
        state = queue.popleft()
        if state[1] <= targets:
            path = []
            while came[state] is not None:
                state, move = came[state]
                path.append(move)
            return path[::-1]
        (r, c), now = state
        for move, (dr, dc) in steps.items():
            there = (r + dr, c + dc)
            if there in walls or there not in cells:
                continue
            moved = now
            if there in now:
                beyond = (there[0] + dr, there[1] + dc)
                if beyond in walls or beyond in now or beyond not in cells:
                    continue
                moved = (now - {there}) | {beyond}
            nxt = (there, moved)
            if nxt not in came:
                came[nxt] = (state, move)
                queue.append(nxt)
    return []
"""


class SokobanEnv(MovesGame):
    Params = SokobanParams
    params: SokobanParams
    # no legal answer in either hint (see plan_path.py)
    program_hint = "prints the list of moves that pushes every box onto a target, as a Python list of the letters 'U', 'D', 'L', 'R'"
    solver_example = (
        " A function solve(grid) is defined for your program: it returns the moves that push every box "
        "onto a target, on a grid given as the list of its rows as drawn, e.g. "
        "print(solve(['#####', '#PBO#', '#####']))"
    )
    solver_source = SOKOBAN_SOLVER
    answer_hint = "End with one line 'Moves:' followed by your moves, one letter each (U, D, L or R)."

    def __init__(self, problem: Problem, params: Any = None):
        super().__init__(problem, params)
        self.player: Pos = tuple(problem.data["player"])
        self.boxes: frozenset = frozenset(tuple(b) for b in problem.data["boxes"])

    @property
    def walls(self) -> frozenset:
        grid = self.problem.data["grid"]
        return frozenset((r, c) for r, row in enumerate(grid) for c, ch in enumerate(row) if ch == "#")

    @property
    def targets(self) -> frozenset:
        return frozenset(tuple(t) for t in self.problem.data["targets"])

    @classmethod
    def _draw(cls, rng: random.Random, params: SokobanParams, split: str) -> Problem:
        size, n_boxes, pulls = params.size, params.boxes, params.reverse_steps
        for _ in range(1000):
            grid = [
                [
                    "#" if r in (0, size - 1) or c in (0, size - 1) or rng.random() < params.wall_prob else "."
                    for c in range(size)
                ]
                for r in range(size)
            ]
            free = [(r, c) for r in range(size) for c in range(size) if grid[r][c] == "."]
            if len(free) < n_boxes + 2:
                continue
            picks = rng.sample(free, n_boxes + 1)
            targets, player = frozenset(picks[:n_boxes]), picks[n_boxes]
            walls = frozenset((r, c) for r in range(size) for c in range(size) if grid[r][c] == "#")
            boxes = targets
            for _ in range(pulls):  # walk backwards: a pull moves the box behind the player along
                move = rng.choice(list(MOVES))
                dr, dc = MOVES[move]
                nxt = (player[0] + dr, player[1] + dc)
                if nxt in walls or nxt in boxes:
                    continue
                behind = (player[0] - dr, player[1] - dc)
                if behind in boxes and rng.random() < 0.7:
                    boxes = (boxes - {behind}) | {player}
                player = nxt
            if boxes == targets:
                continue
            path = solve(walls, player, boxes, targets)
            if path and params.min_moves <= len(path) <= (params.max_moves or len(path)):
                return Problem(
                    {
                        "grid": ["".join(row) for row in grid],
                        "player": list(player),
                        "boxes": sorted(list(b) for b in boxes),
                        "targets": sorted(list(t) for t in targets),
                        "optimal": len(path),
                    }
                )
        raise ValueError(f"sokoban: could not generate a puzzle with size={size}, boxes={n_boxes}")

    def value(self) -> float:
        on = len(self.boxes & self.targets)
        return 1.0 if on == len(self.targets) else 0.5 * on / len(self.targets)

    def _box_distance(self, boxes) -> int:
        """Each box's Manhattan distance to its nearest target, summed."""
        return sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in self.targets) for b in boxes)

    def potential(self) -> float:
        start = self._box_distance(tuple(b) for b in self.problem.data["boxes"]) or 1
        return -self._box_distance(self.boxes) / start

    def optimal_moves(self) -> int:
        return int(self.problem.data["optimal"])

    def apply(self, moves: list[str]) -> bool:
        """All or nothing, walked to the end (see the module docstring)."""
        if len(moves) > 8 * len(self.problem.data["grid"]) ** 2:
            return False
        walls, player, boxes = self.walls, self.player, self.boxes
        for move in moves:
            nxt = _step(walls, player, boxes, move)
            if nxt is None:
                return False
            player, boxes = nxt
        self.player, self.boxes = player, boxes
        return True

    def render(self) -> str:
        grid = [list(row) for row in self.problem.data["grid"]]
        for r, c in self.targets:
            grid[r][c] = "O"
        for r, c in self.boxes:
            grid[r][c] = "*" if (r, c) in self.targets else "B"
        r, c = self.player
        grid[r][c] = "+" if (r, c) in self.targets else "P"
        return "\n".join("".join(row) for row in grid)

    def drawn_grid(self) -> list[str]:
        return self.render().splitlines()

    def demo_grid(self, rng: random.Random) -> list[str]:
        size = self.params.size
        cells = [["#" if r in (0, size - 1) or c in (0, size - 1) else "." for c in range(size)] for r in range(size)]
        inner = [(r, c) for r in range(1, size - 1) for c in range(1, size - 1)]
        for (r, c), mark in zip(rng.sample(inner, 3), "PBO"):
            cells[r][c] = mark
        return ["".join(row) for row in cells]

    def _offsets(self) -> str:
        """With one box, where it lies from you and where its target lies from it, in words (and
        move letters with hint `letters`), as Plan-Path states G's offset: reading them is not yet
        solving, since the push needs you on the box's far side."""
        if len(self.boxes) != 1:
            return ""
        (br, bc), (tr, tc) = next(iter(self.boxes)), next(iter(self.targets))
        letters = self.params.hint == "letters"
        return offset_text(br - self.player[0], bc - self.player[1], "The box", "you", letters) + offset_text(
            tr - br, tc - bc, "The target", "the box", letters
        )

    def task_text(self) -> str:
        """The grid and its legend. Hint `none` (the paper's observation) adds how many boxes are on
        targets; `offsets` and `letters` add the coordinates and the offsets (with letters)."""
        size = len(self.problem.data["grid"])
        head = (
            f"Sokoban ({size}x{size}): push every box onto a target.\n"
            "'#' wall, '.' floor, 'O' target, 'B' box, '*' box on a target, 'P' you, '+' you on a target; "
            f"row 0 at the top.\n{self.render()}\n"
        )
        legend = "Moves: U (row-1), D (row+1), L (col-1), R (col+1); walking into a box pushes it."
        if self.params.hint == "none":
            return head + f"Boxes on targets: {len(self.boxes & self.targets)}/{len(self.targets)}.\n" + legend
        return (
            head + f"You are at row {self.player[0]}, col {self.player[1]}. Boxes at {sorted(self.boxes)}; "
            f"targets at {sorted(self.targets)}.{self._offsets()}\n" + legend
        )

    # --- the plans of the reading rules (baselines.py) -----------------------------------------------
    def _push_plan(self, player: Pos, box: Pos, target: Pos, rows_first: bool) -> list[str]:
        """Walk straight to the cell behind the box and push it along one axis, then the other:
        what the stated offsets suggest, without searching around walls."""
        plan: list[str] = []
        axes = ((0, target[0] - box[0]), (1, target[1] - box[1]))
        for axis, n in axes if rows_first else axes[::-1]:
            if not n:
                continue
            step = 1 if n > 0 else -1
            behind = (box[0] - step, box[1]) if axis == 0 else (box[0], box[1] - step)
            plan += straight_moves(behind[0] - player[0], behind[1] - player[1], rows_first)
            plan += straight_moves(n, 0) if axis == 0 else straight_moves(0, n)
            box = (target[0], box[1]) if axis == 0 else (box[0], target[1])
            player = (box[0] - step, box[1]) if axis == 0 else (box[0], box[1] - step)
        return plan

    def straight_plan(self, rows_first: bool = True) -> list[str]:
        """One box: the push plan of `_push_plan`; more boxes: the first box to its nearest free target."""
        off = sorted(self.boxes - self.targets)
        if not off:
            return []
        box = off[0]
        free = sorted(self.targets - self.boxes, key=lambda t: (abs(t[0] - box[0]) + abs(t[1] - box[1]), t))
        return self._push_plan(self.player, box, free[0], rows_first)

    def optimal_plan(self) -> list[str] | None:
        return solve(self.walls, self.player, self.boxes, self.targets)
