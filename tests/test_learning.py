"""A tiny random model learns the toy task under AT-GRPO (real engine and learner, in-process)."""
import statistics

import torch

from mas_lab.backend import Backend
from mas_lab.config import TaskConfig, load_task
from mas_lab.controller import Controller
from mas_lab.store import RunStore

from conftest import ROOT


def test_reward_rises_clearly_within_a_minute(tmp_path):
    task = load_task(ROOT / "tasks" / "toy.yaml", ["train.steps=24", "train.eval_every=0"])
    controller = Controller(task, Backend(task, use_ray=False), RunStore(tmp_path / "run.db"))
    rewards = [controller.train_step(step).metrics["reward/mean"] for step in range(1, 25)]
    before, after = statistics.fmean(rewards[:3]), statistics.fmean(rewards[-3:])
    print(f"toy mean reward: first 3 steps {before:.3f}, last 3 steps {after:.3f}")
    # the reward is alpha * team + local, both in [0, 1]: from ~0.04 to well over 1
    assert before < 0.3 and after > 1.0, rewards


def test_one_policys_update_never_changes_anothers_weights():
    data = load_task(ROOT / "tasks" / "toy.yaml").model_dump()
    data["policies"] = {"p_first": {"model": "tiny-test"}, "p_second": {"model": "tiny-test"}}
    data["roles"][0]["policy"], data["roles"][1]["policy"] = "p_first", "p_second"
    backend = Backend(TaskConfig.model_validate(data), use_ray=False)
    first, second = backend.learners["p_first"], backend.learners["p_second"]
    before = {name: {k: v.clone() for k, v in learner.weights().items()} for name, learner in backend.learners.items()}
    samples = [{"prompt_ids": [2, 10, 11], "response_ids": [71, 71, 3], "advantage": a} for a in (1.0, -1.0)]
    backend.update({"p_first": samples, "p_second": []})
    changed = [k for k, v in first.weights().items() if not torch.equal(v, before["p_first"][k])]
    assert changed, "the updated policy did not move"
    assert all(torch.equal(v, before["p_second"][k]) for k, v in second.weights().items())
    backend.sync_weights(1)
    engine = backend.workers["p_first"].engine.model.state_dict()
    assert all(torch.equal(engine[k], v) for k, v in first.weights().items())
    engine = backend.workers["p_second"].engine.model.state_dict()
    assert all(torch.equal(engine[k], v) for k, v in before["p_second"].items())
