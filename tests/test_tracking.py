"""MLflow tracking: several runs may start at once against one fresh SQLite store (the
reproduction runs two at a time); each gets its own MLflow run in the same experiment."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

STARTER = """
import sys
from pathlib import Path
from mas_lab.records.tracking import Tracker
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


LONG = [
    "--set",
    "train.problems_per_step=1",
    "--set",
    "algorithm.k=2",
    "--set",
    "train.eval_every=100",
    "--set",
    "train.eval_problems=1",
]


def _mas_lab(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "mas-lab"), *args], cwd=cwd, capture_output=True, text=True, timeout=900
    )


@pytest.mark.integration
def test_a_run_of_hundreds_of_steps_finishes_and_resumes_past_them(tmp_path):
    """Each step's completions table once added its path to the run tag `mlflow.loggedArtifacts`,
    which the SQL store cuts at 8,000 characters: every run, and every resume, failed at step ~83.
    150 steps and a resume to 160: past that step by 80%, at half the time of the 300 first used."""

    from mlflow.tracking import MlflowClient

    toy = str(ROOT / "tasks" / "toy.yaml")
    first = _mas_lab("run", toy, "--no-ray", "--set", "train.steps=150", *LONG, cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout.splitlines()[-1])
    assert summary["steps"] == 150
    more = _mas_lab("run", "--resume", summary["run_dir"], "--no-ray", "--set", "train.steps=160", cwd=tmp_path)
    assert more.returncode == 0, more.stderr[-3000:]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["mas_lab.logged_through_step"] == "160"
    assert json.loads(run.data.tags["mlflow.loggedArtifacts"]) == [
        {"path": "completions/eval.json", "type": "table"},
        {"path": "completions/train.json", "type": "table"},
    ]
    train = json.loads(
        Path(client.download_artifacts(run.info.run_id, "completions/train.json", str(tmp_path))).read_text()
    )
    steps = [row[train["columns"].index("step")] for row in train["data"]]
    assert sorted(set(steps)) == list(range(1, 161))
    assert len(client.get_metric_history(run.info.run_id, "reward/mean")) == 160


@pytest.mark.integration
def test_a_run_whose_table_tag_an_older_version_let_overflow_logs_again(tmp_path):
    """A run logged by an older mas-lab (a table per step) holds the tag cut mid-JSON: resuming it
    must log its tables, not fail to parse the cut tag."""
    from mas_lab.records.tracking import Tracker

    class OneStep:
        def candidate_records(self, kind, first, last, chosen_only=False):
            base = {"episode": 0, "problem_id": "p0", "role": "a", "turn": 0, "response": "x", "reward": 1.0}
            return [base | {"step": first}] if kind == "eval" else [base | {"step": first}, base | {"reward": 0.0}]

    tracker = Tracker(f"sqlite:///{tmp_path / 'mlruns.db'}", "old", "run", artifact_location=str(tmp_path / "a"))
    old = [{"path": f"completions/train_step_{i:06d}.json", "type": "table"} for i in range(200)]

    tracker.set_tag("mlflow.loggedArtifacts", json.dumps(old)[:8000])
    tracker.log_completions(OneStep(), [84])
    tags = tracker.client.get_run(tracker.run_id).data.tags
    assert json.loads(tags["mlflow.loggedArtifacts"]) == [
        {"path": "completions/eval.json", "type": "table"},
        {"path": "completions/train.json", "type": "table"},
    ]
