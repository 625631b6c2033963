"""A disk that fills up mid-run: the run ends with one line, and the store and the MLflow run say
it failed (not "running"). The file-size limit stands in for a full disk: writes past it fail
with EFBIG, as they fail with ENOSPC on a full disk (Python ignores SIGXFSZ)."""
import json
import resource
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")


def test_a_full_disk_fails_the_run_cleanly(tmp_path):
    def small_disk():
        resource.setrlimit(resource.RLIMIT_FSIZE, (2_000_000, 2_000_000))

    proc = subprocess.run([MAS_LAB, "run", str(ROOT / "tasks" / "toy.yaml"), "--no-ray", "--set", "train.steps=400",
                           "--set", "checkpoint.every=0", "--set", f"tracking.mlflow_uri=sqlite:///{tmp_path / 'ml.db'}",
                           "--run-dir", "runs/r"], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          preexec_fn=small_disk)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "is the disk full?" in proc.stderr
    assert "mas-lab run --resume runs/r" in proc.stderr
    state = json.loads(subprocess.run([MAS_LAB, "status", "runs/r"], cwd=tmp_path, capture_output=True, text=True).stdout)
    assert state["status"] == "failed" and not state["running"] and "disk I/O error" in state["error"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'ml.db'}")
    runs = client.search_runs([client.get_experiment_by_name("mas-lab").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
