"""Every shipped task file validates, and each tiny variant trains one step end to end."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from mas_lab.config import load_task
from mas_lab.records.store import RunStore

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
TINY = sorted(p.name for p in (ROOT / "tasks").glob("*_tiny.yaml"))


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "tasks").glob("*.yaml")))
def test_every_task_file_validates(name):
    assert load_task(ROOT / "tasks" / name).roles


@pytest.mark.integration
@pytest.mark.parametrize("name", TINY)
def test_tiny_variant_runs_a_step(name, tmp_path):
    proc = subprocess.run(
        [
            MAS_LAB,
            "run",
            str(ROOT / "tasks" / name),
            "--no-ray",
            "--set",
            "train.steps=1",
            "--set",
            "train.eval_problems=2",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    store = RunStore(tmp_path / json.loads(proc.stdout.splitlines()[-1])["run_dir"] / "run.db")
    assert store.episode_steps() == [1]
    assert store.rows("SELECT COUNT(*) AS n FROM candidates")[0]["n"] > 0
