"""The tools around a run: runs at a glance, config, version, honest summaries and MLflow states."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, wait_for

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
TOY = str(ROOT / "tasks" / "toy.yaml")


def cli(*args, cwd, timeout=300):
    return subprocess.run([MAS_LAB, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def finished(toy_run):
    cwd, run_dir, _ = toy_run
    return cwd, run_dir


def test_runs_lists_true_statuses(finished, tmp_path):
    cwd, shared = finished
    run_dir = tmp_path / "runs" / shared.name  # a folder of its own: the shared run stays as it is
    shutil.copytree(shared, run_dir)
    crashed = run_dir.parent / "crashed-copy"
    shutil.copytree(run_dir, crashed)
    with sqlite3.connect(crashed / "run.db") as db:  # its process died while running
        db.execute("INSERT OR REPLACE INTO meta VALUES ('status', '\"running\"')")
    rows = {r["run"]: r for r in map(json.loads, cli("runs", run_dir.parent, "--json", cwd=cwd).stdout.splitlines())}
    assert rows[run_dir.name]["status"] == "finished" and rows["crashed-copy"]["status"] == "crashed"
    assert rows[run_dir.name]["step"] == 3 and rows[run_dir.name]["steps"] == 3 and rows[run_dir.name]["mlflow_run_id"]
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


@pytest.mark.integration
def test_a_stopped_run_reports_no_after_eval_and_is_killed_in_mlflow(tmp_path):
    proc = subprocess.Popen(
        [
            MAS_LAB,
            "run",
            TOY,
            "--no-ray",
            "--set",
            "train.steps=300",
            "--set",
            "checkpoint.every=0",
            "--set",
            "train.eval_every=0",
            "--run-dir",
            "runs/s",
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while (
        not (tmp_path / "runs" / "s" / "run.db").is_file()
        or (json.loads(cli("status", tmp_path / "runs" / "s", cwd=tmp_path).stdout).get("step") or 0) < 2
    ):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]  # stopped, not finished: never 0
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


@pytest.mark.integration
def test_a_wrong_cluster_address_fails_fast_and_leaves_nothing(tmp_path):
    started = time.monotonic()
    result = cli("run", TOY, "--address", "127.0.0.1:1", "--set", "resources.connect_timeout_s=2", cwd=tmp_path)
    assert result.returncode == 2 and "no Ray cluster answers at 127.0.0.1:1" in result.stderr
    assert (
        time.monotonic() - started < 60 and not (tmp_path / "runs").exists() and not (tmp_path / "mlruns.db").exists()
    )
    bad = cli("run", TOY, "--address", "nonsense", cwd=tmp_path)
    assert bad.returncode == 2 and "is not host:port" in bad.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_ui_serves_the_runs_own_tracking_store(finished):
    import socket
    import urllib.request

    cwd, run_dir = finished
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [MAS_LAB, "ui", str(run_dir), "--port", str(port)],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        first = proc.stdout.readline()
        store = json.loads(
            sqlite3.connect(run_dir / "run.db").execute("SELECT value FROM meta WHERE key = 'mlflow_uri'").fetchone()[0]
        )
        assert first.startswith("starting the MLflow UI on") and store in first, first
        ready = proc.stdout.readline()  # printed only once the server answers (it once came 20-60 s early)
        while ready and "MLflow UI: http" not in ready:  # the server's own lines share the pipe
            ready = proc.stdout.readline()
        assert f"MLflow UI: http://127.0.0.1:{port}" in ready, ready
        urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).read()
        run_id = json.loads(
            sqlite3.connect(run_dir / "run.db")
            .execute("SELECT value FROM meta WHERE key = 'mlflow_run_id'")
            .fetchone()[0]
        )
        deadline, body = time.monotonic() + 120, None
        while time.monotonic() < deadline and body is None:
            try:  # the REST API of the server that started answers with this run: it reads the run's store
                url = f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/get?run_id={run_id}"
                body = json.loads(urllib.request.urlopen(url, timeout=5).read())
            except OSError:
                time.sleep(1)
        assert body and body["run"]["info"]["run_id"] == run_id
        proc.send_signal(signal.SIGINT)  # Ctrl+C to mas-lab alone: it stops the server and its workers
        proc.wait(timeout=60)
        with socket.socket() as free:  # nothing listens there any more (SO_REUSEADDR: the request's
            free.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT does not count)
            free.bind(("127.0.0.1", port))
    finally:
        import os

        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def test_status_says_paused_and_a_second_pause_says_so(toy_run, tmp_path):
    """`status` said "running" while the run was paused, and a second `pause` promised to take
    effect later. A paused live run is "paused" (and still `running`: it can resume); asking again
    says it already is, and queues nothing."""
    from typer.testing import CliRunner

    from mas_lab.cli import app
    from mas_lab.records.control import RunControl, acquire_lock, release_lock
    from mas_lab.records.store import RunStore

    run_dir = tmp_path / "live"
    shutil.copytree(toy_run[1], run_dir)
    store = RunStore(run_dir / "run.db")
    store.set_meta(status="running", state={"step": 3, "phase": "paused", "paused": True})
    assert acquire_lock(run_dir)  # this process plays the run's
    try:
        state = RunControl(RunStore(run_dir / "run.db", create=False)).status()
        assert state["status"] == "paused" and state["running"] is True
        shown = json.loads(CliRunner().invoke(app, ["status", str(run_dir)]).output)
        assert shown["status"] == "paused"
        again = CliRunner().invoke(app, ["pause", str(run_dir)])
        assert again.exit_code == 0 and "already paused" in again.output
        assert store.pending_controls() == []
        store.set_meta(state={"step": 3, "phase": "rollout t0 first", "paused": False})
        assert "already running" in CliRunner().invoke(app, ["resume", str(run_dir)]).output
    finally:
        release_lock(run_dir)
    assert RunControl(RunStore(run_dir / "run.db", create=False)).status()["status"] == "crashed"


def test_replay_text_shows_terminal_escapes_instead_of_running_them(toy_run, tmp_path):
    """A program's output with escape sequences (clear the screen, set the title) reached
    `replay --text` raw; they are shown as text now."""
    from typer.testing import CliRunner

    from mas_lab.cli import app

    run_dir = tmp_path / "run"
    shutil.copytree(toy_run[1], run_dir)
    with sqlite3.connect(run_dir / "run.db") as db:
        db.execute(
            "UPDATE candidates SET response = ? WHERE id = (SELECT MIN(id) FROM candidates)",
            ("x\x1b[2J\x1b[H\x1b]0;owned\x07y",),
        )
    step = min(
        r
        for (r,) in sqlite3.connect(run_dir / "run.db").execute(
            "SELECT e.step FROM candidates c JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id"
            " WHERE c.id = (SELECT MIN(id) FROM candidates)"
        )
    )
    kind = (
        sqlite3.connect(run_dir / "run.db")
        .execute(
            "SELECT e.kind FROM candidates c JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id"
            " WHERE c.id = (SELECT MIN(id) FROM candidates)"
        )
        .fetchone()[0]
    )
    result = CliRunner().invoke(app, ["replay", str(run_dir), "--text", "--step", str(step), "--kind", kind])
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output and "\x07" not in result.output
    assert "x\\x1b[2J\\x1b[H\\x1b]0;owned\\x07y" in result.output


def test_ui_refuses_a_busy_or_impossible_port_and_starts_nothing(toy_run):
    """A busy or impossible port exited 0."""
    import socket

    from typer.testing import CliRunner

    from mas_lab.cli import app

    assert CliRunner().invoke(app, ["ui", str(toy_run[1]), "--port", "99999"]).exit_code == 2
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        result = CliRunner().invoke(app, ["ui", str(toy_run[1]), "--port", str(taken)])
    assert result.exit_code == 2 and f"--port {taken}: cannot listen there" in result.output


def test_a_run_without_its_tracking_store_gets_one_rebuilt_from_the_run_store(toy_run, tmp_path):
    """A copied run whose tracking store stayed elsewhere made an empty store at that path and served
    an empty UI. Now the store is rebuilt from run.db: params, every step's metrics, the completions
    tables and the charts; nothing is written at the recorded path or into the run folder."""
    from mlflow.tracking import MlflowClient

    from mas_lab.records.tracking import rebuild

    copied = tmp_path / "copied"
    shutil.copytree(toy_run[1], copied)
    with sqlite3.connect(copied / "run.db") as db:
        db.execute(
            "UPDATE meta SET value = ? WHERE key = 'mlflow_uri'", (json.dumps("sqlite:////elsewhere/mlruns.db"),)
        )
    before = sorted(p.name for p in copied.iterdir())
    uri = rebuild(copied, tmp_path / "tracking")
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.data.params["algorithm.k"] == "8" and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/success_rate")] == [0, 2, 3]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"completions", "charts", "task.yaml"} <= artifacts
    tables = {a.path for a in client.list_artifacts(run.info.run_id, "completions")}
    assert tables == {"completions/eval.json", "completions/train.json"}
    train = json.loads(
        Path(client.download_artifacts(run.info.run_id, "completions/train.json", str(tmp_path))).read_text()
    )
    assert {row[train["columns"].index("step")] for row in train["data"]} == {1, 2, 3}
    assert not os.path.exists("/elsewhere/mlruns.db") and sorted(p.name for p in copied.iterdir()) == before
    assert rebuild(copied, tmp_path / "tracking") == uri  # made once


def test_without_a_terminal_replay_prints_text_and_tui_refuses(toy_run):
    """Without a terminal both wrote escape codes into the pipe and waited for keys that never came."""
    replay = subprocess.run(
        [MAS_LAB, "replay", str(toy_run[1])], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert replay.returncode == 0 and "=== turn 0" in replay.stdout and "\x1b[" not in replay.stdout
    assert "not a terminal" in replay.stderr
    tui = subprocess.run(
        [MAS_LAB, "tui", str(toy_run[1])], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL
    )
    assert tui.returncode == 2 and "needs a terminal" in tui.stdout + tui.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_ui_serves_a_copied_runs_metrics_from_a_rebuilt_store(toy_run, tmp_path):
    """`mas-lab ui` on a run folder whose tracking store is on another machine: the server answers
    with the run's metrics (REST), from a store rebuilt out of run.db."""
    import socket
    import urllib.request

    copied = tmp_path / "copied"
    shutil.copytree(toy_run[1], copied)
    with sqlite3.connect(copied / "run.db") as db:
        db.execute(
            "UPDATE meta SET value = ? WHERE key = 'mlflow_uri'", (json.dumps("sqlite:////elsewhere/mlruns.db"),)
        )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MAS_LAB_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen(
        [MAS_LAB, "ui", str(copied), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert "rebuilding one from the run store" in lines[0], lines
        uri = lines[1].split("starting the MLflow UI on ", 1)[1].rsplit(" ...", 1)[0]
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
        deadline, body = time.monotonic() + 120, None
        while time.monotonic() < deadline and body is None:
            try:
                url = (
                    f"http://127.0.0.1:{port}/api/2.0/mlflow/metrics/get-history?run_id={run.info.run_id}"
                    "&metric_key=eval/success_rate"
                )
                body = json.loads(urllib.request.urlopen(url, timeout=5).read())
            except OSError:
                time.sleep(1)
        assert body and [m["step"] for m in body["metrics"]] == [0, 2, 3]
        proc.terminate()  # SIGTERM to mas-lab alone stops the server (in its own session) too
        proc.wait(timeout=60)
        wait_for(lambda: not _serving(port), timeout=30, what="the MLflow server to stop")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)


def _serving(port: int) -> bool:
    """Whether a process listening with `--port PORT` on its command line is alive."""
    import psutil

    for found in psutil.process_iter(["cmdline"]):
        try:
            line = found.info["cmdline"] or []
            if "--port" in line and str(port) in line and found.status() != psutil.STATUS_ZOMBIE:
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return False
