"""A tiny random model learns the toy task under AT-GRPO (real engine and learner, in-process)."""

import statistics

import pytest
import torch
from conftest import ROOT

from mas_lab.actors.backend import Backend
from mas_lab.config import TaskConfig, load_task
from mas_lab.learner.samples import Sample
from mas_lab.records.store import RunStore
from mas_lab.training.trainer import Trainer


@pytest.mark.slow
def test_reward_rises_clearly_within_a_minute(tmp_path):
    task = load_task(ROOT / "tasks" / "toy.yaml", ["train.steps=15", "train.eval_every=0"])
    trainer = Trainer(task, Backend(task, use_ray=False), RunStore(tmp_path / "run.db"))
    rewards = [trainer.train_step(step).metrics["reward/mean"] for step in range(1, 16)]
    # step 1 samples from the untrained model; the last 3 steps from the trained one
    before, after = rewards[0], statistics.fmean(rewards[-3:])
    print(f"toy mean reward: step 1 {before:.3f}, last 3 steps {after:.3f}")
    # the reward is alpha * team + local, both in [0, 1]: from ~0.04 to well over 1
    assert before < 0.3 and after > 1.0, rewards


def two_policy_task(lora: bool) -> TaskConfig:
    data = load_task(ROOT / "tasks" / "toy.yaml").model_dump()
    spec = {"rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]} if lora else None
    data["policies"] = {
        "p_first": {"model": "tiny-test", "lora": spec},
        "p_second": {"model": "tiny-test", "lora": spec},
    }
    data["roles"][0]["policy"], data["roles"][1]["policy"] = "p_first", "p_second"
    return TaskConfig.model_validate(data)


def learner_of(actor):
    """The Learner in an in-process actor (a colocated base's actor holds it: mas_lab/actors/colocated.py)."""
    return getattr(actor, "learner", actor)


def engine_of(actor):
    """The engine of an in-process rollout worker, colocated or not."""
    return getattr(actor, "worker", actor).engine


def clone(state):
    return {k: v.clone() for k, v in state.items()}


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_one_policys_update_never_changes_anothers_weights(lora):
    backend = Backend(two_policy_task(lora), use_ray=False)
    assert len(backend.learners) == (1 if lora else 2)  # LoRA policies share one base
    learner = {p: learner_of(backend.learners[h]) for p, h in backend.base_of.items()}
    before = {p: clone(learner[p].weights(p)) for p in learner}
    base_before = clone({k: v for k, v in learner["p_first"].model.state_dict().items() if "lora_" not in k})
    samples = [Sample([2, 10, 11], [71, 71, 3], a) for a in (1.0, -1.0)]
    result = backend.update({"p_first": samples, "p_second": []})
    assert result["p_first"]["samples"] == 2 and result["p_second"]["samples"] == 0
    assert not same(learner["p_first"].weights("p_first"), before["p_first"]), "the updated policy did not move"
    assert same(learner["p_second"].weights("p_second"), before["p_second"])
    if lora:  # the frozen base never moves
        base_after = {k: v for k, v in learner["p_first"].model.state_dict().items() if "lora_" not in k}
        assert same(base_after, base_before)
    backend.sync_weights(1)
    for policy in ("p_first", "p_second"):
        worker = engine_of(backend.workers[backend.base_of[policy]][0])
        if lora:  # the engine serves each adapter merged into its own weights: W + (alpha / r) B A
            state, merged = learner[policy].weights(policy), worker.merged
            assert set(merged.merged[policy]) == {
                n for n in merged.base if n.rsplit(".", 1)[-1] in ("q_proj", "v_proj")
            }
            for name, weight in merged.merged[policy].items():
                a, b = (state[f"base_model.model.{name}.lora_{x}.weight"].float() for x in "AB")
                assert torch.equal(weight, (merged.base[name].float() + 2.0 * b @ a).to(weight.dtype)), name
        else:
            assert same(worker.model.state_dict(), learner[policy].weights(policy))


@pytest.mark.slow
def test_reward_rises_under_per_role_lora(tmp_path):
    task = load_task(ROOT / "tasks" / "toy_lora.yaml", ["train.steps=15", "train.eval_every=0"])
    trainer = Trainer(task, Backend(task, use_ray=False), RunStore(tmp_path / "run.db"))
    rewards = [trainer.train_step(step).metrics["reward/mean"] for step in range(1, 16)]
    before, after = rewards[0], statistics.fmean(rewards[-3:])
    print(f"toy mean reward under per-role LoRA: step 1 {before:.3f}, last 3 steps {after:.3f}")
    assert before < 0.3 and after > 1.0, rewards


def test_the_format_warm_up_teaches_the_form(tmp_path):
    """train.warmup_steps: supervised steps on random replies in the answer format; the policy's
    log-likelihood of fresh demonstrations (never trained on) rises."""
    import random

    task = load_task(ROOT / "tasks" / "plan_path_tiny.yaml", ["train.warmup_steps=6"])
    backend = Backend(task, use_ray=False)
    trainer = Trainer(task, backend, RunStore(tmp_path / "run.db"))
    env = trainer.pool.make(trainer.pool.train(999))
    learner = learner_of(next(iter(backend.learners.values())))
    probe = learner._batch([Sample(p, r, 0.0) for p, r in _demo_tokens(env, random.Random(7))])

    def nll() -> float:  # mean negative log-likelihood of the fresh demonstrations
        with torch.no_grad():
            return float(-(learner._logp(probe) * probe.mask).sum() / probe.mask.sum())

    before = nll()
    trainer.warm_up()
    after = nll()
    events = [e["message"] for e in trainer.store.events() if e["kind"] == "warmup"]
    assert len(events) == 6 and "nll/shared" in events[0]
    assert after < 0.7 * before, (before, after)


def test_the_warm_up_comes_before_the_first_evaluation_and_is_not_the_kl_reference(tmp_path):
    task = load_task(
        ROOT / "tasks" / "plan_path_tiny.yaml",
        ["train.warmup_steps=2", "train.steps=1", "train.eval_problems=2", "checkpoint.every=0"],
    )
    trainer = Trainer(task, Backend(task, use_ray=False), RunStore(tmp_path / "run.db"))
    trainer.run()
    kinds = [e["kind"] for e in trainer.store.events() if e["kind"] in ("warmup", "eval")]
    assert kinds[:3] == ["warmup", "warmup", "eval"]
    # the KL diagnostic's reference is the policy RL starts from, not the one before the warm-up
    assert trainer.store.metrics(1)[1]["kl_initial/shared"] == 0.0


def _demo_tokens(env, rng):
    from transformers import AutoTokenizer

    from mas_lab.modeling.models import resolve
    from mas_lab.rollout.engine import encode_chat

    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny-test"))
    for role in ("tool", "planner"):
        reply = env.format_demo(role, rng)
        yield (
            encode_chat(tokenizer, env.messages(role, 0)),
            tokenizer.encode(reply, add_special_tokens=False) + [tokenizer.eos_token_id],
        )


def test_a_program_then_answer_agent_warms_up_on_one_demonstration_of_each_kind(tmp_path):
    """The single agent with the tool writes a program, then answers: the warm-up shows it both, as
    the team's tool agent and planner each get theirs (two samples a problem in both)."""
    from fakes import FakeBackend, FakeEngine

    overrides = ["policies.shared.model=tiny-test", "train.warmup_steps=1", "train.problems_per_step=3"]
    for task_file in ("plan_path_tool_single_tool.yaml", "plan_path_tool.yaml"):
        task = load_task(ROOT / "tasks" / task_file, overrides)
        backend = FakeBackend(FakeEngine())
        Trainer(task, backend, RunStore(tmp_path / f"{task.name}.db")).warm_up()
        (samples,) = [update["shared"] for update in backend.updates]
        assert len(samples) == 6 and all(s.demonstration for s in samples), task_file
    from transformers import AutoTokenizer

    from mas_lab.modeling.models import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve("tiny-test"))
    texts = [tokenizer.decode(s.response_ids) for s in samples]
    assert sum(t.startswith("```python") for t in texts) == 3 and sum(t.startswith("Moves:") for t in texts) == 3


def test_a_run_stopped_early_reports_its_latest_evaluation(tmp_path):
    """A run stopped after step 11 with an evaluation at step 10 said "after: not evaluated" and
    nothing of step 10. "After" stays the final step's only (the paired verdicts read it); the
    latest evaluation is reported beside it."""
    from fakes import FakeBackend, FakeEngine

    task = load_task(ROOT / "tasks" / "toy.yaml", ["train.steps=20"])
    trainer = Trainer(task, FakeBackend(FakeEngine()), RunStore(tmp_path / "run.db"))
    for step, success in ((0, 0.25), (10, 0.75)):
        metrics = {"eval/success_rate": success, "eval/success_ci_low": 0.0, "eval/success_ci_high": 1.0}
        trainer.store.write_step(step, 0.0, [], "eval", metrics=metrics)
    trainer.step = 11
    summary = trainer.summary()
    assert summary["after"] is None and summary["stopped"]
    assert summary["latest"]["step"] == 10 and summary["latest"]["success"] == 0.75
    trainer.step = 10
    assert trainer.summary()["latest"] is None  # the last evaluation is the final step's: it is "after"


def _warm_run(tmp_path, name: str, overrides: list[str]) -> Trainer:
    base = ["train.warmup_steps=2", "train.steps=2", "train.eval_problems=2", "checkpoint.every=0"]
    task = load_task(ROOT / "tasks" / "plan_path_tiny.yaml", [*base, *overrides])
    trainer = Trainer(task, Backend(task, use_ray=False), RunStore(tmp_path / f"{name}.db"))
    trainer.run()
    return trainer


def _stable(trainer: Trainer) -> dict:
    from mas_lab.training.metric_names import TIMED

    return {s: {k: v for k, v in m.items() if not k.startswith(TIMED)} for s, m in trainer.store.metrics().items()}


def test_a_shared_warm_up_continues_exactly_as_the_runs_own(tmp_path):
    """train.warmup_cache: an AT-GRPO run trains the warm-up and leaves it; a run that differs only
    in its credit and sampling mode (trajectory GRPO with leave-one-out) takes it, and its every
    metric from step 0 on equals that of the same run warming up itself, bit for bit."""
    cache = f"train.warmup_cache={tmp_path / 'cache'}"
    arm = ["algorithm.mode=trajectories", "algorithm.advantage=rloo"]
    first = _warm_run(tmp_path, "at_grpo", [cache])
    assert any("left in" in e["message"] for e in first.store.events() if e["kind"] == "warmup")
    taken = _warm_run(tmp_path, "taken", [cache, *arm])
    own = _warm_run(tmp_path, "own", arm)
    messages = [e["message"] for e in taken.store.events() if e["kind"] == "warmup"]
    assert (
        len(messages) == 3
        and "taken from" in messages[-1]
        and messages[:2] == [e["message"] for e in own.store.events() if e["kind"] == "warmup"]
    )
    assert sorted(_stable(taken)) == [0, 1, 2] and _stable(taken) == _stable(own)
    assert len(list((tmp_path / "cache").iterdir())) == 1


def test_the_warm_up_fingerprint_ignores_only_what_the_warm_up_never_reads():
    from mas_lab.training.warmup import warmup_fingerprint

    def of(*overrides: str) -> str:
        return warmup_fingerprint(
            load_task(ROOT / "tasks" / "plan_path_tiny.yaml", ["train.warmup_steps=2", *overrides])
        )

    same = of()
    assert of("algorithm.advantage=rloo", "train.steps=9", "train.eval_every=3") == same
    assert of("algorithm.mode=trajectories") == same
    for changed in ("algorithm.lr=0.001", "train.seed=1", "algorithm.grad_clip=20.0", "train.warmup_steps=3"):
        assert of(changed) != same, changed


def test_a_run_started_beside_the_one_training_a_shared_warm_up_waits_then_loads_it(tmp_path):
    """Two arms of a study start together (`--jobs 2`): the second waits on the entry's lock while
    the first trains the warm-up, then loads it, instead of training a second copy into the same
    folder (a rename race)."""
    import fcntl
    import threading

    from fakes import FakeBackend, FakeEngine

    from mas_lab.training.warmup import warmup_fingerprint

    overrides = ["policies.shared.model=tiny-test", "train.warmup_steps=1", f"train.warmup_cache={tmp_path}"]
    task = load_task(ROOT / "tasks" / "plan_path_tiny.yaml", overrides)
    entry = tmp_path / warmup_fingerprint(task)
    entry.mkdir()
    first, second = FakeBackend(FakeEngine()), FakeBackend(FakeEngine())
    with open(entry / "lock", "a") as held:  # the first run, mid-warm-up
        fcntl.flock(held, fcntl.LOCK_EX)
        waiting = Trainer(task, second, RunStore(tmp_path / "second.db"))
        thread = threading.Thread(target=waiting.warm_up)
        thread.start()
        thread.join(timeout=3)
        assert thread.is_alive() and second.updates == []
        Trainer(task, first, RunStore(tmp_path / "first.db"))._warm_up_shared(entry)  # trains and leaves it
    thread.join(timeout=30)
    assert not thread.is_alive() and len(first.updates) == 1 and second.updates == []
    said = [e["message"] for e in waiting.store.events() if e["kind"] == "warmup"]
    assert said[0].startswith("waiting for the run") and said[-1].startswith("format warm-up taken from")
