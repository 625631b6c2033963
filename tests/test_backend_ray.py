"""The Ray backend: real actors generate, update, and sync weights back to the rollout worker."""

import pytest
import torch
from conftest import ROOT

from mas_lab.actors.backend import Backend
from mas_lab.config import load_task
from mas_lab.learner.samples import Sample

pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module")
def ray_backend():
    task = load_task(ROOT / "tasks" / "toy.yaml")
    backend = Backend(task, use_ray=True)
    yield task, backend
    backend.shutdown()


def test_actors_generate_k_candidates_per_prompt(ray_backend):
    task, backend = ray_backend
    prompts = [[{"role": "user", "content": "write a"}], [{"role": "user", "content": "write b"}]]
    out = backend.generate("shared", prompts, 3, task.roles[0].sampling, seed=1)
    assert [len(row) for row in out] == [3, 3]
    assert all(len(g.response_ids) <= task.roles[0].sampling.max_new_tokens for row in out for g in row)
    assert out[0][0].prompt_ids != out[1][0].prompt_ids
    again = backend.generate("shared", prompts, 3, task.roles[0].sampling, seed=1)
    assert [[g.text for g in row] for row in again] == [[g.text for g in row] for row in out]


def test_update_then_sync_changes_what_the_worker_generates(ray_backend):
    import ray

    task, backend = ray_backend
    base = backend.base_of["shared"]
    prompts = [[{"role": "user", "content": "write a"}]]
    backend.generate("shared", prompts, 2, task.roles[0].sampling, seed=3)  # not left to test order
    before = ray.get(backend.workers[base][0].stats.remote())
    samples = [Sample([2, 10, 11, 3], [71, 71, 3], a) for a in (1.0, -1.0, 0.5)]
    result = backend.update({"shared": samples})["shared"]
    assert result["samples"] == 3 and result["tokens"] == 9.0 and result["grad_norm"] > 0
    assert backend.sync_weights(1) >= 0.0
    learner = ray.get(backend.learners[base].weights.remote("shared"))
    worker = ray.get(backend.workers[base][0].load_weights.remote("shared", learner, 2))
    assert worker == 2 and before["generated_tokens"] > 0
    assert all(torch.isfinite(v).all() for v in learner.values())


def test_per_role_full_models_are_placed_and_update_in_parallel(ray_backend):
    """Two full models need 4 actors of one CPU each on a 2-core machine: the local Ray instance
    must offer enough logical CPUs (the phases alternate), or the actors would wait forever."""
    from mas_lab.config import TaskConfig

    task, shared = ray_backend
    shared.shutdown()
    data = task.model_dump()
    data["policies"] = {"p_first": {"model": "tiny-test"}, "p_second": {"model": "tiny-test"}}
    data["roles"][0]["policy"], data["roles"][1]["policy"] = "p_first", "p_second"
    backend = Backend(TaskConfig.model_validate(data), use_ray=True)
    try:
        assert len(backend.workers) == len(backend.learners) == 2
        prompts = [[{"role": "user", "content": "write a"}]]
        for policy in ("p_first", "p_second"):
            assert len(backend.generate(policy, prompts, 2, task.roles[0].sampling, seed=0)[0]) == 2
        sample = Sample([2, 10, 11, 3], [71, 3], 1.0)
        result = backend.update({"p_first": [sample], "p_second": [sample, sample]})
        assert result["p_first"]["samples"] == 1 and result["p_second"]["samples"] == 2
    finally:
        backend.shutdown()


def test_a_team_of_two_base_models_trains_on_ray_with_a_learner_per_model(tmp_path):
    """Each role on a base model of its own (here tiny-test and a smaller model of another shape,
    as one might pair tiny-test with SmolLM2): a rollout worker and a learner per model, each
    encoding its own role's prompts; the run trains, evaluates and checkpoints both."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import yaml
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from mas_lab.modeling import models
    from mas_lab.records.store import RunStore

    tiny = models.resolve("tiny-test")
    config = AutoConfig.from_pretrained(tiny)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 32, 64, 1
    torch.manual_seed(1)
    other = tmp_path / "other-model"
    AutoModelForCausalLM.from_config(config).save_pretrained(other)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(other)
    task = yaml.safe_load((ROOT / "tasks" / "toy.yaml").read_text())
    task["policies"] = {"small": {"model": "tiny-test"}, "smaller": {"model": str(other)}}
    task["roles"][0]["policy"], task["roles"][1]["policy"] = "small", "smaller"
    task["train"]["steps"] = 2
    task["tracking"] = {"mlflow_uri": f"sqlite:///{tmp_path / 'ml.db'}"}
    (tmp_path / "two_models.yaml").write_text(yaml.safe_dump(task))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "mas-lab"), "run", "two_models.yaml", "--run-dir", "runs/r"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    store = RunStore(tmp_path / "runs" / "r" / "run.db", create=False)
    try:
        placement = json.loads(next(e for e in store.events() if e["kind"] == "placement")["message"].split(": ", 1)[1])
        learners = [name for name in placement if name.startswith("learner")]
        assert len(learners) == 2 and len([n for n in placement if n.startswith("rollout")]) == 2, placement
        last = store.metrics()[2]
        assert last["samples/small"] > 0 and last["samples/smaller"] > 0 and last["grad_norm/smaller"] > 0
        assert "eval/success_rate" in last and store.meta()["status"] == "finished"
    finally:
        store.close()
