"""algorithm.overlap (training/trainer.py): the rollout of step n+1 runs while the learner updates on
step n, with the weights before that update. The samples say so (staleness 1, the version that
sampled them), two runs are identical, a run continued from its checkpoint equals one that never
stopped (the rollout made ahead travels in the checkpoint), Ray's threaded colocated actor samples
what one process samples, and the settings that cannot overlap are refused before anything runs."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_task
from safetensors.torch import load_file

from mas_lab.actors.colocated import Colocated
from mas_lab.analysis.plots import panel_series
from mas_lab.config import Algorithm
from mas_lab.modeling.models import resolve
from mas_lab.records.store import RunStore
from mas_lab.training.metric_names import TIMED
from mas_lab.training.trainer import PREFETCHED

pytestmark = pytest.mark.integration
MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
SETS = ("train.eval_every=2", "checkpoint.every=1", "policies.shared.dtype=float32", "algorithm.overlap=true")


def _train_rows(store: RunStore) -> list[tuple]:
    rows = store.rows(
        "SELECT e.step, e.idx, t.turn, t.role, c.idx AS c, c.response, c.reward, c.advantage, c.policy_version "
        "FROM candidates c JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id "
        "ORDER BY e.step, e.kind, e.idx, t.turn, t.role, c.idx"
    )
    return [tuple(r.values()) for r in rows]


def _stable(store: RunStore) -> dict:
    return {s: {k: v for k, v in m.items() if not k.startswith(TIMED)} for s, m in store.metrics().items()}


def _weights(store: RunStore, step: int) -> dict:
    folder = Path(store.path).parent / "checkpoints" / f"step-{step:06d}" / "policies" / "shared"
    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Four overlapped steps of the toy task in one process, twice."""
    runs = []
    for name in ("a", "b"):
        cwd = tmp_path_factory.mktemp(f"overlap-{name}")
        runs.append(run_task(cwd, "toy.yaml", "--no-ray", sets=(*SETS, "train.steps=4"))[1])
    return runs


def test_each_step_after_the_first_is_sampled_by_the_weights_before_the_last_update(straight, tmp_path):
    store = straight[0]
    metrics = store.metrics()
    assert [metrics[s]["staleness/shared"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 1.0, 1.0]
    assert all("time/overlap_wait" in metrics[s] for s in (1, 2, 3, 4))
    versions = store.rows(
        "SELECT e.step, MIN(c.policy_version) AS lo, MAX(c.policy_version) AS hi FROM candidates c "
        "JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id WHERE e.kind = 'train' GROUP BY e.step"
    )
    assert [(r["step"], r["lo"], r["hi"]) for r in versions] == [(1, 0, 0), (2, 0, 0), (3, 1, 1), (4, 2, 2)]
    # on-policy, the same task samples each step with the weights of the step before
    off = run_task(tmp_path, "toy.yaml", "--no-ray", sets=(*SETS[:-1], "train.steps=2"))[1]
    assert [off.metrics()[s]["staleness/shared"] for s in (1, 2)] == [0.0, 0.0]
    assert "time/overlap_wait" not in off.metrics()[1]
    # the live screen and `mas-lab plot` draw the panels of panel_series: staleness for the overlapped run only
    assert panel_series(store)["staleness"][1] == {"staleness/shared": [(1, 0.0), (2, 1.0), (3, 1.0), (4, 1.0)]}
    assert "staleness" not in panel_series(off)


def test_two_overlapped_runs_are_identical(straight):
    a, b = straight
    assert _train_rows(a) == _train_rows(b)
    assert _stable(a) == _stable(b)


def test_a_run_continued_from_its_checkpoint_equals_one_that_never_stopped(straight, tmp_path):
    """Two steps, then two more from the checkpoint of step 2, which holds step 3's rollout (made
    with the weights after step 1, which the checkpoint no longer has)."""
    _, short = run_task(tmp_path, "toy.yaml", "--no-ray", sets=(*SETS, "train.steps=2"))
    run_dir = Path(short.path).parent
    assert (run_dir / "checkpoints" / "step-000002" / PREFETCHED).is_file()
    again = subprocess.run(
        [MAS_LAB, "run", "--resume", str(run_dir), "--set", "train.steps=4"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = RunStore(run_dir / "run.db", create=False)
    whole = straight[0]
    assert _train_rows(resumed) == _train_rows(whole)
    assert _stable(resumed) == _stable(whole)
    a, b = _weights(whole, 4), _weights(resumed, 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bitwise


def test_a_colocated_engine_keeps_its_own_weights_when_overlapping():
    """float32 on both sides: without overlap the engine's parameters are the learner's tensors;
    with it the engine must not see the update happen under its rollout."""
    model = resolve("tiny-test")
    for overlap, shared in ((False, True), (True, False)):
        both = Colocated((model, "float32", 1), (model, Algorithm(overlap=overlap), "float32", 1))
        assert both.shared is shared
        engine = both.worker.engine.model.parameters()
        assert all((e.data_ptr() == p.data_ptr()) is shared for e, p in zip(engine, both.learner.model.parameters()))


@pytest.mark.ray
def test_on_ray_the_threaded_colocated_actor_samples_what_one_process_samples(straight, tmp_path):
    ray_store = run_task(tmp_path, "toy.yaml", sets=(*SETS, "train.steps=4"))[1]
    assert _train_rows(ray_store) == _train_rows(straight[0])


@pytest.mark.parametrize(
    "sets, field",
    [
        (
            ("algorithm.overlap=true", "train.curriculum=[{params: {success_threshold: 0.0}, min_steps: 2}]"),
            "algorithm.overlap",
        )
    ],
)
def test_settings_that_cannot_overlap_are_refused_before_anything_runs(tmp_path, sets, field):
    proc = subprocess.run(
        [MAS_LAB, "run", str(ROOT / "tasks" / "toy.yaml"), "--no-ray", *[a for s in sets for a in ("--set", s)]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and "curriculum" in proc.stderr
    assert not (tmp_path / "runs").exists()
