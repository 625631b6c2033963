"""Pause, resume, stop, checkpoints and exact resume after SIGKILL, through the real CLI
(separate processes, real Ray actors, real MLflow and run stores)."""

import hashlib
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, wait_for
from safetensors.torch import load_file

from mas_lab.records.control import RunControl
from mas_lab.records.store import RunStore
from mas_lab.training.metric_names import TIMED

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
TOY = str(ROOT / "tasks" / "toy.yaml")
# time and throughput differ between runs by nature; everything else must match exactly
VOLATILE = TIMED

pytestmark = [pytest.mark.integration, pytest.mark.ray]


def cli(*args, cwd, timeout=300):
    return subprocess.run([MAS_LAB, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def start(*args, cwd):
    return subprocess.Popen(
        [MAS_LAB, *map(str, args)], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def run_dir_of(cwd: Path) -> Path:
    return wait_for(
        lambda: (
            next((p for p in (cwd / "runs").glob("*") if (p / "run.db").is_file()), None)
            if (cwd / "runs").is_dir()
            else None
        ),
        what="the run folder",
    )


def state_of(run_dir: Path) -> dict:
    try:
        return RunControl(RunStore(run_dir / "run.db")).status()
    except Exception:  # the store may be mid-creation
        return {}


def stable_metrics(run_dir: Path) -> dict:
    return {
        step: {k: v for k, v in m.items() if not k.startswith(VOLATILE)}
        for step, m in RunStore(run_dir / "run.db").metrics().items()
    }


def advantages(run_dir: Path) -> list:
    return [
        tuple(r.values())
        for r in RunStore(run_dir / "run.db").rows(
            "SELECT e.step, e.kind, e.idx, t.turn, t.role, c.idx, c.response, c.reward, c.advantage, c.chosen FROM candidates c "
            "JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id ORDER BY e.step, e.kind, e.idx, t.id, c.idx"
        )
    ]


def final_weights(run_dir: Path, step: int) -> dict:
    return load_file(str(run_dir / "checkpoints" / f"step-{step:06d}" / "policies" / "shared" / "model.safetensors"))


STEPS = ["--set", "train.steps=6", "--set", "checkpoint.every=1", "--set", "train.eval_every=3"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("straight")
    proc = cli("run", TOY, *STEPS, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return cwd, Path(cwd / json.loads(proc.stdout.splitlines()[-1])["run_dir"])


def kill_in_step_4_and_resume(cwd: Path, *args: str):
    """Start the toy run, SIGKILL it during step 4's rollout, resume it; (run folder, its state
    when killed, the resume's process)."""
    proc = start("run", TOY, *args, cwd=cwd)
    run_dir = run_dir_of(cwd)
    wait_for(
        lambda: (lambda s: s.get("step") == 4 and str(s.get("phase", "")).startswith("rollout"))(state_of(run_dir)),
        what="step 4's rollout",
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = state_of(run_dir)
    again = cli("run", "--resume", run_dir, cwd=cwd)
    assert again.returncode == 0, again.stderr[-3000:]
    return run_dir, killed_at, again


def assert_same_run(run_dir: Path, straight_dir: Path) -> None:
    """Metrics (but times), every candidate's advantage and the final weights (bitwise) agree."""
    assert stable_metrics(run_dir) == stable_metrics(straight_dir)
    assert advantages(run_dir) == advantages(straight_dir)
    a, b = final_weights(straight_dir, 6), final_weights(run_dir, 6)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bitwise


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("killed")
    return (cwd, *kill_in_step_4_and_resume(cwd, *STEPS))


def test_resume_after_sigkill_matches_the_uninterrupted_run_exactly(straight, resumed):
    _, straight_dir = straight
    _, resumed_dir, killed_at, again = resumed
    assert killed_at["step"] == 4 and killed_at["last_checkpoint"] == 3 and not killed_at["running"]
    assert "resumed from step-000003" in again.stderr
    assert_same_run(resumed_dir, straight_dir)


def test_the_resumed_store_has_every_step_exactly_once(straight, resumed):
    _, straight_dir = straight
    _, resumed_dir, _, _ = resumed
    query = "SELECT kind, step, COUNT(*) AS n FROM episodes GROUP BY kind, step ORDER BY kind, step"
    assert RunStore(resumed_dir / "run.db").rows(query) == RunStore(straight_dir / "run.db").rows(query)
    steps = [r["step"] for r in RunStore(resumed_dir / "run.db").rows("SELECT step FROM steps ORDER BY step")]
    assert steps == [0, 1, 2, 3, 4, 5, 6]
    assert RunStore(resumed_dir / "run.db").meta()["status"] == "finished"


def test_the_mlflow_run_is_the_same_and_has_no_duplicate_steps(resumed):
    cwd, run_dir, _, again = resumed
    from mlflow.tracking import MlflowClient

    run_id = RunStore(run_dir / "run.db").meta()["mlflow_run_id"]
    assert json.loads(again.stdout.splitlines()[-1])["mlflow_run_id"] == run_id
    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlruns.db'}")
    assert len(client.search_runs([client.get_experiment_by_name("mas-lab").experiment_id])) == 1
    for key in ("reward/mean", "loss/shared", "time/step"):
        assert sorted(m.step for m in client.get_metric_history(run_id, key)) == [1, 2, 3, 4, 5, 6]
    assert sorted(m.step for m in client.get_metric_history(run_id, "eval/success_rate")) == [0, 3, 6]
    assert client.get_run(run_id).info.status == "FINISHED"


def policy_files(run_dir: Path, step: int) -> dict:
    """SHA-256 of a checkpoint's policy files (weights, optimizer, learner RNG, KL probe)."""
    manifest = json.loads((run_dir / "checkpoints" / f"step-{step:06d}" / "manifest.json").read_text())["files"]
    return {name: entry["sha256"] for name, entry in manifest.items() if name.startswith("policies/")}


def learner_state(run_dir: Path, step: int) -> dict:
    return torch.load(
        run_dir / "checkpoints" / f"step-{step:06d}" / "policies" / "shared" / "learner.pt", weights_only=True
    )


def same_tensors(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_tensors(x, y) for x, y in zip(a, b))
    return a == b


def test_background_checkpoints_are_byte_for_byte_the_synchronous_ones(tmp_path):
    for mode in ("false", "true"):
        proc = cli(
            "run",
            TOY,
            "--no-ray",
            "--set",
            "train.steps=2",
            "--set",
            "checkpoint.every=1",
            "--set",
            f"checkpoint.background={mode}",
            "--run-dir",
            f"runs/{mode}",
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    for step in (1, 2):  # keep_last 2
        assert policy_files(tmp_path / "runs" / "true", step) == policy_files(tmp_path / "runs" / "false", step)


def test_background_checkpoints_write_the_same_files_and_resume_exactly_after_sigkill(straight, tmp_path):
    """checkpoint.background: the policies are copied at the step boundary and written during the
    next step; a SIGKILL in the middle of a step still resumes to the uninterrupted run exactly
    (from the last sealed checkpoint)."""
    _, straight_dir = straight
    background = [*STEPS, "--set", "checkpoint.background=true", "--set", "checkpoint.keep_last=6"]
    run_dir, killed_at, _ = kill_in_step_4_and_resume(tmp_path, *background)
    assert killed_at["last_checkpoint"] in (2, 3)  # step 3's may still have been in flight
    assert_same_run(run_dir, straight_dir)
    assert same_tensors(learner_state(run_dir, 6), learner_state(straight_dir, 6))  # optimizer, RNG, KL probe
    events = [
        r["message"] for r in RunStore(run_dir / "run.db").rows("SELECT message FROM events WHERE kind = 'checkpoint'")
    ]
    assert any(m.startswith("step-000006 written") for m in events)


def test_pause_from_another_process_holds_steps_and_resume_continues(tmp_path):
    proc = start("run", TOY, "--set", "train.steps=400", "--set", "checkpoint.every=0", cwd=tmp_path)
    try:
        run_dir = run_dir_of(tmp_path)
        wait_for(lambda: (state_of(run_dir).get("step") or 0) >= 2, what="step 2")
        paused = cli("pause", run_dir, "--wait", cwd=tmp_path, timeout=120)
        assert paused.returncode == 0, paused.stderr
        assert "paused after step" in paused.stderr  # --wait says when it took effect, not only "requested"
        state = wait_for(lambda: (lambda s: s if s.get("actors_alive") else None)(state_of(run_dir)), what="actor ping")
        assert state["paused"] and state["phase"] == "paused" and state["last_checkpoint"] == state["step"]

        def count():
            return RunStore(run_dir / "run.db").rows("SELECT COUNT(*) AS n FROM steps")[0]["n"]

        before = count()
        time.sleep(2.0)
        assert count() == before, "a step started while paused"
        events = [e["kind"] for e in RunStore(run_dir / "run.db").rows("SELECT kind FROM events")]
        assert "pause" in events
        resumed = cli("resume", run_dir, "--wait", cwd=tmp_path)
        assert resumed.returncode == 0 and "resumed (step" in resumed.stderr
        wait_for(lambda: count() > before, what="a step after resume")
        stopped = cli("stop", run_dir, "--wait", cwd=tmp_path, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped after step" in stopped.stderr
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 3, err[-2000:]  # stopped by `mas-lab stop`: not the 0 of a finished run
        final = state_of(run_dir)
        assert final["status"] == "stopped" and final["last_checkpoint"] == final["step"] < 400
        assert (run_dir / "checkpoints" / f"step-{final['step']:06d}" / "manifest.json").is_file()
        assert cli("pause", run_dir, cwd=tmp_path).returncode == 2  # no longer running
    finally:
        if proc.poll() is None:
            proc.kill()


def test_ctrl_c_stops_with_a_checkpoint_and_exits_130(tmp_path):
    """One Ctrl+C: a graceful stop with a checkpoint, and exit 130 (128 + SIGINT), so a script can
    tell a stopped run from a finished one (which exits 0)."""
    proc = start("run", TOY, "--set", "train.steps=400", "--set", "checkpoint.every=0", cwd=tmp_path)
    run_dir = run_dir_of(tmp_path)
    wait_for(lambda: (state_of(run_dir).get("step") or 0) >= 2, what="step 2")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert json.loads(out.splitlines()[-1])["stopped"] is True
    assert state_of(run_dir)["status"] == "stopped"


def test_sigterm_stops_with_a_checkpoint(tmp_path):
    proc = start("run", TOY, "--set", "train.steps=400", "--set", "checkpoint.every=0", cwd=tmp_path)
    run_dir = run_dir_of(tmp_path)
    wait_for(lambda: (state_of(run_dir).get("step") or 0) >= 2, what="step 2")
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM
    final = state_of(run_dir)
    assert final["status"] == "stopped" and final["last_checkpoint"] == final["step"] >= 2


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_bad_states_each_get_one_clear_message(straight, tmp_path):
    _, run_dir = straight
    assert "not a run folder" in cli("run", "--resume", tmp_path, cwd=tmp_path).stderr
    assert "not running" in cli("pause", run_dir, cwd=tmp_path).stderr

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    last = sorted((copy / "checkpoints").glob("step-*"))[-1]
    weights = last / "policies" / "shared" / "model.safetensors"
    store_before = digest(copy / "run.db")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    result = cli("run", "--resume", copy, cwd=tmp_path)
    assert result.returncode == 2 and "truncated checkpoint" in result.stderr and "model.safetensors" in result.stderr
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    result = cli("run", "--resume", copy, cwd=tmp_path)
    assert result.returncode == 2 and "corrupt checkpoint" in result.stderr
    weights.write_bytes(data)

    other = tmp_path / "other.yaml"
    other.write_text(Path(TOY).read_text().replace("policy: shared", "policy: mine").replace("  shared:", "  mine:"))
    result = cli("run", other, "--resume", copy, cwd=tmp_path)
    assert result.returncode == 2 and "does not match the checkpoint" in result.stderr
    assert '\'roles[].policy\' was ["shared", "shared"], now ["mine", "mine"]' in result.stderr
    assert digest(copy / "run.db") == store_before  # nothing was overwritten


def test_a_finished_run_continues_with_more_steps_and_a_role_sampling_more_candidates(straight, tmp_path):
    """The team's shape (roles' names and policies) is fixed on resume; a role's K and sampling are
    not: a finished run continued from its last checkpoint for one more step, the first role with
    its own K 3 and temperature 0.7, samples 3 candidates per group of that role at step 7 (8 before),
    and the MLflow run records the changes as tags."""
    _, run_dir = straight
    copy = tmp_path / "more"
    shutil.copytree(run_dir, copy)
    more = ["--set", "train.steps=7", "--set", "roles.0.k=3", "--set", "roles.0.sampling.temperature=0.7"]
    result = cli("run", "--resume", copy, *more, cwd=run_dir.parent.parent)
    assert result.returncode == 0, result.stderr[-3000:]
    sizes = RunStore(copy / "run.db").rows(
        "SELECT e.step, t.role, COUNT(*) AS n FROM candidates c JOIN turns t ON c.turn_id = t.id "
        "JOIN episodes e ON t.episode_id = e.id WHERE e.kind = 'train' AND e.step IN (6, 7) GROUP BY t.id"
    )
    assert {(r["step"], r["role"], r["n"]) for r in sizes} == {
        (6, "first", 8),
        (6, "second", 8),
        (7, "first", 3),
        (7, "second", 8),
    }
    from mlflow.tracking import MlflowClient

    store = RunStore(copy / "run.db")
    meta = store.meta()
    tags = MlflowClient(meta["mlflow_uri"]).get_run(meta["mlflow_run_id"]).data.tags
    assert tags.get("mas_lab.resumed.roles.0.k") == "None -> 3", {k: v for k, v in tags.items() if "resumed" in k}
    (changed,) = [
        r["message"] for r in store.rows("SELECT message FROM events WHERE message LIKE 'changed on resume%'")
    ]
    assert "roles.0.k None -> 3" in changed and "train.steps" in changed  # in the store too, not only MLflow
