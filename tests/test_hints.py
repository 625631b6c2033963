"""The move games' observations by `env.params.hint`: `none` is the paper's (grid and coordinates,
no offsets, no move letters), `letters` is exactly what every run before the option saw (checked
against the stored observations of the committed sample runs), and a stored run without a hint
keeps `letters` on resume."""

import json
import random
import re
import sqlite3
from pathlib import Path

import pytest

from mas_lab.config import load_task, stored_task_data
from mas_lab.envs import PlanPathEnv, SokobanEnv

ROOT = Path(__file__).resolve().parents[1]


def _stored_first_turns(run: str, role: str, kind: str = "eval", limit: int = 8):
    """(problem, system prompt, observation) of the first stored turns of `role` in a sample run."""
    db = sqlite3.connect(f"file:{ROOT / 'sample_runs' / run / 'run.db'}?mode=ro", uri=True)
    rows = db.execute(
        "SELECT e.problem, t.system, t.observation FROM turns t JOIN episodes e ON t.episode_id = e.id "
        "WHERE t.turn = 0 AND t.role = ? AND e.kind = ? ORDER BY t.id LIMIT ?",
        (role, kind, limit),
    ).fetchall()
    db.close()
    assert len(rows) == limit
    return rows


@pytest.mark.parametrize(
    "run, env_cls", [("plan_path_learns_smollm2", PlanPathEnv), ("sokoban_learns_smollm2", SokobanEnv)]
)
def test_hint_letters_is_the_observation_every_earlier_run_saw(run, env_cls):
    params = load_task(ROOT / "sample_runs" / run / "task.yaml", stored=True).env.params
    assert params["hint"] == "letters"
    for role in ("tool", "planner"):
        for problem, system, observation in _stored_first_turns(run, role):
            env = env_cls(json_problem(problem), params)
            if role == "planner":  # the planner's observation also holds the tool's reply of that episode
                assert (
                    env.observe(role, 0).split("\nThe tool agent's code:")[0]
                    == observation.split("\nThe tool agent's code:")[0]
                )
            else:
                assert env.observe(role, 0) == observation
            assert env.system_prompts[role] == system


def json_problem(text: str):
    from mas_lab.envs import Problem

    return Problem(json.loads(text))


def test_plan_path_hint_none_gives_coordinates_only():
    problem = PlanPathEnv.draw_problem(random.Random(3), {"size": 5, "wall_prob": 0.0, "min_distance": 3})
    env = {
        hint: PlanPathEnv(problem, {"size": 5, "wall_prob": 0.0, "min_distance": 3, "hint": hint})
        for hint in ("none", "offsets", "letters")
    }
    (sr, sc), (gr, gc) = problem.data["start"], problem.data["goal"]
    for hint, e in env.items():
        text = e.observe("planner", 0)
        assert f"S (you) is at row {sr}, col {sc}; G is at row {gr}, col {gc}." in text
        assert bool(re.search(r"\([UDLR]( [UDLR])*\)", e.task_text())) == (hint == "letters")
        assert (" of S." in text) == (hint != "none")
    # no worked example that turns an offset into moves without hints: only the form of the last line
    assert "if G is" not in env["none"].system_prompts["planner"]
    assert "Moves:" in env["none"].system_prompts["planner"]
    assert "if G is 2 rows up and 1 column right of S" in env["offsets"].system_prompts["planner"]


def test_sokoban_hint_none_gives_the_grid_and_boxes_on_targets():
    problem = SokobanEnv.draw_problem(random.Random(1), {})
    text = SokobanEnv(problem, {}).observe("planner", 0)
    assert "Boxes on targets: 0/1." in text
    assert "You are at row" not in text and "The box is" not in text
    assert "The box is" in SokobanEnv(problem, {"hint": "offsets"}).observe("planner", 0)
    assert (
        "(" not in SokobanEnv(problem, {"hint": "offsets"}).observe("planner", 0).split("targets at")[1].split(".")[1]
    )


def test_max_distance_bounds_the_goal_and_is_checked():
    rng = random.Random(0)
    for _ in range(30):
        problem = PlanPathEnv.draw_problem(rng, {"size": 5, "min_distance": 2, "max_distance": 3})
        assert 2 <= problem.data["shortest"] <= 3
    with pytest.raises(ValueError, match="max_distance"):
        PlanPathEnv.Params(min_distance=3, max_distance=2)


def test_a_stored_task_without_a_hint_keeps_the_letters_but_a_new_one_does_not():
    data = {"env": {"name": "plan_path", "params": {"size": 3}}}
    assert stored_task_data(data)["env"]["params"]["hint"] == "letters"
    assert stored_task_data({"env": {"name": "toy", "params": {}}}) == {"env": {"name": "toy", "params": {}}}
    assert load_task(ROOT / "tasks" / "plan_path.yaml").env.params["hint"] == "none"
    assert load_task(ROOT / "tasks" / "plan_path_learns.yaml").env.params["hint"] == "letters"


def _grid_rows(env) -> list[str]:
    """The grid's rows as the observation draws them (what a tool agent would copy)."""
    lines = env.task_text().split("\n")
    return [row for row in lines[1:] if row and set(row) <= set(".#SGOBP*+")]


@pytest.mark.parametrize(
    "env_cls, params", [(PlanPathEnv, {"size": 4, "wall_prob": 0.3, "min_distance": 2}), (SokobanEnv, {})]
)
def test_the_solver_helper_solves_a_grid_copied_from_the_observation(env_cls, params):
    """tool_helper: solver defines solve(grid) before the tool's program: the grid copied from the
    observation gives a plan that solves the problem (the tool's value 1); the planner sees only
    the agent's own code; without the helper the same program fails (solve is not defined)."""
    from mas_lab.envs import ProblemPool

    helped = {**params, "tool_helper": "solver"}
    for problem in ProblemPool(env_cls, helped, 0, 8).eval_set:
        env = env_cls(problem, helped)
        program = f"print(solve({_grid_rows(env)!r}))"
        result = env.step("tool", 0, f"```python\n{program}\n```")
        assert result.components == {"ran": 1.0, "parsed": 1.0, "value": 1.0}
        assert env.tool_code.strip() == program and "def solve" not in env.observe("planner", 0)
        plain = env_cls(problem, params)
        assert plain.step("tool", 0, f"```python\n{program}\n```").components["ran"] == 0.0


def test_the_solver_helper_needs_the_right_grid():
    """A wrong or constant grid does not solve the problem: the helper searches what it is given."""
    params = {"size": 4, "wall_prob": 0.3, "min_distance": 2, "tool_helper": "solver"}
    problem = PlanPathEnv.draw_problem(random.Random(4), params)
    env = PlanPathEnv(problem, params)
    swapped = [row.replace("S", "x").replace("G", "S").replace("x", "G") for row in _grid_rows(env)]
    assert env.clone().step("tool", 0, f"print(solve({swapped!r}))").components["value"] < 1.0
    assert env.clone().step("tool", 0, "print(solve(['S.', '.G']))").components["value"] < 1.0


def test_the_tool_warm_up_calls_the_solver_on_a_random_grid():
    params = {"size": 4, "wall_prob": 0.3, "min_distance": 2, "tool_helper": "solver"}
    problem = PlanPathEnv.draw_problem(random.Random(4), params)
    env = PlanPathEnv(problem, params)
    demo = env.format_demo("tool", random.Random(0))
    assert demo.startswith("```python\nprint(solve([") and "solve(grid)" in env.system_prompts["tool"]
    assert str(_grid_rows(env)) not in demo  # the form of a call, never this problem's grid


@pytest.mark.parametrize(
    "env_cls, params", [(PlanPathEnv, {"size": 4, "wall_prob": 0.3, "min_distance": 2}), (SokobanEnv, {})]
)
def test_an_observed_tool_demo_copies_the_drawn_grid_and_never_shows_moves(env_cls, params):
    """tool_demo: observed: the tool's warm-up reply calls solve() on the grid exactly as the
    observation draws it (so run, it solves the problem), and holds no move letter outside the grid;
    the planner's warm-up reply stays random moves, whatever the problem."""
    from mas_lab.envs import ProblemPool

    observed = {**params, "tool_helper": "solver", "tool_demo": "observed", "tool_timeout_s": 30}  # a busy machine
    for problem in ProblemPool(env_cls, observed, 0, 8).eval_set:
        env = env_cls(problem, observed)
        assert env.drawn_grid() == _grid_rows(env)
        demo = env.format_demo("tool", random.Random(0))
        assert demo == f"```python\nprint(solve({_grid_rows(env)!r}))\n```"
        assert not set(demo.replace("solve", "").replace("print", "").replace("python", "")) & set("UDLR")
        played = env.clone()
        result = played.step("tool", 0, demo)
        assert result.components["value"] == 1.0, (result.info, played.tool_output)  # the sandbox's own message
        planner = [env.format_demo("planner", random.Random(seed)) for seed in range(20)]
        assert len(set(planner)) > 3  # random, not this problem's plan
