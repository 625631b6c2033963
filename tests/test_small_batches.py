"""The small-batch options of the claims issue: rewards equal up to float noise count as tied
(algorithm.tie_tolerance: in the advantage, the filter and the statistics), and a policy whose step
kept too few samples is not updated (algorithm.min_samples)."""

from conftest import ROOT
from fakes import FakeBackend, FakeEngine

from mas_lab.algo.advantage import grpo_advantages, is_zero_std, rloo_advantages
from mas_lab.algo.credit import Credit, assign_advantages
from mas_lab.algo.filters import filter_groups
from mas_lab.algo.groups import Candidate, group_stats
from mas_lab.config import load_task
from mas_lab.records.store import RunStore
from mas_lab.training.trainer import Trainer

NOISE = [0.1 + 0.2 + 0.3, 0.3 + 0.2 + 0.1, 0.6]  # 0.6000000000000001, 0.6, 0.6: one sum in two orders


def test_float_noise_is_a_signal_without_the_tolerance_and_a_tie_with_it():
    assert len(set(NOISE)) == 2  # the noise is real
    # a group of noise is not a tie: it is kept by the filter and trained on with tiny nonzero advantages
    assert not is_zero_std(NOISE) and max(abs(a) for a in grpo_advantages(NOISE)) > 0
    assert is_zero_std(NOISE, 1e-9)
    assert grpo_advantages(NOISE, tol=1e-9) == [0.0] * 3 and rloo_advantages(NOISE, 1e-9) == [0.0] * 3
    assert not is_zero_std([0.5, 0.5 + 1e-6], 1e-9)  # a real difference stays a signal


def _candidates(rewards):
    return [
        Candidate(
            problem_id="p",
            role="r",
            turn=0,
            index=i,
            policy="shared",
            prompt_ids=[1],
            response_ids=[2],
            response="x",
            reward=r,
            team=r,
            local=0.0,
        )
        for i, r in enumerate(rewards)
    ]


def test_the_filter_the_statistics_and_the_advantages_agree_on_a_noisy_tie():
    groups = assign_advantages([("p", _candidates(NOISE))], "at_grpo", Credit(3, 1e-6, tie_tol=1e-9))
    assert all(c.advantage == 0.0 for c in groups[0].members)
    kept, report = filter_groups(groups, "zero_std", 1e-9)
    assert kept == [] and report.dropped_groups == 1
    assert group_stats(groups[0], kept=False, tol=1e-9).zero_std
    loose = assign_advantages([("p", _candidates(NOISE))], "at_grpo", Credit(3, 1e-6))
    assert filter_groups(loose, "zero_std")[0] == loose  # the default: only exact ties are ties


def test_a_policy_with_fewer_samples_than_min_samples_is_not_updated(tmp_path):
    task = load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=4", "algorithm.min_samples=100000"])
    backend = FakeBackend(FakeEngine())
    store = RunStore(tmp_path / "run.db")
    result = Trainer(task, backend, store).train_step(1)
    assert backend.updates[0] == {"shared": []}
    assert result.metrics["skipped_updates"] == 1.0
    (event,) = store.rows("SELECT message FROM events WHERE kind = 'skip'")
    assert "< algorithm.min_samples 100000" in event["message"]
    plain = FakeBackend(FakeEngine())
    Trainer(load_task(ROOT / "tasks" / "toy.yaml", ["algorithm.k=4"]), plain, RunStore(tmp_path / "b.db")).train_step(1)
    assert len(plain.updates[0]["shared"]) > 0


def test_a_first_step_whose_groups_all_tie_is_announced(tmp_path):
    """A task with no signal at step 1 spent minutes a step training nothing, without a word."""
    from mas_lab.actors.backend import Backend

    task = load_task(
        ROOT / "tasks" / "toy.yaml",
        [
            "train.steps=1",
            "train.eval_every=0",
            "checkpoint.every=0",
            "roles.0.sampling.temperature=0.01",
            "roles.1.sampling.temperature=0.01",
            "algorithm.k=2",
            "train.problems_per_step=1",
        ],
    )
    said = []
    trainer = Trainer(task, Backend(task, use_ray=False), RunStore(tmp_path / "run.db"), run_dir=tmp_path)
    try:
        trainer.run(lambda event: said.append(event.phase))
    finally:
        trainer.backend.shutdown()
    tied = trainer.store.metrics(1)[1]["zero_std_frac"] == 1.0
    assert tied  # near-greedy sampling of a tiny untrained model: K identical replies
    warned = [m for (m,) in trainer.store.db.execute("SELECT message FROM events WHERE kind = 'warning'")]
    assert tied == any("every group of step 1 tied" in m for m in warned)
    assert tied == any(p.startswith("warning: every group of step 1 tied") for p in said)
