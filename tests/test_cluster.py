"""A real two-node Ray cluster on this machine: `ray start --head` plus a second `ray start
--address`, each with its own CPUs; a toy run joins it with --address and 2 rollout workers."""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from mas_lab.store import RunStore

from conftest import ROOT

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ours(temp_dir: str) -> list[psutil.Process]:
    """The processes of the cluster this test started (their command lines name its temp dir)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(temp_dir in part for part in proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


@pytest.fixture
def cluster():
    temp_dir = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = _free_port()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    common = ["--num-cpus", "2", "--temp-dir", temp_dir, "--disable-usage-stats"]
    try:
        subprocess.run([str(BIN / "ray"), "start", "--head", "--port", str(port), "--include-dashboard", "false",
                        *common], check=True, capture_output=True, text=True, env=env, timeout=180)
        subprocess.run([str(BIN / "ray"), "start", "--address", f"127.0.0.1:{port}", *common], check=True,
                       capture_output=True, text=True, env={**env, "RAY_AUTH_MODE": "token"}, timeout=180)
        yield f"127.0.0.1:{port}", temp_dir
    finally:
        procs = _ours(temp_dir)
        for proc in procs:
            proc.terminate()
        _, alive = psutil.wait_procs(procs, timeout=20)
        for proc in alive:
            proc.kill()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_a_toy_run_on_a_two_node_cluster_uses_both_nodes(cluster, tmp_path):
    address, temp_dir = cluster
    proc = subprocess.run([str(BIN / "mas-lab"), "run", str(ROOT / "tasks" / "toy.yaml"), "--address", address,
                           "--set", "resources.rollout_workers=2", "--set", "train.steps=2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.splitlines()[-1])
    store = RunStore(tmp_path / summary["run_dir"] / "run.db", create=False)
    assert store.meta()["status"] == "finished"
    placement = [e for e in store.events() if e["kind"] == "placement"]
    assert placement, "the run records where its actors ran"
    nodes = json.loads(placement[0]["message"].split(": ", 1)[1])
    workers = {name: node for name, node in nodes.items() if name.startswith("rollout")}
    assert len(workers) == 2 and len(set(workers.values())) == 2  # one rollout worker on each node
    assert len(set(nodes.values())) == 2
    steps = [s for s, m in store.metrics().items() if "time/step" in m]
    assert steps == [1, 2]
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=store.meta()["mlflow_uri"])
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")] == [1, 2]
    assert len(_ours(temp_dir)) > 0  # the cluster outlives the run; the fixture stops it
