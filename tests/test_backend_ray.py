"""The Ray backend: real actors generate, update, and sync weights back to the rollout worker."""
import pytest
import torch

from mas_lab.backend import Backend
from mas_lab.config import load_task

from conftest import ROOT


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
    host = backend.host_of["shared"]
    before = ray.get(backend.workers[host].stats.remote())
    samples = [{"prompt_ids": [2, 10, 11, 3], "response_ids": [71, 71, 3], "advantage": a} for a in (1.0, -1.0, 0.5)]
    result = backend.update({"shared": samples})["shared"]
    assert result["samples"] == 3 and result["tokens"] == 9.0 and result["grad_norm"] > 0
    assert backend.sync_weights(1) >= 0.0
    learner = ray.get(backend.learners[host].weights.remote("shared"))
    worker = ray.get(backend.workers[host].load_weights.remote("shared", learner, 2))
    assert worker == 2 and before["generated_tokens"] > 0
    assert all(torch.isfinite(v).all() for v in learner.values())
