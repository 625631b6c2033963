"""Environments: Plan-Path generator, solver, rewards and parsing; disjoint train/eval pools."""

import random

import pytest

from mas_lab.envs import PlanPathEnv, ProblemPool, ToyEnv
from mas_lab.envs.plan_path import distances, parse_moves, shortest_path

PARAMS = {"size": 5, "wall_prob": 0.25, "min_distance": 2}


def test_plan_path_problems_are_solvable_with_the_stored_shortest_length():
    rng = random.Random(1)
    for _ in range(50):
        problem = PlanPathEnv.draw_problem(rng, PARAMS)
        grid, start, goal = problem.data["grid"], tuple(problem.data["start"]), tuple(problem.data["goal"])
        path = shortest_path(grid, start, goal)
        assert len(path) == problem.data["shortest"] >= 2
        env = PlanPathEnv(problem, PARAMS)
        end, legal = env.follow(start, path)
        assert end == goal and legal


def test_generator_is_reproducible_from_its_seed():
    a = [PlanPathEnv.draw_problem(random.Random(7), PARAMS).data for _ in range(3)]
    b = [PlanPathEnv.draw_problem(random.Random(7), PARAMS).data for _ in range(3)]
    assert a == b


def test_train_and_eval_pools_are_disjoint_by_content_hash():
    pool = ProblemPool(ToyEnv, {"letters": "ab"}, seed=0, eval_size=2)  # only 2 letters x 10^6 numbers
    eval_hashes = {p.content_hash for p in pool.eval_set}
    assert len(eval_hashes) == 2
    assert not eval_hashes & {pool.train(i).content_hash for i in range(200)}
    pool = ProblemPool(PlanPathEnv, {"size": 3, "wall_prob": 0.0}, seed=0, eval_size=8)  # tiny space: collisions likely
    eval_hashes = {p.content_hash for p in pool.eval_set}
    assert len(eval_hashes) == 8 and not eval_hashes & {pool.train(i).content_hash for i in range(100)}


def test_the_solvers_answer_earns_full_reward_for_both_roles():
    problem = PlanPathEnv.draw_problem(random.Random(3), PARAMS)
    env = PlanPathEnv(problem, PARAMS)
    path = shortest_path(problem.data["grid"], tuple(problem.data["start"]), tuple(problem.data["goal"]))
    code = f"```python\nprint({path!r})\n```"
    tool = env.step("tool", 0, code)
    assert tool.local == pytest.approx(1.0) and tool.components == {"ran": 1.0, "parsed": 1.0, "value": 1.0}
    assert "The tool agent's code" in env.observe("planner", 0) and str(path) in env.observe("planner", 0)
    planner = env.step("planner", 0, "Moves: " + " ".join(path))
    assert planner.team == 1.0 and planner.local == pytest.approx(1.0) and env.success


def test_a_bfs_program_written_by_a_tool_agent_runs_in_the_sandbox():
    problem = PlanPathEnv.draw_problem(random.Random(5), PARAMS)
    grid, start, goal = problem.data["grid"], problem.data["start"], problem.data["goal"]
    program = f"""
from collections import deque
grid = {grid!r}; start = tuple({start!r}); goal = tuple({goal!r})
moves = {{'U': (-1, 0), 'D': (1, 0), 'L': (0, -1), 'R': (0, 1)}}
prev = {{start: None}}; queue = deque([start])
while queue:
    cell = queue.popleft()
    for name, (dr, dc) in moves.items():
        nxt = (cell[0] + dr, cell[1] + dc)
        if 0 <= nxt[0] < len(grid) and 0 <= nxt[1] < len(grid[0]) and grid[nxt[0]][nxt[1]] != '#' and nxt not in prev:
            prev[nxt] = (cell, name); queue.append(nxt)
path, cell = [], goal
while prev[cell]:
    cell, name = prev[cell]; path.append(name)
print(path[::-1])
"""
    env = PlanPathEnv(problem, PARAMS)
    result = env.step("tool", 0, program)
    assert result.components["value"] == 1.0, env.tool_output


def test_broken_or_illegal_answers_score_low():
    problem = PlanPathEnv.draw_problem(random.Random(3), PARAMS)
    env = PlanPathEnv(problem, PARAMS)
    assert env.step("tool", 0, "```python\nraise SystemExit(3)\n```").local == 0.0
    assert env.tool_output.startswith("[error]")
    assert env.step("tool", 0, "```python\nwhile True: pass\n```").components["ran"] == 0.0
    assert env.tool_output.startswith("[timeout]")
    result = env.step("planner", 0, "I do not know")
    assert result.components["format"] == 0.0 and not env.success


def test_walls_stop_a_move_list():
    grid = ["..", "#."]
    assert distances(grid, (1, 1)) == [[2, 1], [-1, 0]]
    problem = PlanPathEnv.draw_problem(random.Random(0), {"size": 2, "wall_prob": 0.0, "min_distance": 1})
    env = PlanPathEnv(problem, {})
    _, legal = env.follow((0, 0), ["U"])
    assert not legal


@pytest.mark.parametrize(
    "text,moves",
    [
        ("Moves: R D D", ["R", "D", "D"]),
        ("['U', 'L']", ["U", "L"]),
        ("go right then Down. Moves: up left", ["U", "L"]),
        ("nothing here", []),
    ],
)
def test_parse_moves(text, moves):
    assert parse_moves(text) == moves


def test_clone_is_independent_of_the_live_state():
    problem = PlanPathEnv.draw_problem(random.Random(3), PARAMS)
    env = PlanPathEnv(problem, PARAMS)
    branch = env.clone()
    path = shortest_path(problem.data["grid"], tuple(problem.data["start"]), tuple(problem.data["goal"]))
    branch.step("planner", 0, "Moves: " + " ".join(path))
    assert branch.success and not env.success and env.history == []
