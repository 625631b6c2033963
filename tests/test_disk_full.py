"""A disk that fills up mid-run: the run ends with one line, and the store and the MLflow run say
it failed (not "running"). The file-size limit stands in for a full disk: writes past it fail
with EFBIG, as they fail with ENOSPC on a full disk (Python ignores SIGXFSZ)."""

import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")

pytestmark = [pytest.mark.integration]


@pytest.mark.parametrize(
    "every, full",
    [(0, "disk I/O error"), (1, "the MLflow store")],
    ids=["the run store fills", "the MLflow store fills at a checkpoint"],
)
def test_a_full_disk_fails_the_run_cleanly(tmp_path, every, full):
    """Without checkpoints the run store is the first file to fill; with one at every step MLflow's
    store is (it holds the completions tables), and MLflow logged a 55-line SQLAlchemy traceback
    and raised its own exception as a 280-line one. Both are one line now."""

    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000))

    proc = subprocess.run(
        [
            MAS_LAB,
            "run",
            str(ROOT / "tasks" / "toy.yaml"),
            "--no-ray",
            "--set",
            "train.steps=400",
            "--set",
            f"checkpoint.every={every}",
            "--set",
            f"tracking.mlflow_uri=sqlite:///{tmp_path / 'ml.db'}",
            "--run-dir",
            "runs/r",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=small_disk,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "is the disk full?" in proc.stderr
    assert "mas-lab run --resume runs/r" in proc.stderr and full in proc.stderr
    assert len([line for line in proc.stderr.splitlines() if not line.startswith("step ")]) < 10, proc.stderr
    state = json.loads(
        subprocess.run([MAS_LAB, "status", "runs/r"], cwd=tmp_path, capture_output=True, text=True).stdout
    )
    assert state["status"] == "failed" and not state["running"] and "disk I/O error" in state["error"], state
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'ml.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mas-lab").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_a_full_disk_while_writing_a_checkpoint_is_one_line_and_resume_says_why(tmp_path, monkeypatch):
    """The test above turns checkpoints off; with them on, torch.save's own error on a full disk
    (a RuntimeError from its stream writer, not an OSError) escaped as a traceback. Here it fails at
    the first checkpoint: one line, status failed, and a resume refuses with its reason (no complete
    checkpoint), changing nothing."""
    from typer.testing import CliRunner

    from mas_lab.cli import app
    from mas_lab.learner import learner

    def full(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:626] . PytorchStreamWriter failed writing file")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(learner.torch, "save", full)
    args = [
        "run",
        str(ROOT / "tasks" / "toy.yaml"),
        "--no-ray",
        "--set",
        "train.steps=3",
        "--set",
        "checkpoint.every=1",
        "--set",
        f"tracking.mlflow_uri=sqlite:///{tmp_path / 'ml.db'}",
        "--run-dir",
        "runs/r",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and "is the disk full?" in result.output, result.output
    assert "writing the policy files" in result.output and "Traceback" not in result.output
    monkeypatch.undo()
    from mas_lab.records.control import release_lock

    release_lock(tmp_path / "runs" / "r")  # as the CLI's process would, exiting
    state = json.loads(
        subprocess.run([MAS_LAB, "status", "runs/r"], cwd=tmp_path, capture_output=True, text=True).stdout
    )
    assert state["status"] == "failed"
    before = (tmp_path / "runs" / "r" / "run.db").read_bytes()
    again = subprocess.run(
        [MAS_LAB, "run", "--resume", "runs/r", "--no-ray"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 2 and "no complete checkpoint" in again.stdout + again.stderr
    assert (tmp_path / "runs" / "r" / "run.db").read_bytes() == before


def test_a_run_folder_without_write_access_is_one_line(toy_run, tmp_path, monkeypatch):
    """A read-only run folder raised from run.lock; it is a RunError naming the folder now."""
    import shutil

    from mas_lab import runs
    from mas_lab.records import control

    run_dir = tmp_path / "ro"
    shutil.copytree(toy_run[1], run_dir)

    def read_only(path):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(runs, "acquire_lock", read_only)
    with pytest.raises(runs.RunError, match="cannot take the run's lock file .Read-only file system."):
        runs.resume(run_dir, None, [])
    assert control.lock_held(run_dir) is False
