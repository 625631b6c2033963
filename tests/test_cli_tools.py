"""The tools around a run: runs at a glance, config, version, honest summaries and MLflow states."""
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
TOY = str(ROOT / "tasks" / "toy.yaml")


def cli(*args, cwd, timeout=300):
    return subprocess.run([MAS_LAB, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("tools")
    proc = cli("run", TOY, "--no-ray", "--set", "train.steps=2", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return cwd, cwd / json.loads(proc.stdout.splitlines()[-1])["run_dir"]


def test_runs_lists_true_statuses(finished):
    cwd, run_dir = finished
    crashed = run_dir.parent / "crashed-copy"
    shutil.copytree(run_dir, crashed)
    with sqlite3.connect(crashed / "run.db") as db:  # its process died while running
        db.execute("INSERT OR REPLACE INTO meta VALUES ('status', '\"running\"')")
    rows = {r["run"]: r for r in map(json.loads, cli("runs", run_dir.parent, "--json", cwd=cwd).stdout.splitlines())}
    assert rows[run_dir.name]["status"] == "finished" and rows["crashed-copy"]["status"] == "crashed"
    assert rows[run_dir.name]["step"] == 2 and rows[run_dir.name]["steps"] == 2 and rows[run_dir.name]["mlflow_run_id"]
    table = cli("runs", run_dir.parent, cwd=cwd).stdout
    assert "crashed" in table and run_dir.name in table
    assert json.loads(cli("status", crashed, cwd=cwd).stdout)["status"] == "crashed"


def test_config_prints_the_resolved_task_and_the_schema(tmp_path):
    resolved = cli("config", TOY, "--set", "algorithm.k=3", cwd=tmp_path)
    assert resolved.returncode == 0
    data = yaml.safe_load(resolved.stdout)
    assert data["algorithm"]["k"] == 3 and data["env"]["params"]["success_threshold"] is not None
    (tmp_path / "again.yaml").write_text(resolved.stdout)
    assert yaml.safe_load(cli("config", tmp_path / "again.yaml", cwd=tmp_path).stdout) == data
    schema = json.loads(cli("config", "--schema", cwd=tmp_path).stdout)
    assert "algorithm" in schema["properties"] and schema["$defs"]["Algorithm"]["properties"]["k"]["description"]
    assert cli("--version", cwd=tmp_path).stdout.startswith("mas-lab ")
    bad = cli("replay", ".", "--kind", "bogus", cwd=tmp_path)
    assert bad.returncode == 2 and "bogus" in bad.stderr


def test_a_stopped_run_reports_no_after_eval_and_is_killed_in_mlflow(tmp_path):
    proc = subprocess.Popen([MAS_LAB, "run", TOY, "--no-ray", "--set", "train.steps=300", "--set", "checkpoint.every=0", "--set", "train.eval_every=0",
                             "--run-dir", "runs/s"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "runs" / "s" / "run.db").is_file() or \
            (json.loads(cli("status", tmp_path / "runs" / "s", cwd=tmp_path).stdout).get("step") or 0) < 2:
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    summary = json.loads(out.splitlines()[-1])  # valid JSON: no NaN
    assert summary["stopped"] and summary["eval_after"] is None and summary["after"] is None
    assert "no evaluation after training" in summary["verdict"] and "not evaluated" in err
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}").get_run(summary["mlflow_run_id"])
    assert run.info.status == "KILLED" and run.data.tags["mas_lab.end"] == "stopped"
    assert run.data.tags["mas_lab.kind"] == "train"
    assert "None" not in run.data.params.values() and "algorithm.dual_clip" not in run.data.params


def test_eval_of_a_missing_checkpoint_says_so(tmp_path):
    result = cli("eval", TOY, "--checkpoint", tmp_path / "nope", "--no-ray", cwd=tmp_path)
    assert result.returncode == 2 and "no such checkpoint folder" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_a_wrong_cluster_address_fails_fast_and_leaves_nothing(tmp_path):
    started = time.monotonic()
    result = cli("run", TOY, "--address", "127.0.0.1:1", "--set", "resources.connect_timeout_s=2", cwd=tmp_path)
    assert result.returncode == 2 and "no Ray cluster answers at 127.0.0.1:1" in result.stderr
    assert time.monotonic() - started < 60 and not (tmp_path / "runs").exists() and not (tmp_path / "mlruns.db").exists()
    bad = cli("run", TOY, "--address", "nonsense", cwd=tmp_path)
    assert bad.returncode == 2 and "is not host:port" in bad.stderr


@pytest.mark.slow
def test_ui_serves_the_runs_own_tracking_store(finished):
    import socket
    import urllib.request

    cwd, run_dir = finished
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen([MAS_LAB, "ui", str(run_dir), "--port", str(port)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first = proc.stdout.readline()
        store = json.loads(sqlite3.connect(run_dir / "run.db").execute(
            "SELECT value FROM meta WHERE key = 'mlflow_uri'").fetchone()[0])
        assert f"http://127.0.0.1:{port}" in first and store in first, first
        run_id = json.loads(sqlite3.connect(run_dir / "run.db").execute(
            "SELECT value FROM meta WHERE key = 'mlflow_run_id'").fetchone()[0])
        deadline, body = time.monotonic() + 120, None
        while time.monotonic() < deadline and body is None:
            try:  # the REST API of the server that started answers with this run: it reads the run's store
                url = f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/get?run_id={run_id}"
                body = json.loads(urllib.request.urlopen(url, timeout=5).read())
            except OSError:
                time.sleep(1)
        assert body and body["run"]["info"]["run_id"] == run_id
    finally:
        import os

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
