"""Each algorithm mode builds the groups its definition says (toy env, scripted engine)."""

import pytest
from conftest import ROOT
from fakes import FakeBackend, FakeEngine

from mas_lab.analysis.reporting import wilson_interval
from mas_lab.config import TaskConfig, TaskFileError, as_mode, load_task, swap_policies
from mas_lab.records.store import RunStore
from mas_lab.training.trainer import Trainer


# row-dependent answers, so the K trajectories of one problem differ
def VARIED(c, n, row):
    return "a" * (row % 4) + "b"


def step(task, tmp_path, engine):
    backend = FakeBackend(engine)
    store = RunStore(tmp_path / "run.db")
    result = Trainer(task, backend, store).train_step(1)
    return result, backend.updates[0], store


def test_at_grpo_groups_are_per_problem_agent_turn(tmp_path):
    task = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=4", "train.problems_per_step=3"])
    result, samples, store = step(task, tmp_path, FakeEngine())
    groups = store.rows("SELECT problem_id, role, turn, n FROM groups")
    assert len(groups) == 3 * 2 * 2 and all(g["n"] == 4 for g in groups)
    assert {(g["role"], g["turn"]) for g in groups} == {("first", 0), ("first", 1), ("second", 0), ("second", 1)}
    assert len(result.episodes) == 3 and len(samples["shared"]) == 3 * 2 * 2 * 4


def test_mas_grpo_groups_are_k_independent_trajectories_per_problem(tmp_path):
    task = load_task(
        ROOT / "tasks" / "toy.yaml", ["algorithm.mode=trajectories", "algorithm.k=4", "train.problems_per_step=3"]
    )
    engine = FakeEngine(VARIED)
    result, samples, store = step(task, tmp_path, engine)
    assert all(call["n"] == 1 and len(call["prompts"]) == 12 for call in engine.calls)  # no branching
    assert len(result.episodes) == 12
    groups = store.rows("SELECT problem_id, role, turn, n, zero_std FROM groups")
    assert len(groups) == 3 and all((g["role"], g["turn"], g["n"]) == ("*", -1, 4) for g in groups)
    by_problem = {}
    for episode in result.episodes:
        by_problem.setdefault(episode.problem.id, []).append(episode)
        advantages = {c.advantage for t in episode.turns for c in t.candidates}
        assert len(advantages) == 1  # one trajectory-level advantage for all its (agent, turn) samples
        assert all(len(t.candidates) == 1 for t in episode.turns)
    for episodes in by_problem.values():
        assert len(episodes) == 4
        assert abs(sum(e.turns[0].candidates[0].advantage for e in episodes)) < 1e-6
    assert len(samples["shared"]) == 12 * 2 * 2  # every (agent, turn) of every trajectory


def test_single_agent_has_one_role_and_groups_per_problem(tmp_path):
    task = load_task(ROOT / "tasks" / "toy_single_agent.yaml", ["algorithm.k=4", "train.problems_per_step=2"])
    assert [r.name for r in task.roles] == ["solver"]
    engine = FakeEngine(VARIED)
    result, samples, store = step(task, tmp_path, engine)
    assert {t.role for e in result.episodes for t in e.turns} == {"solver"}
    groups = store.rows("SELECT role, turn, n FROM groups")
    assert groups == [{"role": "*", "turn": -1, "n": 4}] * 2
    assert len(samples["shared"]) == 2 * 4 * 2  # problems x trajectories x turns


def test_single_agent_mode_requires_the_single_role(tmp_path):
    with pytest.raises(TaskFileError, match="in single_agent mode has the role \\['solver'\\]"):
        load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.mode=single_agent"])


def test_as_mode_and_swap_policies_rewrite_the_role_map():
    data = load_task(ROOT / "tasks" / "toy.yaml").model_dump()
    data["policies"] = {"a": {"model": "tiny-test"}, "b": {"model": "tiny-test"}}
    data["roles"][0]["policy"], data["roles"][1]["policy"] = "a", "b"
    task = TaskConfig.model_validate(data)
    single = as_mode(task, "single_agent")
    assert [(r.name, r.policy) for r in single.roles] == [("solver", "b")] and list(single.policies) == ["b"]
    back = as_mode(single, "team")
    assert [(r.name, r.policy) for r in back.roles] == [("first", "b"), ("second", "b")]
    assert back.algorithm.mode == "tree" and as_mode(single, "mas") == back  # the old name of team
    with pytest.raises(TaskFileError, match=r"unknown evaluation mode 'tree'; allowed: \['team', 'single_agent'\]"):
        as_mode(task, "tree")
    assert [(r.name, r.policy) for r in swap_policies(task).roles] == [("first", "b"), ("second", "a")]


def test_the_old_mode_names_load_as_the_new_ones():
    """Kept runs' task files say at_grpo / mas_grpo: they resolve to the behaviour they were trained with."""
    old = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.mode=mas_grpo"])
    assert old == load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.mode=trajectories"])
    assert old.algorithm.mode == "trajectories"
    assert load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.mode=at_grpo"]).algorithm.mode == "tree"
    assert load_task(ROOT / "tasks" / "toy.yaml").algorithm.mode == "tree"
    with pytest.raises(TaskFileError, match="algorithm.mode.*'tree', 'trajectories' or 'single_agent'"):
        load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.mode=grpo"])


def test_wilson_interval():
    low, high = wilson_interval(5, 10)
    assert low == pytest.approx(0.2366, abs=1e-3) and high == pytest.approx(0.7634, abs=1e-3)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0
