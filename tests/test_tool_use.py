"""experiments/tool_use.py tells a planner that copies the tool's first move from one that reads the
coordinates, on a store written by the real RunStore."""

import sys
from types import SimpleNamespace

from conftest import ROOT

from mas_lab.algo import Candidate
from mas_lab.records.store import RunStore

sys.path.insert(0, str(ROOT / "experiments"))
from tool_use import summarise  # noqa: E402


def _episode(idx, start, goal, printed, answer, success):
    observation = f"S is at ...\nIts output:\n{printed}\nEnd with one line 'Moves:'"
    candidate = Candidate("p", "planner", 0, 0, "shared", [1], [2], answer, 1.0, 1.0, 0.0, chosen=True)
    turn = SimpleNamespace(
        turn=0,
        role="planner",
        policy="shared",
        observation=observation,
        chosen=0,
        state_after="",
        system="",
        candidates=[candidate],
    )
    problem = SimpleNamespace(id=f"p{idx}", data={"start": start, "goal": goal})
    return SimpleNamespace(index=idx, problem=problem, success=success, final_state="", turns=[turn])


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
