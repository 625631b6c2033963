"""`mas-lab eval`: deterministic with a seed, loads checkpoints, switches mode and swaps policies."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from mas_lab.records.store import RunStore

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")

pytestmark = [pytest.mark.integration]


def cli(*args, cwd):
    proc = subprocess.run([MAS_LAB, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(proc.stdout.strip().splitlines()[-1])


def without_time(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("time", "run_dir")}


def test_eval_gives_the_same_numbers_twice_with_the_same_seed(tmp_path):
    args = ("eval", ROOT / "tasks" / "toy.yaml", "--samples", "3", "--problems", "5", "--no-ray")
    _, first = cli(*args, cwd=tmp_path)
    proc, second = cli(*args, cwd=tmp_path)
    assert without_time(first) == without_time(second)
    assert "success rate" in proc.stdout and "95% interval" in proc.stdout
    store = RunStore(tmp_path / second["run_dir"] / "run.db")
    assert store.rows("SELECT COUNT(*) AS n FROM episodes WHERE kind = 'eval'")[0]["n"] == 15
    _, other_seed = cli(*args, "--set", "train.seed=1", cwd=tmp_path)
    assert other_seed["run_dir"] != second["run_dir"]


def test_eval_of_a_checkpoint_reproduces_the_training_runs_final_eval(tmp_path):
    _, trained = cli("run", ROOT / "tasks" / "toy_lora.yaml", "--set", "train.steps=6", "--no-ray", cwd=tmp_path)
    run_dir = tmp_path / trained["run_dir"]
    final = RunStore(run_dir / "run.db").metrics(6)[6]
    _, evaluated = cli(
        "eval",
        ROOT / "tasks" / "toy_lora.yaml",
        "--checkpoint",
        run_dir / "checkpoints" / "step-000006",
        "--no-ray",
        cwd=tmp_path,
    )
    assert evaluated["success_rate"] == final["eval/success_rate"] == trained["eval_after"]
    assert evaluated["team_reward"] == final["eval/team_reward"]
    _, untrained = cli("eval", ROOT / "tasks" / "toy_lora.yaml", "--no-ray", cwd=tmp_path)
    assert untrained["success_rate"] == trained["eval_before"]
    # the paper's swap ablation and the single-agent view of the same checkpoint run too
    proc, swapped = cli(
        "eval",
        ROOT / "tasks" / "toy_lora.yaml",
        "--checkpoint",
        run_dir / "checkpoints" / "step-000006",
        "--swap-policies",
        "--no-ray",
        cwd=tmp_path,
    )
    assert "first (second)" in proc.stdout and "second (first)" in proc.stdout
    proc, single = cli(
        "eval",
        ROOT / "tasks" / "toy_lora.yaml",
        "--checkpoint",
        run_dir / "checkpoints" / "step-000006",
        "--mode",
        "single_agent",
        "--no-ray",
        cwd=tmp_path,
    )
    assert "solver (second)" in proc.stdout


def test_eval_of_a_checkpoint_without_the_policy_fails_clearly(tmp_path):
    folder = tmp_path / "ckpt" / "policies" / "other"
    folder.mkdir(parents=True)
    proc = subprocess.run(
        [MAS_LAB, "eval", ROOT / "tasks" / "toy.yaml", "--checkpoint", tmp_path / "ckpt", "--no-ray"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no saved policy ['shared']" in proc.stderr
