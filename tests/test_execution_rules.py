"""The paper's execution rule as an option (env.params.execution: move_by_move): legal moves act
in order, each illegal one is skipped with env.params.illegal_penalty; the default
(all_or_nothing) is every kept run's behaviour, checked by replaying a kept store's rewards.
The reward hacks of the new rule: padding, repeating, bumping walls as stops, gaming the penalty."""

import json
import lzma
import sqlite3

import pytest
import yaml
from conftest import ROOT

from mas_lab.envs.base import Problem
from mas_lab.envs.plan_path import PlanPathEnv
from mas_lab.envs.sokoban import SokobanEnv

MBM = {"execution": "move_by_move"}


def _grid(start, goal, grid=("....", "....", "....", "....")):
    from mas_lab.envs.plan_path import distances

    d = distances(list(grid), tuple(goal))[start[0]][start[1]]
    return Problem({"grid": list(grid), "start": list(start), "goal": list(goal), "shortest": d})


def _reward(env, reply):
    result = env.step("planner", 0, reply)
    return result.team + result.local, result


WALLED = (".#..", "....", "....", "....")


def test_legal_moves_act_in_order_and_an_illegal_one_is_skipped_with_the_penalty():
    env = PlanPathEnv(_grid((0, 0), (0, 2), WALLED), MBM)
    total, result = _reward(env, "Moves: R D R R U")  # the first R hits the wall: skipped
    assert env.pos == (0, 2) and env.success and result.components["illegal_moves"] == 1.0
    clean = PlanPathEnv(_grid((0, 0), (0, 2), WALLED), MBM)
    clean_total, _ = _reward(clean, "Moves: D R R U")
    assert clean.success and total == pytest.approx(clean_total - 0.1)


def test_the_default_is_all_or_nothing_as_every_kept_run_was_trained():
    env = PlanPathEnv(_grid((0, 0), (0, 2), WALLED), {})
    _, result = _reward(env, "Moves: R D R R U")
    assert env.pos == (0, 0) and result.components == {"format": 0.0, "value": 0.0}


@pytest.mark.parametrize(
    "padded",
    [
        "Moves: R R D D U U D D",  # back and forth on the way: the same end, more moves
        "Moves: R R D D L L R R",
        "Moves: U U R R D D D D",  # bumps at the border first (skipped, penalised)
        "Moves: R R D D D D D D D D D D",  # bumps at the border after arriving: walked to the end
    ],
)
def test_padding_repeating_or_bumping_never_beats_the_plain_shortest_plan(padded):
    """Legal detours earn what the plain plan earns (the paper's optimality bonus, not implemented
    here, would make them earn less); every bump costs the penalty."""
    problem = _grid((0, 0), (2, 2))
    plain, _ = _reward(PlanPathEnv(problem, MBM), "Moves: R R D D")
    other, result = _reward(PlanPathEnv(problem, MBM), padded)
    assert plain >= other and (plain > other or result.components["illegal_moves"] == 0)


def test_a_reply_longer_than_the_walk_limit_counts_its_excess_as_skipped():
    problem = _grid((0, 0), (2, 2))
    env = PlanPathEnv(problem, MBM)
    _, result = _reward(env, "Moves: " + " ".join(["L"] * 200))  # 64 walked (all illegal), 136 beyond
    assert result.components["illegal_moves"] == 200 and env.pos == (0, 0)


def test_the_border_as_a_stop_costs_more_than_it_gains():
    """ "D D D D" from the top row ends on the bottom row from any column (the reason all_or_nothing
    exists): move by move, every bump is penalised, so the sweep earns less than the straight way."""
    problem = _grid((0, 1), (3, 1))
    straight, _ = _reward(PlanPathEnv(problem, MBM), "Moves: D D D")
    sweep, result = _reward(PlanPathEnv(problem, MBM), "Moves: D D D D D D")
    assert result.components["illegal_moves"] == 3 and sweep == pytest.approx(straight - 0.3)


def test_no_penalty_free_gaming_a_reply_without_moves_is_no_answer():
    env = PlanPathEnv(_grid((0, 0), (2, 2)), MBM)
    _, result = _reward(env, "Moves:")
    assert result.components["format"] == 0.0 and result.local == 0.0


def test_sokoban_move_by_move_skips_a_push_into_the_wall():
    grid = ["######", "#....#", "#....#", "#....#", "#....#", "######"]
    problem = Problem({"grid": grid, "player": [2, 2], "boxes": [[2, 3]], "targets": [[3, 4]], "optimal": 1})
    env = SokobanEnv(problem, MBM)
    _, result = _reward(env, "Moves: R R D")  # R pushes the box to (2, 4); R again is blocked: skipped
    assert result.components["illegal_moves"] == 1.0 and env.player == (3, 3)


def test_the_tool_agents_preview_uses_the_same_rule():
    """The tool agent's `value` is what its printed plan would do: move by move too."""
    program = "```python\nprint(['R', 'D', 'R'])\n```"  # the R into the wall is skipped
    result = PlanPathEnv(_grid((0, 0), (0, 2), WALLED), MBM).step("tool", 0, program)
    assert 0.0 < result.components["value"] < 1.0
    assert PlanPathEnv(_grid((0, 0), (0, 2), WALLED), {}).step("tool", 0, program).components["value"] == 0.0


def test_a_kept_run_replays_to_its_stored_rewards():
    """Every kept run's task.yaml resolves to the behaviour it was trained with: the chosen planner
    actions of a kept Plan-Path run, replayed through the environment today, earn the stored rewards."""
    from mas_lab.config import TaskConfig, stored_task_data
    from mas_lab.envs import ENVS

    kept = ROOT / "results" / "reproduce" / "plan_path" / "mas--at-grpo-shared" / "seed-0"
    task = TaskConfig.model_validate(stored_task_data(yaml.safe_load((kept / "task.yaml").read_text())))
    db = sqlite3.connect(":memory:")
    db.deserialize(lzma.open(kept / "run.db.xz").read())
    episodes = db.execute("SELECT id, problem FROM episodes WHERE kind = 'train' AND step IN (1, 15, 30)").fetchall()
    checked = 0
    for episode_id, problem in episodes:
        env = ENVS[task.env.name](Problem(json.loads(problem)), task.env.params)
        turns = db.execute(
            "SELECT t.id, t.turn, t.role, t.chosen FROM turns t WHERE t.episode_id = ? ORDER BY t.id", (episode_id,)
        ).fetchall()
        for turn_id, turn, role, chosen in turns:
            for response, team, local in db.execute(
                "SELECT response, team, local FROM candidates WHERE turn_id = ? ORDER BY idx", (turn_id,)
            ).fetchall():
                if role == "planner":
                    trial = env.clone().step(role, turn, response)
                    assert (trial.team, trial.local) == pytest.approx((team, local)), response
                    checked += 1
            env.step(
                role,
                turn,
                db.execute(
                    "SELECT response FROM candidates WHERE turn_id = ? AND idx = ?", (turn_id, chosen)
                ).fetchone()[0],
            )
    assert checked > 150


PAPER = {"execution": "move_by_move", "reward": "paper"}


def test_the_paper_reward_pays_progress_the_goal_and_a_shortest_plan():
    problem = _grid((0, 0), (2, 2))
    total, result = _reward(PlanPathEnv(problem, PAPER), "Moves: R R D D")
    c = result.components
    assert (c["shaping"], c["goal"], c["optimal"]) == (1.0, 1.0, 1.0)
    assert result.local == pytest.approx(1.0 + 1.0 + 0.5)
    _, half = _reward(PlanPathEnv(problem, PAPER), "Moves: R R")
    assert half.components["shaping"] == pytest.approx(0.5) and half.components["goal"] == 0.0


@pytest.mark.parametrize(
    "padded", ["Moves: R R D D U U D D", "Moves: R L R R D D", "Moves: U R R D D", "Moves: R R D D D"]
)
def test_under_the_paper_reward_padding_repeating_or_bumping_earns_strictly_less(padded):
    """The optimality bonus and the penalty make every detour, repeat and bump cost something."""
    problem = _grid((0, 0), (2, 2))
    plain, _ = _reward(PlanPathEnv(problem, PAPER), "Moves: R R D D")
    other, _ = _reward(PlanPathEnv(problem, PAPER), padded)
    assert other < plain


def test_the_optimality_bonus_counts_the_moves_of_every_turn():
    """Two turns of a shortest plan split in halves keep the bonus; a detour in the first loses it."""
    problem = _grid((0, 0), (2, 2))
    env = PlanPathEnv(problem, PAPER)
    env.step("planner", 0, "Moves: R R")
    assert env.step("planner", 1, "Moves: D D").components["optimal"] == 1.0
    env = PlanPathEnv(problem, PAPER)
    env.step("planner", 0, "Moves: R L R R")
    assert env.step("planner", 1, "Moves: D D").components["optimal"] == 0.0


def test_the_paper_reward_needs_move_by_move_execution():
    with pytest.raises(ValueError, match="needs execution: move_by_move"):
        PlanPathEnv(_grid((0, 0), (2, 2)), {"reward": "paper"})


def test_sokoban_paper_reward_shapes_the_box_distance():
    grid = ["######", "#....#", "#....#", "#....#", "#....#", "######"]
    problem = Problem({"grid": grid, "player": [2, 1], "boxes": [[2, 2]], "targets": [[2, 4]], "optimal": 2})
    _, result = _reward(SokobanEnv(problem, PAPER), "Moves: R R")
    assert (result.components["shaping"], result.components["goal"], result.components["optimal"]) == (1.0, 1.0, 1.0)
    _, over = _reward(SokobanEnv(problem, PAPER), "Moves: R R R")  # pushed into the wall: skipped, stays solved
    assert over.components["illegal_moves"] == 1.0 and over.local < result.local
