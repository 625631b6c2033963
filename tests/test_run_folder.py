"""One loader for every run folder (mas_lab/records/run_folder.py): a study's kept run (run.db.xz +
task.yaml + summary.json) opens in replay, plot, runs, export and the notebook API like a live
run folder does; what is not a run folder gets one line saying what it is."""

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT
from typer.testing import CliRunner

from mas_lab.cli import app

KEPT = ROOT / "results" / "credit" / "sokoban" / "at-grpo-at-grpo" / "seed-0"
runner = CliRunner()


def test_a_kept_run_replays_as_text():
    result = runner.invoke(app, ["replay", str(KEPT), "--text", "--step", "1"])
    assert result.exit_code == 0, result.output
    assert "=== turn 0" in result.output and "not a run folder" not in result.output


def test_runs_lists_a_studys_kept_runs_at_any_depth():
    result = runner.invoke(app, ["runs", str(KEPT.parent.parent), "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert len(rows) == 18 and {r["status"] for r in rows} == {"finished"}
    assert "at-grpo-at-grpo/seed-0" in {r["run"] for r in rows}


def test_plot_of_a_kept_run_writes_beside_it(tmp_path):
    copy = tmp_path / "seed-0"
    shutil.copytree(KEPT, copy)
    result = runner.invoke(app, ["plot", str(copy)])
    assert result.exit_code == 0, result.output
    assert (copy / "plots" / "success.png").is_file()
    assert sorted(p.name for p in copy.iterdir()) == ["plots", "run.db.xz", "summary.json", "task.yaml"]


def test_a_truncated_kept_store_is_one_line(tmp_path):
    copy = tmp_path / "seed-0"
    shutil.copytree(KEPT, copy)
    packed = copy / "run.db.xz"
    packed.write_bytes(packed.read_bytes()[:5000])
    result = runner.invoke(app, ["replay", str(copy), "--text"])
    assert result.exit_code == 2 and "damaged, it does not unpack" in result.output


@pytest.mark.parametrize(
    "make, said",
    [(lambda p: p / "nope", "no such task file or run folder"), (lambda p: p, "a folder, but not a run folder")],
    ids=["missing", "an empty folder"],
)
def test_tui_says_which_kind_of_target_is_wrong(tmp_path, make, said):
    result = runner.invoke(app, ["tui", str(make(tmp_path))])
    assert result.exit_code == 2 and said in result.output


def test_load_study_refuses_what_is_not_a_folder_of_runs(tmp_path):
    import mas_lab

    with pytest.raises(FileNotFoundError, match="no such folder"):
        mas_lab.load_study(tmp_path / "nope")
    (tmp_path / "mine.yaml").write_text("name: x\n")
    with pytest.raises(NotADirectoryError, match="a file; load_study takes the folder"):
        mas_lab.load_study(tmp_path / "mine.yaml")
    with pytest.raises(FileNotFoundError, match="no run folder"):
        mas_lab.load_study(tmp_path)
    study = mas_lab.load_study(KEPT.parent)
    assert len(study.runs) == 3


def test_status_of_a_run_whose_process_is_gone_says_its_actors_are_gone(tmp_path):
    """A Ray run's last heartbeat said `actors_alive: true`; once its process exited, status must not
    repeat it (the actors ended with the run)."""
    from mas_lab.records.control import RunControl
    from mas_lab.records.store import RunStore

    store = RunStore(tmp_path / "run.db")
    store.set_meta(status="stopped", state={"step": 3, "actors_alive": True, "pid": 1})
    store.close()
    state = RunControl(RunStore(tmp_path / "run.db", create=False)).status()
    assert state["running"] is False and state["actors_alive"] is False


def test_compare_shows_what_each_update_did_and_pairs_the_runs(toy_run, tmp_path):
    """The claims issue: the clip's binding share per run beside the paired verdicts (runs of one
    seed, on the same held-out problems)."""
    from mas_lab.analysis.compare import compare

    text = compare([toy_run[1], ROOT / "sample_runs" / "toy"], tmp_path / "out").read_text()
    assert "What the updates did:" in text and "| shared |" in text
    assert "Paired on the same held-out problems" in text and "not distinguishable" in text


def test_an_evaluation_candidate_has_no_advantage_and_counts_read_right():
    from mas_lab.records.episode_text import candidate_headline, count

    c = {"components": {"x": 1.0}, "reward": 1.0, "team": 1.0, "local": 0.0, "advantage": 0.0, "response_tokens": 3}
    assert "no advantage (evaluation)" in candidate_headline(c, "eval") and "+0.000" not in candidate_headline(
        c, "eval"
    )
    assert "advantage +0.000" in candidate_headline(c)
    assert count(1, "candidate") == "1 candidate" and count(4, "candidate") == "4 candidates"
    result = runner.invoke(app, ["replay", str(ROOT / "sample_runs" / "toy"), "--text", "--kind", "eval"])
    assert result.exit_code == 0 and "no advantage (evaluation)" in result.output


def test_help_texts_say_what_the_commands_do():
    def words(args):
        return " ".join(runner.invoke(app, args).output.replace("│", " ").split())

    tui_help = words(["tui", "--help"])
    assert "in replay once it has finished" not in tui_help and "live screen" in tui_help
    study_help = words(["study", "run", "--help"])
    assert "one JSON line per complete run" not in study_help and "one JSON list" in study_help


def test_an_error_with_brackets_is_printed_as_written(tmp_path):
    """Error text went through Rich markup: '[bold]' in a path, a pattern like '[a-z0-9]', vanished."""
    folder = tmp_path / "runs[bold]x" / "[a-z0-9]"
    result = runner.invoke(app, ["replay", str(folder), "--text"])
    assert result.exit_code == 2 and "[bold]" in result.output and "[a-z0-9]" in result.output


def test_export_never_writes_over_the_runs_own_store(tmp_path):
    run = tmp_path / "toy"
    shutil.copytree(ROOT / "sample_runs" / "toy", run)
    before = (run / "run.db").read_bytes()
    result = runner.invoke(app, ["export", str(run), "-o", str(run / "run.db"), "--force", "--format", "jsonl"])
    assert result.exit_code == 2 and "the run's own store" in result.output
    assert (run / "run.db").read_bytes() == before
    kept = tmp_path / "kept"
    shutil.copytree(KEPT, kept)
    result = runner.invoke(app, ["export", str(kept), "-o", str(kept / "run.db.xz"), "--force", "--format", "jsonl"])
    assert result.exit_code == 2 and "the run's own store" in result.output


def test_an_export_that_fails_midway_leaves_no_partial_file(tmp_path, monkeypatch):
    """A full disk once left a partial file that blocked the retry (it 'exists')."""
    from mas_lab.analysis import export

    def full(rows, output, batch=5000):
        Path(output).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "_parquet", full)
    out = tmp_path / "x.parquet"
    with pytest.raises(OSError):
        export.export_records(ROOT / "sample_runs" / "toy", out, "parquet")
    assert list(tmp_path.iterdir()) == []
    assert export.export_records(ROOT / "sample_runs" / "toy", tmp_path / "x.jsonl", "jsonl") > 0


def _damaged_copy(tmp_path, how):
    run = tmp_path / "study" / "bad" / "seed-0"
    shutil.copytree(ROOT / "sample_runs" / "toy", run)
    data = (run / "run.db").read_bytes()
    if how == "truncated":
        (run / "run.db").write_bytes(data[: len(data) // 3])
    elif how == "zeroed page":
        (run / "run.db").write_bytes(data[:8192] + b"\0" * 4096 + data[12288:])
    elif how == "text":
        (run / "run.db").write_text("hello")
    return run


@pytest.mark.parametrize("how", ["truncated", "zeroed page", "text"])
def test_a_damaged_store_is_refused_by_load_run_and_named_by_compare_and_load_study(tmp_path, how):
    import mas_lab
    from mas_lab.records.store import StoreError

    run = _damaged_copy(tmp_path, how)
    with pytest.raises(StoreError):
        mas_lab.load_run(run)
    result = runner.invoke(app, ["compare", str(run), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    shutil.copytree(ROOT / "sample_runs" / "toy", tmp_path / "study" / "good" / "seed-0")
    study = mas_lab.load_study(tmp_path / "study")
    assert list(study.runs) == ["good/seed-0"] and list(study.damaged) == ["bad/seed-0"]
    assert len(study.summary) == 2  # the damaged run has its row, saying why
    result = runner.invoke(app, ["compare", str(tmp_path / "study"), "-o", str(tmp_path / "out2")])
    assert result.exit_code == 0, result.output
    assert "Not compared (damaged): `study/bad/seed-0`" in (tmp_path / "out2" / "compare.md").read_text()


def test_compares_band_treats_runs_not_episodes_as_the_unit():
    """Three runs at 0.688, 0.703 and 0.156 were drawn with a pooled Wilson band of +-0.07: the
    band across seeds is a t-interval over the runs, wide where they disagree."""
    from mas_lab.analysis.compare import _band_by_step, gather

    runs = gather(
        [ROOT / "sample_runs" / n for n in ("plan_path_learns_smollm2", "plan_path_constant_answer_smollm2")],
        group_by="task",
    )
    ((step, low, high),) = [b for b in _band_by_step(runs) if b[0] == 30]
    assert high - low > 0.5  # 0.688 and 0.156: two runs that disagree make a wide interval


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory"),
        RuntimeError("can't start new thread"),
        ImportError("libtorch_cpu.so: failed to map segment from shared object"),
        MemoryError(),
    ],
    ids=["allocator", "thread", "shared library", "MemoryError"],
)
def test_running_out_of_memory_is_one_line_with_what_to_do(tmp_path, monkeypatch, error):
    """Under `prlimit --as` a training ended in a 149-368-line traceback: the allocator, a thread's
    stack and torch's own library each fail differently under an address-space limit. With no
    checkpoint written it says to start again (a resume would refuse)."""
    from mas_lab import runs

    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs, "train", out_of_memory)
    result = runner.invoke(app, ["run", str(ROOT / "tasks" / "toy.yaml"), "--no-ray"])
    assert result.exit_code == 1 and "ran out of memory" in result.output, result.output
    assert "start it again (no checkpoint was written)" in result.output and "--resume" not in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "error",
    [MemoryError(), ImportError("_rust.abi3.so: failed to map segment from shared object")],
    ids=["MemoryError", "a library that failed to map"],
)
def test_running_out_of_memory_while_opening_mlflow_is_not_called_a_bad_uri(tmp_path, monkeypatch, error):
    """A MemoryError while the run opens its MLflow store is the machine's limit: one line, exit 1,
    no run folder left; the URI is not blamed (it said "MLflow cannot use it", exit 2). So is an
    MLflow library that failed to map under an address-space limit (it said the URI was wrong)."""
    from mas_lab import runs

    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runs, "Tracker", out_of_memory)
    result = runner.invoke(app, ["run", str(ROOT / "tasks" / "toy.yaml"), "--no-ray", "--run-dir", "runs/r"])
    assert result.exit_code == 1 and "ran out of memory while starting" in result.output, result.output
    assert "cannot use it" not in result.output and "Traceback" not in result.output
    assert not (tmp_path / "runs" / "r").exists()


@pytest.mark.integration
def test_an_address_space_limit_too_small_for_torch_fails_the_run_in_one_line(tmp_path):
    """`prlimit --as` below what torch's library needs: the import failed outside the run's record
    (status "crashed", a 72-line traceback); it is the run's failure now, with its reason. The limit
    sits mid-band: on one 2-core machine 0.6-1.0 GB failed cleanly where torch's or ray's library maps
    (1.0 GB once let torch load and abort in C++ with bad_alloc; below ~0.55 GB the interpreter cannot
    raise cleanly); CI's machine at 0.7 GB failed importing a module while writing the line (now
    imported with the CLI)."""
    import json
    import resource
    import subprocess
    import sys

    mas_lab = str(Path(sys.executable).parent / "mas-lab")
    proc = subprocess.run(
        [mas_lab, "run", str(ROOT / "tasks" / "toy.yaml"), "--no-ray", "--run-dir", "runs/r"]
        + ["--set", f"tracking.mlflow_uri=sqlite:///{tmp_path / 'ml.db'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (800_000_000, 800_000_000)),
    )
    assert proc.returncode == 1 and "ran out of memory" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    state = json.loads(
        subprocess.run([mas_lab, "status", "runs/r"], cwd=tmp_path, capture_output=True, text=True).stdout
    )
    assert state["status"] == "failed" and state["error"], state
