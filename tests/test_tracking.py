"""MLflow tracking: several runs may start at once against one fresh SQLite store (the
reproduction runs two at a time); each gets its own MLflow run in the same experiment."""

import subprocess
import sys

import pytest
from conftest import ROOT

STARTER = """
import sys
from mas_lab.tracking import Tracker
tracker = Tracker(sys.argv[1], "race", sys.argv[2])
tracker.log_metrics(1, {"x": 1.0})
tracker.finish()
print(tracker.run_id)
"""


@pytest.mark.integration
def test_runs_starting_together_share_a_fresh_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER, uri, f"run-{i}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-800:] for _, err in outputs]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("race")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(out.strip() for out, _ in outputs)
