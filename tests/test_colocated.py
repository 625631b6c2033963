"""resources.colocate (mas_lab/actors/colocated.py): a base's learner and rollout worker in one process
sample exactly what separate actors sample, in float32 (shared tensors), bf16 (cast in place) and
with LoRA adapters (adapter state in memory), and its weight sync costs (almost) nothing."""

import json
from pathlib import Path

import pytest
from conftest import ROOT, run_task

from mas_lab.records.store import RunStore


def _run(tmp_path: Path, task: str, colocate: str, *extra: str, ray: bool = False) -> RunStore:
    cwd = tmp_path / f"{Path(task).stem}-{colocate}-{'ray' if ray else 'local'}"
    cwd.mkdir()
    sets = ("train.steps=3", "train.eval_every=0", f"resources.colocate={colocate}", *extra)
    return run_task(cwd, task, *([] if ray else ["--no-ray"]), sets=sets)[1]


def _samples(store: RunStore) -> list[tuple]:
    rows = store.rows(
        "SELECT e.step, e.idx, t.turn, t.role, c.idx AS c, c.response, c.reward, c.advantage FROM candidates c "
        "JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id ORDER BY e.step, e.kind, e.idx, t.turn, t.role, c.idx"
    )
    return [tuple(r.values()) for r in rows]


def _losses(store: RunStore) -> list[float]:
    return [m["loss/shared"] for _, m in sorted(store.metrics().items()) if "loss/shared" in m]


@pytest.mark.integration
@pytest.mark.parametrize(
    "task, extra",
    [
        ("toy.yaml", ("policies.shared.dtype=float32",)),
        ("toy.yaml", ("policies.shared.dtype=bfloat16",)),
        ("toy_lora.yaml", ()),
    ],
    ids=["float32-shared-tensors", "bf16-cast-in-place", "lora-adapter-in-memory"],
)
def test_colocated_samples_equal_separate_actors(tmp_path, task, extra):
    together = _run(tmp_path, task, "true", *extra)
    apart = _run(tmp_path, task, "false", *extra)
    assert _samples(together) == _samples(apart) and len(_samples(together)) > 0
    assert _losses(together) == pytest.approx(_losses(apart), rel=1e-6, abs=1e-9)
    assert together.meta()["status"] == "finished"


@pytest.mark.integration
@pytest.mark.ray
def test_on_ray_the_colocated_base_is_one_actor_and_its_sync_is_in_place(tmp_path):
    store = _run(tmp_path, "toy.yaml", "auto", "policies.shared.dtype=float32", ray=True)
    placement = next(e for e in store.events() if e["kind"] == "placement")
    nodes = json.loads(placement["message"].split(": ", 1)[1])
    assert set(nodes) == {"rollout full:shared#0", "learner full:shared"}
    syncs = [m["time/weight_sync"] for _, m in sorted(store.metrics().items()) if "time/weight_sync" in m]
    assert syncs and max(syncs) < 0.05, syncs  # shared tensors: a round trip to the actor, no copy


def test_colocate_on_refuses_what_it_cannot_share():
    from mas_lab.config import TaskFileError, load_task

    with pytest.raises(TaskFileError, match="field 'resources.colocate': true shares a process"):
        load_task(ROOT / "tasks" / "toy.yaml", ["resources.colocate=true", "resources.rollout_workers=2"])
