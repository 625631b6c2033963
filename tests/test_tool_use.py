"""experiments/tool_use.py tells a planner that copies the tool's first move from one that reads the
coordinates, on a store written by the real RunStore; for a single agent with the tool it reads the
answer after the agent's own program."""

import sys
from types import SimpleNamespace

from conftest import ROOT

from mas_lab.algo import Candidate
from mas_lab.records.store import RunStore

sys.path.insert(0, str(ROOT / "experiments"))
from tool_use import summarise  # noqa: E402


def _turn(turn, role, observation, response):
    candidate = Candidate("p", role, turn, 0, "shared", [1], [2], response, 1.0, 1.0, 0.0, chosen=True)
    return SimpleNamespace(
        turn=turn,
        role=role,
        policy="shared",
        observation=observation,
        chosen=0,
        state_after="",
        system="",
        candidates=[candidate],
    )


def _answer_observation(printed):
    return f"S is at ...\nIts output:\n{printed}\nEnd with one line 'Moves:'"


def _episode(idx, start, goal, printed, answer, success, turns=None):
    turns = turns or [_turn(0, "planner", _answer_observation(printed), answer)]
    problem = SimpleNamespace(id=f"p{idx}", data={"start": start, "goal": goal})
    return SimpleNamespace(index=idx, problem=problem, success=success, final_state="", turns=turns)


def test_copying_the_tools_first_move_is_told_from_reading(tmp_path):
    store = RunStore(tmp_path / "run.db")
    episodes = [
        # main split: the tool's first move is also toward G; the planner copies the whole list
        _episode(0, [3, 3], [1, 3], "['U', 'U']", "Moves: U U", True),
        # hard split (index >= eval_problems): a detour first (R) while G lies up; the planner copies R
        _episode(1, [3, 3], [0, 3], "['R', 'U', 'U', 'U', 'L']", "Moves: R", False),
        # hard split: the planner reads the coordinates (U) instead
        _episode(2, [3, 3], [0, 3], "['R', 'U', 'U', 'U', 'L']", "Moves: U", False),
    ]
    store.write_step(10, 0.0, episodes, "eval")
    store.close()
    rows = {r["split"]: r for r in summarise(tmp_path / "run.db", eval_problems=1)}
    assert rows["main"]["first_move_is_tools"] == 1 and rows["main"]["answer_is_tools_list"] == 1
    assert rows["main"]["team_success"] == 1
    hard = rows["hard"]
    assert (hard["episodes"], hard["first_move_is_tools"], hard["first_move_toward_goal"]) == (2, 1, 1)
    assert hard["answer_is_tools_list"] == 0 and hard["step"] == 10


def test_a_single_agent_is_read_at_its_first_answer_after_its_program(tmp_path):
    """program_then_answer: turn 0 writes the program (no output shown yet), turn 1 answers from its
    output, turn 3 answers again; only turn 1 counts."""
    printed = "['R', 'U', 'U', 'U', 'L']"
    turns = [
        _turn(0, "agent", "Write the Python program ...", "print(solve(grid))"),
        _turn(1, "agent", _answer_observation(printed), "Moves: R U U U L"),
        _turn(2, "agent", "Write the Python program ...", "print(solve(grid))"),
        _turn(3, "agent", _answer_observation(printed), "Moves: U"),
    ]
    store = RunStore(tmp_path / "run.db")
    store.write_step(0, 0.0, [_episode(0, [3, 3], [0, 3], printed, None, True, turns)], "eval")
    store.close()
    (row,) = summarise(tmp_path / "run.db", eval_problems=1)
    assert (row["episodes"], row["first_move_is_tools"], row["answer_is_tools_list"]) == (1, 1, 1)
    assert row["first_move_toward_goal"] == 0 and row["team_success"] == 1
