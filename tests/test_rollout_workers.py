"""Several rollout workers per policy (resources.rollout_workers): the same candidates as one."""

import pytest
from conftest import ROOT

from mas_lab.actors.backend import Backend
from mas_lab.config import load_task
from mas_lab.learner.samples import Sample

PROMPTS = [[{"role": "user", "content": f"write {c}"}] for c in "abcde"]


def toy(workers: int):
    return load_task(ROOT / "tasks" / "toy.yaml", [f"resources.rollout_workers={workers}"])


def texts(rows):
    return [[g.response_ids for g in row] for row in rows]


def test_prompts_split_over_workers_give_the_candidates_of_one_worker():
    one, two = Backend(toy(1), use_ray=False), Backend(toy(2), use_ray=False)
    try:
        assert len(two.workers[two.base_of["shared"]]) == 2
        sampling = toy(1).roles[0].sampling
        for seed in (0, 5):
            a = one.generate("shared", PROMPTS, 3, sampling, seed=seed)
            b = two.generate("shared", PROMPTS, 3, sampling, seed=seed)
            assert texts(a) == texts(b)
            assert [[g.prompt_ids for g in row] for row in a] == [[g.prompt_ids for g in row] for row in b]
    finally:
        one.shutdown()
        two.shutdown()


@pytest.mark.ray
@pytest.mark.slow
def test_two_ray_workers_both_receive_every_weight_sync():
    import ray

    task = toy(2)
    backend = Backend(task, use_ray=True)
    try:
        workers = backend.workers[backend.base_of["shared"]]
        assert len(workers) == 2
        sampling = task.roles[0].sampling.model_copy(update={"temperature": 0.0})
        prompt = PROMPTS[:1]

        def each():
            return [texts(ray.get(w.generate.remote("shared", prompt, 1, sampling, 0))) for w in workers]

        before = each()
        assert before[0] == before[1]
        samples = [
            Sample(g.prompt_ids, g.response_ids, 1.0) for g in backend.generate("shared", prompt, 1, sampling, 0)[0]
        ]
        for _ in range(3):  # push the greedy answer's tokens down hard
            backend.update({"shared": [Sample(s.prompt_ids, s.response_ids, -1.0) for s in samples]})
        backend.sync_weights(3)
        after = each()
        assert after[0] == after[1] and after[0] != before[0]  # both workers serve the new weights
        assert ray.get([w.stats.remote() for w in workers])[1]["generated_tokens"] > 0
    finally:
        backend.shutdown()


def test_every_candidate_carries_the_weight_version_that_generated_it(tmp_path):
    from mas_lab.records.store import RunStore
    from mas_lab.training.trainer import Trainer

    task = toy(2)
    backend = Backend(task, use_ray=False)
    store = RunStore(tmp_path / "run.db")
    try:
        trainer = Trainer(task, backend, store)
        for step in (1, 2, 3):
            trainer.train_step(step)
    finally:
        backend.shutdown()
    rows = store.rows(
        "SELECT DISTINCT e.step, c.policy_version FROM candidates c JOIN turns t ON c.turn_id = t.id"
        " JOIN episodes e ON t.episode_id = e.id WHERE e.kind = 'train' ORDER BY e.step"
    )
    assert [(r["step"], r["policy_version"]) for r in rows] == [(1, 0), (2, 1), (3, 2)]
    exported = next(store.candidate_records(first_step=3))
    assert exported["policy_version"] == 2
