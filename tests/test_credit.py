"""Credit assignment side by side (algorithm.advantage): the invariants each method promises, a
hand-computed example of each, and the advantages a real toy run stored recomputed from its store."""

import json
import statistics

import pytest

from mas_lab.algo import Candidate
from mas_lab.algo.advantage import grpo_advantages, rloo_advantages
from mas_lab.algo.credit import OUTCOME, Credit, assign_advantages, build_agent_groups, build_step_groups


def cand(problem="p", role="a", turn=0, index=0, reward=0.0, prompt=(1, 2)):
    return Candidate(
        problem_id=problem,
        role=role,
        turn=turn,
        index=index,
        policy="shared",
        prompt_ids=list(prompt),
        response_ids=[5],
        response="x",
        reward=reward,
        team=reward,
        local=0.0,
    )


def test_rloo_by_hand_sums_to_zero_and_is_zero_for_equal_rewards():
    assert rloo_advantages([1.0, 0.0, 0.0, 0.0]) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert sum(rloo_advantages([0.3, 0.9, 0.1, 0.7])) == pytest.approx(0.0, abs=1e-12)
    assert rloo_advantages([0.5] * 4) == [0.0] * 4
    rewards = [0.2, 0.6, 0.4]  # K / (K - 1) times the centred reward
    assert rloo_advantages(rewards) == pytest.approx([1.5 * (r - 0.4) for r in rewards])


def test_at_grpo_and_rloo_share_groups_and_signs():
    tree = [("p", [cand(index=i, reward=r) for i, r in enumerate([1.0, 0.0, 0.5, 0.5])])]
    grpo = [c.advantage for g in assign_advantages(tree, "at_grpo", Credit(4, 1e-6, True)) for c in g.members]
    rloo = [c.advantage for g in assign_advantages(tree, "rloo", Credit(4, 1e-6, True)) for c in g.members]
    assert [a > 0 for a in grpo] == [a > 0 for a in rloo] and sum(rloo) == pytest.approx(0.0)


def test_dr_mas_normalises_per_agent_over_its_turns():
    """Two agents whose rewards live on different scales: each is normalised by its own (problem,
    agent) statistics, not by the other's (a shared baseline would leave the small-scale agent's
    advantages nearly flat)."""
    big = [cand(role="tool", turn=t, index=i, reward=10.0 * (i + t)) for t in (0, 1) for i in range(2)]
    small = [cand(role="planner", turn=t, index=i, reward=0.01 * (i + t)) for t in (0, 1) for i in range(2)]
    groups = assign_advantages([("p", big + small)], "dr_mas", Credit(2, 1e-9))
    assert sorted((g.key.role, g.key.turn, len(g.members)) for g in groups) == [("planner", -1, 4), ("tool", -1, 4)]
    for role in ("tool", "planner"):
        advantages = [c.advantage for c in big + small if c.role == role]
        assert advantages == pytest.approx(grpo_advantages([0.0, 1.0, 1.0, 2.0], 1e-9), rel=1e-6)
        assert sum(advantages) == pytest.approx(0.0, abs=1e-9)
    alone = cand(role="lonely", reward=3.0)
    assert build_agent_groups([alone]) == [] and alone.advantage == 0.0


def test_gigpo_adds_a_step_advantage_among_samples_that_met_the_same_observation():
    """Three trajectories of one problem: the first agent's observation is the same in all three
    (an anchor state); the normalised discounted returns from its action on (its reward plus
    gamma times the second agent's, GiGPO's step return) add to the episode's advantage."""
    trajectories = []
    for j, (first, second) in enumerate([(1.0, 1.0), (0.0, 0.0), (0.0, 1.0)]):
        trajectories.append(
            (
                "p",
                [
                    cand(role="a", index=0, reward=first, prompt=(1, 2)),
                    cand(role="b", index=0, reward=second, prompt=(3, j)),
                ],
            )
        )
    episode = grpo_advantages([statistics.fmean([a.reward, b.reward]) for _, (a, b) in trajectories])
    step = grpo_advantages([1.0 + 0.9 * 1.0, 0.0 + 0.9 * 0.0, 0.0 + 0.9 * 1.0])  # by hand: r_a + gamma * r_b
    assign_advantages(trajectories, "gigpo", Credit(3, 1e-6, False, step_weight=0.5, step_gamma=0.9))
    for j, (_, (a, b)) in enumerate(trajectories):
        assert a.advantage == pytest.approx(episode[j] + 0.5 * step[j])
        assert b.advantage == pytest.approx(episode[j])  # its observations all differ: no step group
    assert [len(g) for g in build_step_groups([c for _, unit in trajectories for c in unit])] == [3]
    # the second agent's return counts: with gamma 0 the anchor's step advantage sees 1, 0, 0
    assign_advantages(trajectories, "gigpo", Credit(3, 1e-6, False, step_weight=0.5, step_gamma=0.0))
    own = grpo_advantages([1.0, 0.0, 0.0])
    assert [a.advantage for _, (a, _) in trajectories] == pytest.approx([e + 0.5 * s for e, s in zip(episode, own)])
    assert own[2] != pytest.approx(step[2])  # the third trajectory's later success changes its anchor credit
    with pytest.raises(ValueError, match="independent trajectories"):
        assign_advantages(trajectories, "gigpo", Credit(3, 1e-6, True))


def test_step_returns_by_hand():
    """G_t = r_t + gamma * G_{t+1} along each trajectory's actions, 0 after the last."""
    from mas_lab.algo.credit import step_returns

    a, b, c = cand(reward=1.0), cand(reward=0.0), cand(reward=2.0)
    d = cand(reward=5.0)
    returns = step_returns([("p", [a, b, c]), ("p", [d])], 0.5)
    assert [returns[id(x)] for x in (a, b, c, d)] == pytest.approx([1.0 + 0.5 * (0.0 + 0.5 * 2.0), 1.0, 2.0, 5.0])


def test_gigpo_advantages_recomputed_from_a_real_runs_store(tmp_path):
    """A real toy step in trajectory mode with gigpo: each episode's stored candidates, in the order
    they acted, regrouped by their stored prompt hashes and run through the method again, give the
    stored advantages."""
    from conftest import ROOT

    from mas_lab.actors.backend import Backend
    from mas_lab.config import load_task
    from mas_lab.records.store import RunStore
    from mas_lab.training.trainer import Trainer

    overrides = [
        "algorithm.mode=trajectories",
        "algorithm.advantage=gigpo",
        "algorithm.step_gamma=0.8",
        "train.steps=1",
    ]
    task = load_task(ROOT / "tasks" / "toy.yaml", overrides)
    trainer = Trainer(task, Backend(task, use_ray=False), RunStore(tmp_path / "run.db"))
    trainer.train_step(1)
    rows = trainer.store.rows(
        "SELECT e.id AS episode, e.problem_id, t.role, t.turn, c.idx, c.reward, c.prompt_hash, c.advantage FROM"
        " candidates c JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id"
        " WHERE e.kind = 'train' ORDER BY e.id, t.turn, t.id, c.id"
    )
    episodes: dict = {}
    for r in rows:
        c = cand(r["problem_id"], r["role"], r["turn"], r["idx"], r["reward"], prompt=(int(r["prompt_hash"], 16),))
        episodes.setdefault(r["episode"], (r["problem_id"], []))[1].append(c)
    trajectories = list(episodes.values())
    assert {len(unit) for _, unit in trajectories} == {4}  # 2 agents x 2 turns, one action each
    assert any(len(g) > 1 for g in build_step_groups([c for _, unit in trajectories for c in unit]))
    assign_advantages(trajectories, "gigpo", Credit(task.algorithm.k, task.algorithm.std_eps, False, step_gamma=0.8))
    rebuilt = [c.advantage for _, unit in trajectories for c in unit]
    assert rebuilt == pytest.approx([r["advantage"] for r in rows], abs=1e-5)


@pytest.mark.parametrize("method", ["at_grpo", "rloo", "dr_mas", "pooled", "counterfactual"])
def test_equal_rewards_give_zero_advantages(method):
    tree = [("p", [cand(index=i, reward=0.7) for i in range(4)])]
    for c in tree[0][1]:
        c.components[OUTCOME] = 0.3
    groups = assign_advantages(tree, method, Credit(4, 1e-6, True))
    assert all(c.advantage == 0.0 for g in groups for c in g.members)


@pytest.mark.parametrize("method", ["rloo", "dr_mas", "pooled", "counterfactual"])
def test_a_run_stores_the_advantages_its_method_gives(tmp_path, method):
    """Recomputed from the store: a real toy step's stored rewards, regrouped and run through the
    method again, give the stored advantages (and, for dr_mas, its stored groups)."""
    from conftest import ROOT

    from mas_lab.actors.backend import Backend
    from mas_lab.config import load_task
    from mas_lab.records.store import RunStore
    from mas_lab.training.trainer import Trainer

    task = load_task(ROOT / "tasks" / "toy.yaml", [f"algorithm.advantage={method}", "train.steps=1"])
    trainer = Trainer(task, Backend(task, use_ray=False), RunStore(tmp_path / "run.db"))
    trainer.train_step(1)
    store = trainer.store
    rows = store.rows(
        "SELECT e.problem_id, t.role, t.turn, c.idx, c.reward, c.components, c.advantage FROM candidates c JOIN turns t ON"
        " c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id WHERE e.kind = 'train' ORDER BY c.id"
    )
    rebuilt = [cand(r["problem_id"], r["role"], r["turn"], r["idx"], r["reward"]) for r in rows]
    for c, r in zip(rebuilt, rows):
        c.components = json.loads(r["components"])
    assert (method == "counterfactual") == all(OUTCOME in c.components for c in rebuilt)
    by_turn: dict = {}
    for c in rebuilt:
        by_turn.setdefault((c.problem_id, c.role, c.turn), []).append(c)
    assign_advantages(
        [("x", [c for group in by_turn.values() for c in group])],
        method,
        Credit(task.algorithm.k, task.algorithm.std_eps),
    )
    assert [c.advantage for c in rebuilt] == pytest.approx([r["advantage"] for r in rows], abs=1e-5)
    if method == "dr_mas":
        assert {(g.role, g.turn) for g in store.groups(1)} == {("first", -1), ("second", -1)}
    if method == "pooled":
        assert {(g.role, g.turn) for g in store.groups(1)} == {("*", -1)}


def test_a_roles_own_k_sizes_its_groups_and_needs_tree_sampling(tmp_path):
    """roles[].k: the toy's first role samples 2 candidates per group, the second
    algorithm.k = 4; build_groups checks each group against its role's K; trajectory modes refuse it."""
    from conftest import ROOT
    from fakes import FakeEngine

    from mas_lab.config import TaskFileError, load_task
    from mas_lab.envs import ProblemPool, ToyEnv
    from mas_lab.training.episodes import Episode, tree_rollout
    from mas_lab.training.trainer import compute_advantages

    task = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=4", "roles.0.k=2"])
    pool = ProblemPool(ToyEnv, task.env.params, 0, 0)
    episodes = [Episode(i, pool.train(i), pool.make(pool.train(i))) for i in range(3)]
    engine = FakeEngine()
    tree_rollout(task, episodes, engine, task.algorithm.k, seed=0)
    assert [call["n"] for call in engine.calls] == [2, 4, 2, 4]  # (turn, agent) in order
    groups = compute_advantages(episodes, "at_grpo", Credit(4, 1e-6, role_k={"first": 2}))
    sizes = {(g.key.role, len(g.members)) for g in groups}
    assert sizes == {("first", 2), ("second", 4)}
    from mas_lab.algo import GroupError

    with pytest.raises(GroupError, match="expected exactly K=4"):
        compute_advantages(episodes, "at_grpo", Credit(4, 1e-6))  # without the role's own K its groups are short
    greedy = [Episode(i, pool.train(i), pool.make(pool.train(i))) for i in range(2)]
    engine = FakeEngine()
    tree_rollout(task, greedy, engine, 1, seed=0, greedy=True)  # evaluation: one candidate, whatever k
    assert {call["n"] for call in engine.calls} == {1}
    with pytest.raises(TaskFileError, match="field 'roles.0.k': a role's own K needs tree sampling"):
        load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.mode=trajectories", "roles.0.k=2"])


def test_role_grad_norms_measure_each_roles_samples_alone():
    """algorithm.role_grad_norms: per role, the gradient norm of its own samples' loss; a role whose
    advantages are all zero has norm 0; the update itself is the same as without the diagnostic."""
    import torch

    from mas_lab.config import Algorithm
    from mas_lab.learner.learner import Learner
    from mas_lab.learner.samples import Sample
    from mas_lab.modeling.models import resolve

    folder = resolve("tiny-test")
    samples = [Sample([1, 2, 3], [4, 5], 1.0 if i % 2 else -1.0, role="planner") for i in range(4)] + [
        Sample([1, 2, 6], [7, 8, 9], 0.0, role="tool") for _ in range(3)
    ]
    torch.manual_seed(0)
    plain = Learner(folder, Algorithm(lr=1e-2), threads=1)
    torch.manual_seed(0)
    measured = Learner(folder, Algorithm(lr=1e-2, role_grad_norms=True), threads=1)
    out = measured.update({"shared": samples})["shared"]
    base = plain.update({"shared": samples})["shared"]
    norms = {k.split("/")[1]: v for k, v in out.items() if k.startswith("grad_norm_role/")}
    assert set(norms) == {"planner", "tool"} and norms["tool"] == 0.0 and norms["planner"] > 0
    assert out["grad_norm"] == pytest.approx(base["grad_norm"], rel=1e-5) and out["loss"] == pytest.approx(base["loss"])
    # by hand: the planner's samples alone, the same loss, one backward
    again = Learner(folder, Algorithm(lr=1e-2), threads=1)
    from mas_lab.algo.loss import clipped_policy_loss

    params = again.params["shared"]
    batch = again._batch([s for s in samples if s.role == "planner"])
    logp = again._logp(batch)
    loss, _ = clipped_policy_loss(logp, logp.detach(), batch.advantages, batch.mask, normalizer=float(batch.mask.sum()))
    loss.backward()
    assert norms["planner"] == pytest.approx(float(torch.nn.utils.clip_grad_norm_(params, float("inf"))), rel=1e-4)
    assert not any(k.startswith("grad_norm_role/") for k in plain.update({"shared": samples[:4]})["shared"])


def test_counterfactual_credit_by_hand_on_the_toy_tree():
    """K = 2 on the toy (2 roles x 2 turns): candidate 0 writes 'b' (score 0), candidate 1 'a'
    (score 1); a greedy continuation writes 'b'. Each candidate's credit is the team value of its
    branch continued to the end (the mean of the four scores) plus its own score; the leave-one-out
    advantage of K = 2 is the difference. At the last action the credit is the reward itself."""
    from conftest import ROOT
    from fakes import FakeEngine

    from mas_lab.config import load_task
    from mas_lab.envs import ProblemPool, ToyEnv
    from mas_lab.training.episodes import Episode, tree_rollout
    from mas_lab.training.trainer import compute_advantages

    task = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=2", "algorithm.advantage=counterfactual"])
    pool = ProblemPool(ToyEnv, task.env.params, 0, 0)
    episode = Episode(0, pool.train(0), pool.make(pool.train(0)))
    engine = FakeEngine()
    tree_rollout(task, [episode], engine, 2, seed=0)
    # the tree's 4 calls of K = 2, and greedy continuations of one candidate: 3 + 2 + 1 + 0 calls
    assert sorted(call["n"] for call in engine.calls) == [1] * 6 + [2] * 4
    outcomes = [tuple(c.components[OUTCOME] for c in t.candidates) for t in episode.turns]
    expected = [(0.0, 1.25), (0.25, 1.5), (0.5, 1.75), (0.75, 2.0)]
    assert [o == pytest.approx(e) for o, e in zip(outcomes, expected)] == [True] * 4
    last = episode.turns[-1].candidates
    assert [c.components[OUTCOME] for c in last] == pytest.approx([c.reward for c in last])
    compute_advantages([episode], "counterfactual", Credit(2, 1e-6))
    for t, (low, high) in zip(episode.turns, outcomes):
        assert [c.advantage for c in t.candidates] == pytest.approx([low - high, high - low])


def test_counterfactual_continuations_never_change_the_sampled_tree():
    """The continuations run on clones: the candidates, rewards, chosen branches and live states
    are those of the same rollout under at_grpo; only the credit differs."""
    from conftest import ROOT
    from fakes import FakeEngine

    from mas_lab.config import load_task
    from mas_lab.envs import ProblemPool, ToyEnv
    from mas_lab.training.episodes import Episode, tree_rollout

    def rollout(method):
        task = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=3", f"algorithm.advantage={method}"])
        pool = ProblemPool(ToyEnv, task.env.params, 0, 0)
        episodes = [Episode(i, pool.train(i), pool.make(pool.train(i))) for i in range(3)]
        tree_rollout(task, episodes, FakeEngine(lambda c, n, row: "ab"[(c + row) % 2] * (c + 1)), 3, seed=0)
        return [
            [(t.role, t.turn, t.chosen, t.state_after, [(c.response, c.reward) for c in t.candidates]) for t in e.turns]
            + [e.final_state, e.success]
            for e in episodes
        ]

    assert rollout("counterfactual") == rollout("at_grpo")


def test_counterfactual_credit_needs_the_tree_and_a_sequential_workflow():
    from conftest import ROOT

    from mas_lab.config import TaskFileError, load_task

    with pytest.raises(TaskFileError, match="counterfactual continues each candidate's own branch"):
        load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.mode=trajectories", "algorithm.advantage=counterfactual"])
    with pytest.raises(TaskFileError, match="needs a sequential workflow"):
        load_task(ROOT / "tasks" / "math.yaml", ["algorithm.advantage=counterfactual"])
    bare = [("p", [cand(index=i, reward=float(i)) for i in range(2)])]
    with pytest.raises(ValueError, match="no counterfactual outcome"):
        assign_advantages(bare, "counterfactual", Credit(2, 1e-6, True))
    with pytest.raises(ValueError, match="needs tree sampling"):
        assign_advantages(bare, "counterfactual", Credit(2, 1e-6, False))


def test_pooled_puts_every_agents_samples_of_a_problem_in_one_group_which_dr_mas_splits():
    """What Dr. MAS fixes, by hand: an agent whose rewards live on a larger scale. Pooled (one group
    per problem over every agent's samples, each with its own reward, as verl's GRPO without
    group_by_agent_id) ranks the small-scale agent's samples below the large one's, so all of its
    samples get negative advantages; Dr. MAS's per-agent groups give each agent zero-mean ones."""
    big = [cand(role="a", index=i, reward=r) for i, r in enumerate([10.0, 12.0])]
    small = [cand(role="b", index=i, reward=r) for i, r in enumerate([0.0, 1.0])]
    trajectories = [("p", [big[0], small[0]]), ("p", [big[1], small[1]])]
    (group,) = assign_advantages(trajectories, "pooled", Credit(2, 1e-9, False))
    assert group.key.role == "*" and len(group.members) == 4
    expected = grpo_advantages([10.0, 0.0, 12.0, 1.0], 1e-9)
    assert [c.advantage for c in (big[0], small[0], big[1], small[1])] == pytest.approx(expected)
    assert all(c.advantage < 0 for c in small)  # even b's better sample: a's scale swamps it
    assign_advantages(trajectories, "dr_mas", Credit(2, 1e-9, False))
    assert [c.advantage for c in small] == pytest.approx(grpo_advantages([0.0, 1.0], 1e-9))
    assert [c.advantage for c in big] == pytest.approx(grpo_advantages([10.0, 12.0], 1e-9))


def test_gigpo_outcome_normalises_the_episode_outcome_not_the_mean_shaped_reward():
    """GiGPO's Eq. 3 normalises each trajectory's return; its environments reward the episode's
    end. With gigpo_episode outcome the episode term is the episodes' final team rewards: two
    trajectories of equal mean shaped reward but different outcomes are told apart, and two of
    different shaped rewards but the same outcome are not."""
    rows = [(0.9, 0.9, 0.0), (0.1, 0.1, 1.0), (0.5, 0.5, 1.0)]  # (reward a, reward b, outcome)
    trajectories = [
        ("p", [cand(role="a", reward=a, prompt=(1, j)), cand(role="b", reward=b, prompt=(2, j))])
        for j, (a, b, _) in enumerate(rows)
    ]
    outcomes = [o for *_, o in rows]
    assign_advantages(trajectories, "gigpo", Credit(3, 1e-6, False, gigpo_episode="outcome"), outcomes=outcomes)
    episode = grpo_advantages(outcomes, 1e-6)
    assert [unit[1].advantage for _, unit in trajectories] == pytest.approx(episode)  # b: no step group
    assert trajectories[1][1][1].advantage == pytest.approx(trajectories[2][1][1].advantage)
    assign_advantages(trajectories, "gigpo", Credit(3, 1e-6, False))  # mas-lab's variant: the mean shaped reward
    assert trajectories[0][1][1].advantage > 0 > trajectories[1][1][1].advantage  # the failed episode ranks first
    with pytest.raises(ValueError, match="needs each trajectory's outcome"):
        assign_advantages(trajectories, "gigpo", Credit(3, 1e-6, False, gigpo_episode="outcome"))


def test_counterfactual_outcome_credit_is_the_continued_outcome_alone():
    """C3's credit is terminal: with counterfactual_credit outcome a candidate's credit is alpha x
    its continued branch's final team value, without its own local reward (the toy tree of the
    by-hand test above: each credit there minus the candidate's own score)."""
    from conftest import ROOT
    from fakes import FakeEngine

    from mas_lab.config import load_task
    from mas_lab.envs import ProblemPool, ToyEnv
    from mas_lab.training.episodes import Episode, tree_rollout

    def credits(extra):
        task = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=2", "algorithm.advantage=counterfactual", *extra])
        pool = ProblemPool(ToyEnv, task.env.params, 0, 0)
        episode = Episode(0, pool.train(0), pool.make(pool.train(0)))
        tree_rollout(task, [episode], FakeEngine(), 2, seed=0)
        return [[(c.components[OUTCOME], c.local) for c in t.candidates] for t in episode.turns]

    both, alone = credits([]), credits(["algorithm.counterfactual_credit=outcome"])
    for turn_both, turn_alone in zip(both, alone):
        for (with_local, local), (outcome, _) in zip(turn_both, turn_alone):
            assert outcome == pytest.approx(with_local - local)
    assert any(local for turn in both for _, local in turn)  # the local rewards were not all zero


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["algorithm.gigpo_episode=outcome"], "gigpo_episode: a setting of advantage gigpo, not at_grpo"),
        (["algorithm.counterfactual_credit=outcome"], "counterfactual_credit: a setting of advantage counterfactual"),
    ],
)
def test_a_variant_of_another_method_is_refused(overrides, said):
    from conftest import ROOT

    from mas_lab.config import TaskFileError, load_task

    with pytest.raises(TaskFileError, match=said):
        load_task(ROOT / "tasks" / "toy.yaml", overrides)


def test_the_task_files_methods_are_the_registrys():
    """One owner per credit method: algorithm.advantage allows exactly the registered methods, and
    what each needs is stated by its registration (the task file's checks read it)."""
    import typing

    from mas_lab.algo.credit import METHODS
    from mas_lab.config import Algorithm

    allowed = typing.get_args(Algorithm.model_fields["advantage"].annotation)
    assert list(allowed) == list(METHODS)
    assert [m for m in METHODS if not METHODS[m].tree] == ["gigpo"]
    assert [m for m in METHODS if METHODS[m].continuations] == ["counterfactual"]
