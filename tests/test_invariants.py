"""The invariants of docs/algorithm.md, pinned with the scripted engine and the toy env."""

import pytest
from conftest import ROOT
from fakes import FakeBackend, FakeEngine

from mas_lab.algo.credit import Credit
from mas_lab.config import TaskConfig, load_task
from mas_lab.envs import ProblemPool, ToyEnv
from mas_lab.records.store import RunStore
from mas_lab.training.episodes import Episode, tree_rollout
from mas_lab.training.trainer import Trainer, compute_advantages


def rollout(task, engine, problems=3):
    pool = ProblemPool(ToyEnv, task.env.params, 0, 0)
    episodes = [Episode(i, pool.train(i), pool.make(pool.train(i))) for i in range(problems)]
    tree_rollout(task, episodes, engine, task.algorithm.k, seed=0)
    groups = compute_advantages(episodes, "at_grpo", Credit.of(task.algorithm, task.roles))
    return episodes, groups


@pytest.fixture
def task():
    return load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=4", "env.max_turns=3"])


def test_1_every_group_has_k_members_one_prompt_problem_agent_turn(task):
    episodes, groups = rollout(task, FakeEngine())
    assert len(groups) == 3 * 3 * 2  # problems x turns x agents
    for group in groups:
        assert len(group.members) == 4
        assert len({m.prompt_hash for m in group.members}) == 1
        assert len({(m.problem_id, m.role, m.turn) for m in group.members}) == 1


def test_1_all_k_candidates_come_from_one_batched_call_per_turn_and_agent(task):
    engine = FakeEngine()
    rollout(task, engine)
    assert len(engine.calls) == 3 * 2  # one call per (turn, agent), all problems batched
    assert all(call["n"] == 4 and len(call["prompts"]) == 3 for call in engine.calls)


def test_2_the_live_state_advances_with_every_chosen_action(task):
    episodes, _ = rollout(task, FakeEngine())
    for episode in episodes:
        chosen_so_far = []
        for turn in episode.turns:
            # the observation shows every earlier chosen action, in order, and nothing else
            history = turn.observation.splitlines()[1:]
            assert history == [f"{r}@{t}: {a}" for t, r, a in chosen_so_far]
            chosen = turn.candidates[turn.chosen]
            chosen_so_far.append((turn.turn, turn.role, chosen.response))
        assert [a for _, _, a in episode.env.history] == [a for _, _, a in chosen_so_far]


def test_3_each_candidate_is_scored_on_its_own_copy(task):
    episodes, _ = rollout(task, FakeEngine())
    for episode in episodes:
        chosen_scores = []
        for turn in episode.turns:
            for c in turn.candidates:
                own = c.response.count("a") / len(c.response)
                assert c.local == pytest.approx(own)
                # team = mean over the chosen past plus this candidate only (never its siblings)
                assert c.team == pytest.approx((sum(chosen_scores) + own) / (len(chosen_scores) + 1))
            chosen_scores.append(turn.candidates[turn.chosen].local)


def test_chosen_is_the_best_candidate_with_ties_to_the_lowest_index(task):
    episodes, _ = rollout(task, FakeEngine(lambda c, n: "ab" if c in (1, 2) else "b"))
    for turn in episodes[0].turns:
        assert turn.chosen == 1
        assert [c.chosen for c in turn.candidates] == [False, True, False, False]


def test_4_padding_and_duplicates_never_enter_a_group(task):
    episodes, groups = rollout(task, FakeEngine())
    members = [m for g in groups for m in g.members]
    assert len(members) == len({(m.problem_id, m.role, m.turn, m.index) for m in members})
    assert sum(len(t.candidates) for e in episodes for t in e.turns) == len(members)


def test_5_advantages_sum_to_zero_and_zero_std_groups_get_zero(task):
    _, groups = rollout(task, FakeEngine())
    for group in groups:
        assert abs(sum(m.advantage for m in group.members)) < 1e-6
    _, flat = rollout(task, FakeEngine(lambda c, n: "a"))
    assert all(m.advantage == 0.0 for g in flat for m in g.members)


def test_6_samples_are_routed_only_to_their_role_policy(tmp_path):
    data = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=4"]).model_dump()
    data["policies"] = {"p_first": {"model": "tiny-test"}, "p_second": {"model": "tiny-test"}}
    data["roles"][0]["policy"], data["roles"][1]["policy"] = "p_first", "p_second"
    task = TaskConfig.model_validate(data)
    backend = FakeBackend(FakeEngine())
    trainer = Trainer(task, backend, RunStore(tmp_path / "run.db"))
    trainer.train_step(1)
    samples = backend.updates[0]
    assert set(samples) == {"p_first", "p_second"}
    prompts_first = {tuple(s.prompt_ids) for s in samples["p_first"]}
    prompts_second = {tuple(s.prompt_ids) for s in samples["p_second"]}
    assert prompts_first and prompts_second and not prompts_first & prompts_second
    assert all(" first: write" in "".join(map(chr, p)) for p in prompts_first)
    assert all(" second: write" in "".join(map(chr, p)) for p in prompts_second)
    assert {call["policy"] for call in backend.generate.calls} == {"p_first", "p_second"}


def test_7_team_and_local_are_stored_separately_and_alpha_is_per_agent(tmp_path):
    task = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=4", "roles.0.alpha=0.5", "roles.1.alpha=2.0"])
    store = RunStore(tmp_path / "run.db")
    Trainer(task, FakeBackend(FakeEngine()), store).train_step(1)
    rows = store.rows(
        "SELECT t.role, c.reward, c.team, c.local, c.components FROM candidates c JOIN turns t ON c.turn_id = t.id"
    )
    assert rows
    for row in rows:
        alpha = 0.5 if row["role"] == "first" else 2.0
        assert row["reward"] == pytest.approx(alpha * row["team"] + row["local"])
        assert '"letter_fraction"' in row["components"]
    assert any(r["team"] != r["local"] for r in rows)


def test_distinct_problems_per_step_even_when_the_generator_repeats(tmp_path):
    task = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=2", "train.problems_per_step=6"])
    trainer = Trainer(task, FakeBackend(FakeEngine()), RunStore(tmp_path / "run.db"))
    result = trainer.train_step(1)
    assert len({e.problem.id for e in result.episodes}) == 6


def test_a_roles_system_prompt_from_the_task_file_replaces_the_environments(tmp_path):
    task = load_task(ROOT / "tasks" / "plan_path_tiny.yaml", ['roles.1.system_prompt="Answer with Moves: only."'])
    engine = FakeEngine()
    trainer = Trainer(task, FakeBackend(engine), RunStore(tmp_path / "run.db"))
    trainer.train_step(1)
    by_policy_call = [call["prompts"][0] for call in engine.calls]
    tool, planner = by_policy_call[0], by_policy_call[1]
    assert planner[0] == {"role": "system", "content": "Answer with Moves: only."}
    assert tool[0]["role"] == "system" and "tool agent" in tool[0]["content"]
