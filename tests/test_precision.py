"""dtype auto: bfloat16 only where the device computes it natively (mas_lab/modeling/precision.py). On a CPU
without avx512_bf16 / amx_bf16 / bf16, torch emulates bf16 products tens of times slower than
float32, so the shipped tasks ask for auto and a run that asks for bf16 there says so."""

from pathlib import Path

import pytest
import torch
from conftest import ROOT

from mas_lab import runs
from mas_lab.config import load_task
from mas_lab.learner.learner import Learner
from mas_lab.modeling import precision
from mas_lab.modeling.models import resolve as model_folder
from mas_lab.rollout.engine import HFEngine

NO_BF16 = frozenset({"fpu", "sse2", "avx2", "fma"})  # an AMD EPYC Zen 3: no AVX-512 at all
BF16 = frozenset({"fpu", "avx2", "avx512f", "avx512_bf16"})


@pytest.fixture
def cpu(monkeypatch):
    def set_flags(flags):
        monkeypatch.setattr(precision, "cpu_flags", lambda: flags)

    return set_flags


def test_auto_is_bfloat16_only_on_a_cpu_with_native_bf16(cpu):
    cpu(NO_BF16)
    assert precision.resolve("auto", "cpu") == "float32"
    assert precision.report("bfloat16", "cpu") == {
        "requested": "bfloat16",
        "dtype": "bfloat16",
        "device": "cpu",
        "emulated_bf16": True,
        "native_bf16": False,
    }
    cpu(BF16)
    assert precision.resolve("auto", "cpu") == "bfloat16"
    assert precision.report("bfloat16", "cpu")["emulated_bf16"] is False
    for flags in ({"amx_bf16"}, {"bf16", "asimd"}):  # AMX (x86), aarch64's BF16
        cpu(frozenset(flags))
        assert precision.resolve("auto", "cpu") == "bfloat16"
    assert precision.resolve("float32", "cpu") == "float32"
    with pytest.raises(ValueError, match="allowed are auto, float32, bfloat16"):
        precision.resolve("float16", "cpu")


def test_auto_on_cuda_asks_the_device():
    expected = "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    assert precision.resolve("auto", "cuda") == expected


def test_the_flags_come_from_this_machines_cpuinfo():
    precision.cpu_flags.cache_clear()
    flags = precision.cpu_flags()
    if Path("/proc/cpuinfo").is_file():
        assert flags, "no flags line read from /proc/cpuinfo"
        assert precision.native_bf16("cpu") == bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def test_the_engine_and_the_learner_compute_in_the_resolved_dtype(cpu):
    from mas_lab.config import Algorithm

    folder = model_folder("tiny-test")
    for flags, dtype in ((NO_BF16, torch.float32), (BF16, torch.bfloat16)):
        cpu(flags)
        engine = HFEngine(folder, dtype="auto", threads=1)
        assert next(engine.model.parameters()).dtype == dtype and engine.precision["dtype"] == str(dtype)[6:]
        learner = Learner(folder, Algorithm(), dtype="auto", threads=1)
        assert learner.autocast == (dtype == torch.bfloat16)
        assert next(learner.model.parameters()).dtype == torch.float32  # master weights stay float32
        assert next(iter(learner.weights("shared").values())).dtype == dtype  # what the engine is sent


def _train(tmp_path: Path, dtype: str) -> tuple[dict, list[dict]]:
    task = load_task(
        ROOT / "tasks" / "toy.yaml",
        [
            f"policies.shared.dtype={dtype}",
            "train.steps=1",
            "train.eval_every=0",
            "checkpoint.every=0",
            f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlruns.db'}",
        ],
    )
    run = runs.new_run(task, ROOT / "tasks" / "toy.yaml", tmp_path / dtype)
    told: list[str] = []
    summary = runs.train(run, use_ray=False, progress=lambda event: told.append(event.phase))
    events = run.store.rows("SELECT kind, message FROM events ORDER BY rowid")
    run.store.close()
    return {**summary, "told": told}, events


@pytest.mark.integration
def test_a_run_records_its_dtypes_and_warns_when_bf16_is_emulated(tmp_path, cpu):
    cpu(NO_BF16)
    summary, events = _train(tmp_path, "bfloat16")
    assert set(summary["precision"].values()) == {"bfloat16"} and len(summary["precision"]) == 2  # worker, learner
    kinds = [e["kind"] for e in events]
    assert "precision" in kinds and "warning" in kinds
    warning = next(e["message"] for e in events if e["kind"] == "warning")
    assert "bfloat16 is emulated" in warning and "auto" in warning
    assert any(phase.startswith("warning: bfloat16 is emulated") for phase in summary["told"])

    summary, events = _train(tmp_path, "auto")
    assert set(summary["precision"].values()) == {"float32"}
    assert "warning" not in [e["kind"] for e in events]
    recorded = next(e["message"] for e in events if e["kind"] == "precision")
    assert '"requested": "auto"' in recorded and '"dtype": "float32"' in recorded


def test_no_shipped_task_asks_for_bfloat16_outright():
    """bf16 is fast only where the hardware has it: the shipped tasks say auto, so a CPU without it
    runs them in float32 instead of tens of times slower."""
    asked = {
        path.name: policy.dtype
        for path in sorted((ROOT / "tasks").glob("*.yaml"))
        for policy in load_task(path).policies.values()
        if policy.dtype == "bfloat16"
    }
    assert not asked, asked


def test_a_run_warns_where_float32_was_asked_on_a_cpu_with_native_bf16(tmp_path):
    """A setting that wastes a CPU: float32 where bf16 is native (about twice the step time)."""
    from mas_lab import runs
    from mas_lab.records.store import RunStore

    class Opened:
        store = RunStore(tmp_path / "run.db")

    said = []
    reports = {
        "learner full:shared": {
            "requested": "float32",
            "dtype": "float32",
            "device": "cpu",
            "emulated_bf16": False,
            "native_bf16": True,
        },
        "rollout full:other#0": {
            "requested": "auto",
            "dtype": "bfloat16",
            "device": "cpu",
            "emulated_bf16": False,
            "native_bf16": True,
        },
    }
    runs._record_precision(Opened, 0, reports, lambda event: said.append(event.phase))
    assert len(said) == 1 and "float32 where this machine computes bfloat16 natively" in said[0]
    assert "learner full:shared" in said[0] and "other" not in said[0]


@pytest.mark.integration
def test_a_resume_on_a_machine_that_resolves_auto_otherwise_refuses_and_continues_in_the_trained_dtype(tmp_path, cpu):
    """`dtype: auto` resolves by the machine: a run that trained in float32 (no native bf16) and is
    resumed where bf16 is native would switch to bf16 autocast mid-run. It refuses with the way on
    (runs._check_precision), trains nothing, and continues once the dtype it trained in is named."""
    cpu(NO_BF16)
    overrides = ["policies.shared.dtype=auto", "train.steps=1", "train.eval_every=0", "checkpoint.every=1"]
    overrides.append("checkpoint.background=false")
    overrides.append(f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlruns.db'}")
    task = load_task(ROOT / "tasks" / "toy.yaml", overrides)
    run = runs.new_run(task, ROOT / "tasks" / "toy.yaml", tmp_path / "run")
    assert set(runs.train(run, use_ray=False)["precision"].values()) == {"float32"}
    run.store.close()
    runs.release_lock(run.run_dir)

    cpu(BF16)
    again = runs.resume(run.run_dir, None, ["train.steps=2"])
    with pytest.raises(runs.RunError) as refused:
        runs.train(again, use_ray=False)
    runs.release_lock(again.run_dir)
    said = str(refused.value)
    assert "float32 -> bfloat16" in said and "--set policies.shared.dtype=float32" in said, said
    assert again.store.rows("SELECT MAX(step) AS last FROM steps")[0]["last"] == 1  # nothing trained
    again.store.close()

    # auto -> float32 is not a change of policy where auto trained in float32: allowed, and it goes on
    onward = runs.resume(run.run_dir, None, ["train.steps=2", "policies.shared.dtype=float32"])
    summary = runs.train(onward, use_ray=False)
    assert set(summary["precision"].values()) == {"float32"}
    assert onward.store.rows("SELECT MAX(step) AS last FROM steps")[0]["last"] == 2
    onward.store.close()
