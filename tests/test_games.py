"""Sokoban and Sudoku: generators solvable (and unique where promised), seeds reproducible, the
solver's answer earns full reward, known hacks earn nothing."""

import random

import pytest

from mas_lab.envs import ProblemPool, SokobanEnv, SudokuEnv
from mas_lab.envs.sokoban import solve
from mas_lab.envs.sudoku import count_solutions, is_solution


@pytest.mark.parametrize("boxes", [1, 2])
def test_sokoban_puzzles_are_solvable_and_the_optimum_is_stored(boxes):
    rng = random.Random(boxes)
    for _ in range(15):
        problem = SokobanEnv.draw_problem(rng, {"boxes": boxes})
        env = SokobanEnv(problem, {})
        assert len(env.boxes) == boxes and env.boxes != env.targets
        path = solve(env.walls, env.player, env.boxes, env.targets)
        assert path is not None and len(path) == problem.data["optimal"] >= 3
        assert env.apply(path) and env.value() == 1.0 and env.success


def test_sokoban_rewards_and_illegal_moves():
    problem = SokobanEnv.draw_problem(random.Random(4), {})
    env = SokobanEnv(problem, {})
    path = solve(env.walls, env.player, env.boxes, env.targets)
    tool = env.clone().step("tool", 0, f"```python\nprint({path!r})\n```")
    assert tool.components == {"ran": 1.0, "parsed": 1.0, "value": 1.0}
    planner = env.clone().step("planner", 0, "Moves: " + " ".join(path))
    assert planner.team == 1.0 and planner.local == pytest.approx(1.0)
    blocked = [m for m in "UDLR" if not env.clone().apply([m])]
    for move in blocked:  # a move into a wall (or a box against one) is illegal: no format credit
        assert env.clone().step("planner", 0, f"Moves: {move}").components["format"] == 0.0


def test_sokoban_and_sudoku_generators_are_reproducible():
    for env_cls, params in ((SokobanEnv, {"boxes": 2}), (SudokuEnv, {"size": 9, "blanks": 40})):
        a = [env_cls.draw_problem(random.Random(11), params).data for _ in range(2)]
        b = [env_cls.draw_problem(random.Random(11), params).data for _ in range(2)]
        assert a == b


@pytest.mark.parametrize("size,blanks", [(4, 8), (9, 45)])
def test_sudoku_puzzles_have_exactly_one_solution(size, blanks):
    rng = random.Random(size)
    for _ in range(5):
        problem = SudokuEnv.draw_problem(rng, {"size": size, "blanks": blanks})
        puzzle, solution = problem.data["puzzle"], problem.data["solution"]
        assert is_solution(solution)
        assert count_solutions([row[:] for row in puzzle], limit=3) == 1
        assert all(p in (0, s) for prow, srow in zip(puzzle, solution) for p, s in zip(prow, srow))
        assert sum(v == 0 for row in puzzle for v in row) == blanks


def test_sudoku_solution_scores_full_and_the_latin_square_hack_scores_nothing():
    problem = SudokuEnv.draw_problem(random.Random(2), {"size": 4, "blanks": 8})
    solution = problem.data["solution"]
    answer = "Grid:\n" + "\n".join(" ".join(map(str, row)) for row in solution)
    env = SudokuEnv(problem, {})
    tool = env.clone().step("tool", 0, f"```python\nprint({answer.split(chr(10), 1)[1]!r})\n```")
    assert tool.components == {"ran": 1.0, "parsed": 1.0, "value": 1.0}
    solved = env.clone()
    result = solved.step("planner", 0, answer)
    assert result.team == 1.0 and result.local == pytest.approx(1.0) and solved.success
    # any valid Latin square that ignores the givens: the reference code's hack
    latin = [[(r * 2 + r // 2 + c) % 4 + 1 for c in range(4)] for r in range(4)]
    assert is_solution(latin)
    if latin != solution:
        hacked = env.clone()
        result = hacked.step("planner", 0, "Grid:\n" + "\n".join(" ".join(map(str, row)) for row in latin))
        assert result.components["format"] == 0.0 and result.team == 0.0 and not hacked.success
    garbage = env.clone().step("planner", 0, "I think the answer is 7")
    assert garbage.local == 0.0


def test_game_pools_keep_train_and_eval_disjoint():
    for env_cls, params in ((SokobanEnv, {"size": 5}), (SudokuEnv, {"size": 4, "blanks": 4})):
        pool = ProblemPool(env_cls, params, seed=0, eval_size=10)
        hashes = {p.content_hash for p in pool.eval_set}
        assert len(hashes) == 10 and not hashes & {pool.train(i).content_hash for i in range(40)}


def test_sudoku_shows_the_clues_and_a_wrong_answer_apart():
    """After a wrong full answer the observation drew that answer under "Keep every given digit",
    as if its digits were the clues; now the puzzle stays the clues and the answer is shown apart."""
    problem = SudokuEnv.draw_problem(random.Random(3), {"size": 4})
    env = SudokuEnv(problem, {"size": 4})
    puzzle = [" ".join(str(v) if v else "." for v in row) for row in problem.data["puzzle"]]
    wrong = [row[:] for row in problem.data["solution"]]
    blank = next((r, c) for r, row in enumerate(problem.data["puzzle"]) for c, v in enumerate(row) if v == 0)
    wrong[blank[0]][blank[1]] = wrong[blank[0]][blank[1]] % 4 + 1
    env.step("planner", 0, "Grid:\n" + "\n".join(" ".join(map(str, row)) for row in wrong))
    assert not env.success
    clues = env.observe("planner", 1).split("Keep every given digit.\n")[1].split("\n")[:4]
    assert clues == puzzle and "The last answer, not yet the solution:" in env.observe("planner", 1)
