"""The run store never silently loses a step: durable at step boundaries, checked against the
checkpoint on resume, one process per run folder, versioned, opened read-only by readers."""

import hashlib
import json
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, wait_for

from mas_lab.records.control import RunControl
from mas_lab.records.store import RunStore, StoreError

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
TOY = str(ROOT / "tasks" / "toy.yaml")
FAST = ["--no-ray", "--set", "checkpoint.every=1", "--set", "resources.torch_threads=1"]


def cli(*args, cwd, timeout=300):
    return subprocess.run([MAS_LAB, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def status(run_dir: Path, cwd: Path) -> dict:
    proc = cli("status", run_dir, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def finished_run(cwd: Path, steps: int = 4) -> Path:
    proc = cli("run", TOY, *FAST, "--set", f"train.steps={steps}", cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return cwd / json.loads(proc.stdout.splitlines()[-1])["run_dir"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def steps_in(run_dir: Path) -> list[int]:
    return [r["step"] for r in RunStore(run_dir / "run.db", create=False).rows("SELECT step FROM steps ORDER BY step")]


@pytest.mark.integration
def test_a_killed_run_is_crashed_and_resumes_exactly_even_without_its_wal(tmp_path):
    # a toy step takes ~0.2 s, about as long as one `mas-lab status`: wait for step 4 or later (a
    # test that waited for exactly step 4 could miss it), with steps to spare before the end
    proc = subprocess.Popen(
        [MAS_LAB, "run", TOY, *FAST, "--set", "train.steps=40", "--run-dir", "runs/r"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_dir = tmp_path / "runs" / "r"
    wait_for(
        lambda: (run_dir / "run.db").is_file() and (status(run_dir, tmp_path).get("step") or 0) >= 4, what="step 4"
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed = status(run_dir, tmp_path)
    assert killed["status"] == "crashed" and killed["running"] is False
    for suffix in ("-wal", "-shm"):  # the WAL is lost with the machine
        Path(f"{run_dir / 'run.db'}{suffix}").unlink(missing_ok=True)
    again = cli("run", "--resume", run_dir, cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    assert steps_in(run_dir) == list(range(41))
    counts = RunStore(run_dir / "run.db", create=False).rows(
        "SELECT step, kind, COUNT(*) AS n FROM episodes GROUP BY step, kind ORDER BY step, kind"
    )
    per_kind = {kind: {r["n"] for r in counts if r["kind"] == kind} for kind in ("train", "eval")}
    assert len(per_kind["train"]) == 1 and len(per_kind["eval"]) == 1, counts  # no step half or twice
    assert [r["step"] for r in counts if r["kind"] == "train"] == list(range(1, 41))


@pytest.mark.integration
def test_a_store_that_lost_steps_is_refused_and_left_alone(tmp_path):
    run_dir = finished_run(tmp_path)
    with sqlite3.connect(run_dir / "run.db") as db:  # data lost behind the checkpoint's back
        db.execute("DELETE FROM steps WHERE step = 2")
        db.execute("DELETE FROM episodes WHERE step = 2")
    before = digest(run_dir / "run.db")
    result = cli("run", "--resume", run_dir, "--set", "train.steps=6", cwd=tmp_path)
    assert result.returncode == 2 and "does not hold what checkpoint" in result.stderr and "[2]" in result.stderr
    assert digest(run_dir / "run.db") == before


@pytest.mark.integration
def test_one_process_per_run_folder(tmp_path):
    run_dir = finished_run(tmp_path, steps=2)
    first = subprocess.Popen(
        [MAS_LAB, "run", "--resume", str(run_dir), *FAST, "--set", "train.steps=400"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: status(run_dir, tmp_path)["running"], what="the first resume")
        second = cli("run", "--resume", run_dir, "--set", "train.steps=400", cwd=tmp_path)
        assert second.returncode == 2 and "still running" in second.stderr
        assert cli("stop", run_dir, "--wait", cwd=tmp_path).returncode == 0
        assert first.wait(timeout=120) == 3  # stopped by `mas-lab stop`
    finally:
        if first.poll() is None:
            first.kill()
    steps = steps_in(run_dir)
    assert steps == sorted(set(steps))  # no step twice


@pytest.mark.integration
def test_a_store_from_a_newer_mas_lab_is_refused_before_any_work(tmp_path):
    run_dir = finished_run(tmp_path, steps=1)
    with sqlite3.connect(run_dir / "run.db") as db:
        db.execute("PRAGMA user_version = 99")
    for args in (("run", "--resume", run_dir), ("status", run_dir), ("replay", run_dir, "--text")):
        result = cli(*args, cwd=tmp_path)
        assert result.returncode == 2 and "newer mas-lab" in result.stderr, (args, result.stderr[-500:])
        assert "Traceback" not in result.stderr


@pytest.mark.integration
def test_readers_never_change_the_store(tmp_path):
    run_dir = finished_run(tmp_path, steps=1)
    before = digest(run_dir / "run.db")
    assert cli("status", run_dir, cwd=tmp_path).returncode == 0
    assert cli("replay", run_dir, "--text", cwd=tmp_path).returncode == 0
    RunControl(RunStore(run_dir / "run.db", create=False)).status()
    assert digest(run_dir / "run.db") == before


def test_a_reader_never_finds_a_store_without_its_tables(tmp_path, monkeypatch):
    """The dashboard polls for run.db while `mas-lab run` creates it: whenever the file is there,
    every table must be. The probe looks at run.db each time the writer is about to run SQL."""
    path = tmp_path / "run" / "run.db"
    seen, looking = [], []

    def look():
        if path.exists() and not looking:  # the reader's own SQL is not probed
            looking.append(True)
            try:
                reader = RunStore(path, create=False)  # raises on a store without its tables
                seen.append(RunControl(reader).status()["pending"])
                reader.close()
            finally:
                looking.clear()

    class Probing(sqlite3.Connection):
        def execute(self, *args):
            look()
            return super().execute(*args)

        def executescript(self, script):
            look()
            return super().executescript(script)

    connect = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: connect(*a, **k, factory=Probing))
    RunStore(path).close()
    assert seen and all(pending == [] for pending in seen)  # the probe saw the finished store


def test_a_file_that_is_not_a_run_store_gets_a_clear_error(tmp_path):
    (tmp_path / "run.db").write_bytes(b"")
    with pytest.raises(StoreError, match="not a mas-lab run store"):
        RunStore(tmp_path / "run.db", create=False)
    result = cli("status", tmp_path, cwd=tmp_path)
    assert result.returncode == 2 and "not a mas-lab run store" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.integration
def test_resume_from_another_working_folder_continues_the_same_mlflow_run(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir()
    elsewhere.mkdir()
    run_dir = finished_run(home, steps=2)
    again = cli("run", "--resume", run_dir.resolve(), "--set", "train.steps=3", *FAST, cwd=elsewhere)
    assert again.returncode == 0, again.stderr[-2000:]
    assert not (elsewhere / "mlruns.db").exists()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlruns.db'}")
    run_id = json.loads(again.stdout.splitlines()[-1])["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "reward/mean")] == [1, 2, 3]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--set", "tracking.runs_dir=afile/runs"], "cannot make the run folder"),
        (["--set", "tracking.mlflow_uri=bogus://x"], "unknown tracking URI scheme"),
        (["--set", "name=../../x"], "field 'name'"),
        (["--set", "roles.5.alpha=1"], "index 5 is out of range"),
        (["--set", "env.params.letters="], "field 'env.params.letters'"),
    ],
)
def test_bad_inputs_leave_nothing_behind(tmp_path, args, message):
    (tmp_path / "afile").write_text("")
    result = cli("run", TOY, "--no-ray", *args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr
    assert not any((tmp_path / "runs").glob("*")) if (tmp_path / "runs").exists() else True
    assert not (tmp_path / "mlruns.db").exists()


def test_unreadable_task_files_get_one_line(tmp_path):
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(bytes(range(256)))
    bomb = tmp_path / "bomb.yaml"
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    bomb.write_text("\n".join(lines))
    for path, message in ((binary, "not a text file"), (bomb, "expand to more than")):
        started = time.monotonic()
        result = cli("run", path, cwd=tmp_path, timeout=60)
        assert result.returncode == 2 and message in result.stderr and time.monotonic() - started < 30


def _kill_actor(run: subprocess.Popen, name: str) -> bool:
    """SIGKILL the run's own Ray actor `name` (a descendant of its process; other Ray instances on
    the machine are left alone)."""
    import psutil

    for child in psutil.Process(run.pid).children(recursive=True):
        try:
            if " ".join(child.cmdline()).startswith(f"ray::{name}"):
                child.kill()
                return True
        except psutil.Error:
            pass
    return False


def _ray_run_at_step(tmp_path: Path, step: int, *sets: str) -> tuple[subprocess.Popen, Path]:
    """A toy run on a local Ray instance, returned once it has finished `step`."""
    args = [a for item in sets for a in ("--set", item)]
    proc = subprocess.Popen(
        [MAS_LAB, "run", TOY, *args, "--run-dir", "runs/r"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    run_dir = tmp_path / "runs" / "r"
    wait_for(
        lambda: (run_dir / "run.db").is_file() and (status(run_dir, tmp_path).get("step") or 0) >= step,
        timeout=180,
        what=f"step {step}",
    )
    return proc, run_dir


@pytest.mark.integration
@pytest.mark.ray
def test_a_dead_ray_actor_is_restarted_from_the_last_checkpoint(tmp_path):
    # one machine, one rollout worker: the base's learner and worker are one actor (resources.colocate)
    proc, run_dir = _ray_run_at_step(tmp_path, 2, "train.steps=8", "checkpoint.every=1")
    assert _kill_actor(proc, "Colocated")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    events = RunStore(run_dir / "run.db", create=False).rows(
        "SELECT kind, message FROM events WHERE kind = 'actor_restart'"
    )
    assert len(events) == 1 and "Colocated died" in events[0]["message"]
    assert steps_in(run_dir) == list(range(0, 9))


@pytest.mark.integration
@pytest.mark.ray
def test_a_dead_ray_actor_without_restarts_left_ends_with_one_line(tmp_path):
    # separate actors (resources.colocate: false): the learner dies alone
    proc, run_dir = _ray_run_at_step(
        tmp_path, 1, "train.steps=50", "resources.actor_restarts=0", "resources.colocate=false"
    )
    assert _kill_actor(proc, "Learner")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err
    assert "the Ray actor Learner died" in err and f"mas-lab run --resume {Path('runs/r')}" in err
    assert status(run_dir, tmp_path)["status"] == "failed"


def _damaged_copies(tmp_path: Path, source: Path) -> dict[str, Path]:
    """Copies of a finished run whose store is truncated, or has a garbage page in the middle."""
    out = {}
    for kind in ("truncated", "garbage"):
        run_dir = tmp_path / kind
        shutil.copytree(source, run_dir)
        data = bytearray((run_dir / "run.db").read_bytes())
        if kind == "truncated":
            data = data[: len(data) // 3]
        else:
            page = 4096
            middle = (len(data) // page // 2) * page
            data[middle : middle + page] = b"\xa5" * page
        (run_dir / "run.db").write_bytes(bytes(data))
        out[kind] = run_dir
    return out


@pytest.mark.parametrize(
    "command",
    [
        ["replay", "--text"],
        ["status"],
        ["export", "-o", "{tmp}/x.jsonl"],
        ["plot", "-o", "{tmp}/plots"],
        ["tui"],
        ["run", "--resume"],
    ],
    ids=lambda c: c[0],
)
def test_a_damaged_store_is_refused_in_one_line_before_anything_changes(toy_run, tmp_path, command):
    """A truncated run.db, or one with a garbage page, gave a traceback (exit 1) in every reader, and
    a resume rolled the store back and rewrote task.yaml before failing. Now: exit 2, one line, and
    the folder is byte for byte as it was."""
    from typer.testing import CliRunner

    from mas_lab.cli import app

    for kind, run_dir in _damaged_copies(tmp_path, toy_run[1]).items():
        before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
        args = [a.format(tmp=tmp_path) for a in command]
        line = [*args, str(run_dir)] if args[0] == "run" else [args[0], str(run_dir), *args[1:]]
        result = CliRunner().invoke(app, line)
        assert result.exit_code == 2, (kind, result.output, result.exception)
        assert "damaged" in result.output and len(result.output.strip().splitlines()) <= 3, result.output
        after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
        assert after == before, kind
