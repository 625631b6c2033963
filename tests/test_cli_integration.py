"""`mas-lab run tasks/toy.yaml` end to end in a real process: real Ray actors, a real MLflow
SQLite store and the run store it leaves; then `mas-lab replay --text` on that run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from mas_lab.records.provenance import code_version
from mas_lab.records.store import RunStore

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")

pytestmark = [pytest.mark.integration, pytest.mark.ray]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("cli")
    proc = subprocess.run(
        [MAS_LAB, "run", str(ROOT / "tasks" / "toy.yaml"), "--set", "train.steps=3", "--set", "train.eval_every=2"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return cwd, summary, proc


def test_run_prints_progress_and_a_summary(finished_run):
    _, summary, proc = finished_run
    assert "step    3" in proc.stderr and "eval success before" in proc.stderr and "tokens per second" in proc.stderr
    assert set(summary) == {
        "run_dir",
        "mlflow_run_id",
        "eval_before",
        "eval_after",
        "before",
        "after",
        "latest",
        "constant",
        "baselines",
        "hard_after",
        "verdict",
        "paired",
        "update",
        "steps",
        "stopped",
        "precision",
        "code",
    }
    # the paired comparison of the evaluations before and after, on the same problems
    assert set(summary["paired"]["change"]) >= {"word", "n", "a_only", "b_only", "p_value", "diff_ci"}
    assert 0.0 <= summary["update"]["shared"]["clip_bound_share"] <= 1.0  # what the updates did
    assert summary["code"] == [code_version()]  # one fingerprint: the run was never resumed by other code
    assert summary["precision"] == {"rollout full:shared#0": "float32", "learner full:shared": "float32"}
    assert "dtype (rollout and learner)" in proc.stderr
    assert summary["constant"] is None and "best constant answer (no model)" in proc.stderr  # toy has none
    assert summary["steps"] == 3 and summary["stopped"] is False


def test_the_run_store_holds_every_step_episode_turn_and_candidate(finished_run):
    cwd, summary, _ = finished_run
    store = RunStore(cwd / summary["run_dir"] / "run.db")
    meta = store.meta()
    assert meta["status"] == "finished" and meta["mlflow_run_id"] == summary["mlflow_run_id"]
    # 3 train steps x 4 problems; evals at steps 0, 2 and 3 on 4 held-out problems
    counts = store.rows("SELECT kind, step, COUNT(*) AS n FROM episodes GROUP BY kind, step ORDER BY kind, step")
    assert [(r["kind"], r["step"], r["n"]) for r in counts] == [
        ("eval", 0, 4),
        ("eval", 2, 4),
        ("eval", 3, 4),
        ("train", 1, 4),
        ("train", 2, 4),
        ("train", 3, 4),
    ]
    per_turn = store.rows(
        "SELECT t.id, COUNT(c.id) AS n, SUM(c.chosen) AS chosen FROM turns t JOIN candidates c "
        "ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id WHERE e.kind = 'train' GROUP BY t.id"
    )
    assert len(per_turn) == 3 * 4 * 2 * 2 and all(r["n"] == 8 and r["chosen"] == 1 for r in per_turn)
    groups = store.rows("SELECT step, COUNT(*) AS n FROM groups GROUP BY step")
    assert [(g["step"], g["n"]) for g in groups] == [(1, 16), (2, 16), (3, 16)]
    metrics = store.metrics()
    for step in (1, 2, 3):
        for key in (
            "reward/mean",
            "reward/first",
            "reward/second/t1",
            "zero_std_frac",
            "loss/shared",
            "clip_frac/shared",
            "grad_norm/shared",
            "time/rollout",
            "time/reward",
            "time/learner",
            "time/weight_sync",
            "time/other",
            "tokens_per_s",
            "rollout_gflop/shared",  # counted FLOPs (modeling/flops.py), rollout and learner
            "rollout_gflops_per_s/shared",
            "learner_gflop/shared",
            "learner_gflops_per_s/shared",
        ):
            assert key in metrics[step], (step, key)
    assert "eval/success_rate" in metrics[0] and "eval/success_rate" in metrics[2]


def test_the_mlflow_run_has_params_artifact_and_one_value_per_step(finished_run):
    cwd, summary, _ = finished_run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{cwd / 'mlruns.db'}")
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["algorithm.k"] == "8" and run.data.params["env.name"] == "toy"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert sorted(m.step for m in history) == [1, 2, 3]
    evals = client.get_metric_history(run.info.run_id, "eval/success_rate")
    assert sorted(m.step for m in evals) == [0, 2, 3]
    for key in ("time/learner", "tokens_per_s", "loss/shared", "zero_std_frac"):
        assert key in run.data.metrics
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert {"task.yaml", "completions", "charts"} <= set(artifacts)
    tables = {a.path for a in client.list_artifacts(run.info.run_id, "completions")}
    assert tables == {"completions/eval.json", "completions/train.json"}
    charts = {a.path for a in client.list_artifacts(run.info.run_id, "charts")}
    assert "charts/success.png" in charts


def test_replay_text_shows_every_candidate_and_the_chosen_one(finished_run):
    cwd, summary, _ = finished_run
    proc = subprocess.run(
        [MAS_LAB, "replay", summary["run_dir"], "--text", "--step", "2", "--episode", "1"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "episode 1 of step 2 (train)" in out
    assert out.count("=== turn") == 4 and "agent first" in out and "agent second" in out
    assert out.count(" * [") == 4  # one chosen candidate per (turn, agent)
    assert out.count("advantage") == 4 * 8


def test_replay_of_a_folder_that_is_not_a_run(tmp_path):
    proc = subprocess.run([MAS_LAB, "replay", str(tmp_path), "--text"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a run folder" in proc.stderr
