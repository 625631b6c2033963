"""A real two-node Ray cluster on this machine: `ray start --head` plus a second `ray start
--address`, each with its own CPUs, with token auth and without; a toy run joins it with --address
and 2 rollout workers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from mas_lab.records.store import RunStore

BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.integration, pytest.mark.ray]


@pytest.mark.slow
@pytest.mark.parametrize("cluster", ["token", "no-auth"], indirect=True)
def test_a_toy_run_on_a_two_node_cluster_uses_both_nodes(cluster, tmp_path):
    """With token auth (the token in ~/.ray) and without (a machine with no token, whose head ran
    without auth: the client must not ask for a token it does not have)."""
    address, temp_dir, env = cluster
    from conftest import cluster_processes as _ours

    proc = subprocess.run(
        [
            str(BIN / "mas-lab"),
            "run",
            str(ROOT / "tasks" / "toy.yaml"),
            "--address",
            address,
            "--set",
            "resources.rollout_workers=2",
            "--set",
            "train.steps=2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
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
