"""The curriculum (train.curriculum): stages of easier training problems, promoted on the rolling
training success, stored with each step, an event at each promotion, evaluation on the task's own
problems, and a resume that continues exactly across a promotion (real tiny model, in-process)."""

import shutil

import pytest
from conftest import ROOT

from mas_lab.actors.backend import Backend
from mas_lab.config import TaskFileError, load_task
from mas_lab.records.store import RunStore
from mas_lab.training.metric_names import TIMED
from mas_lab.training.trainer import Trainer

# stage 0: every episode counts as solved (threshold 0), so it is left after its 2 minimum steps
CURRICULUM = [
    "train.steps=5",
    "train.eval_every=0",
    "checkpoint.every=1",
    "checkpoint.keep_last=10",
    "train.curriculum=[{params: {success_threshold: 0.0}, promote_at: 0.9, min_steps: 2, window: 2}]",
]


def _run(task, run_dir, restore_step=None):
    trainer = Trainer(task, Backend(task, use_ray=False), RunStore(run_dir / "run.db"), run_dir=run_dir)
    if restore_step is not None:
        trainer.store.rollback(restore_step)
        trainer.restore(run_dir / "checkpoints" / f"step-{restore_step:06d}")
    trainer.run()
    trainer.backend.shutdown()
    return trainer


def _record(run_dir):
    store = RunStore(run_dir / "run.db")
    metrics = {s: {k: v for k, v in m.items() if not k.startswith(TIMED)} for s, m in store.metrics().items()}
    rows = [
        tuple(r.values())
        for r in store.rows(
            "SELECT e.step, e.kind, e.idx, e.problem_id, t.turn, t.role, c.idx, c.response, c.reward, c.advantage FROM candidates c "
            "JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id ORDER BY e.step, e.kind, e.idx, t.id, c.idx"
        )
    ]
    events = [e["message"] for e in store.events() if e["kind"] == "curriculum"]
    return metrics, rows, events


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    task = load_task(ROOT / "tasks" / "toy.yaml", CURRICULUM)
    trainer = _run(task, run_dir)
    return task, run_dir, trainer


def test_the_stage_is_stored_and_promotion_is_an_event(straight):
    task, run_dir, trainer = straight
    metrics, _, events = _record(run_dir)
    assert [metrics[s]["curriculum/stage"] for s in range(1, 6)] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert len(events) == 1 and events[0].startswith("stage 1 (the task's own problems) from step 3")
    assert trainer.stage == 1
    # stage 0's problems are the easy ones (threshold 0): every episode solved; evaluation is on the task's own
    assert metrics[1]["success_rate"] == metrics[2]["success_rate"] == 1.0
    assert trainer.pool.params.success_threshold == task.env.params["success_threshold"] > 0


@pytest.mark.parametrize("restore_step", [1, 3], ids=["before-promotion", "after-promotion"])
def test_resume_is_exact_across_a_promotion(straight, tmp_path, restore_step):
    task, run_dir, _ = straight
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    _run(task, copy, restore_step)
    (metrics, rows, events), (original_metrics, original_rows, original_events) = _record(copy), _record(run_dir)
    assert metrics == original_metrics and rows == original_rows
    # events are the run's log (a rollback keeps them): a resume before the promotion promotes again, the same way
    assert events == original_events * (2 if restore_step < 2 else 1)


def test_a_curriculum_stage_with_a_wrong_parameter_names_it(tmp_path):
    with pytest.raises(
        TaskFileError, match=r"field 'train.curriculum.0.params.size': unknown parameter; allowed: \['letters'"
    ):
        load_task(ROOT / "tasks" / "toy.yaml", ["train.curriculum=[{params: {size: 3}}]"])
    with pytest.raises(TaskFileError, match=r"field 'train.curriculum.0.params.success_threshold'"):
        load_task(ROOT / "tasks" / "toy.yaml", ["train.curriculum=[{params: {success_threshold: 2}}]"])
