"""`mas-lab study`: study files (checked before anything is written), the cells and their status,
a toy study run for real (nested MLflow runs, kept runs not run again), and a 2 x 2 study on a
real two-node Ray cluster that survives a kill of its driver."""

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, wait_for
from typer.testing import CliRunner

from mas_lab.cli import app
from mas_lab.study.driver import cells, study_status
from mas_lab.study.reproduce import FAMILIES
from mas_lab.study.spec import StudyFileError, load_study

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")


def _toy_study(folder: Path, **changes) -> Path:
    """A study of two regimes of the toy task, its folders under `folder`."""
    study = {
        "name": "toy-study",
        "out": str(folder / "study"),
        "seeds": [0, 1],
        "set": ["train.steps=2", "train.eval_every=2", "checkpoint.every=1"],
        "regimes": [
            {"name": "single agent", "task": str(ROOT / "tasks" / "{stem}_single_agent.yaml")},
            {"name": "MAS + AT-GRPO", "task": str(ROOT / "tasks" / "{stem}.yaml")},
        ],
        "untrained": {"MAS (before RL)": "MAS + AT-GRPO"},
        "tasks": [{"key": "toy", "stem": "toy", "title": "the toy task"}],
        "report": {"results_md": str(folder / "report.md"), "images": str(folder / "images")},
    }
    study.update(changes)
    path = folder / "toy-study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def test_the_paper_study_holds_every_task_and_regime_of_the_comparison():
    assert list(FAMILIES) == ["plan_path_tool", "plan_path_paper", "plan_path", "sokoban"]
    for key, family in FAMILIES.items():
        tool = ("single agent + GRPO with the tool",) if key in ("plan_path_tool", "plan_path_paper") else ()
        assert family.names == (
            "single agent + GRPO",
            *tool,
            "MAS + trajectory GRPO",
            "MAS + AT-GRPO shared",
            "MAS + AT-GRPO per-role LoRA",
            "MAS + AT-GRPO per-role full",
        )
        own_k = ["roles.1.k=null", "algorithm.k=8"] if key == "plan_path_paper" else []  # the planner's K 8
        assert family.regimes["MAS + trajectory GRPO"] == (
            f"tasks/{family.stem}.yaml",
            ["algorithm.mode=trajectories", *own_k],
        )
        assert family.results_md.endswith("docs/results/paper.md") and family.seeds == (0, 1, 2)
    assert FAMILIES["plan_path"].archive.endswith("results/reproduce/plan_path")


@pytest.mark.parametrize(
    "change, expected",
    [
        (
            {"regimes": [{"name": "x", "task": "tasks/{stem}.yaml", "swapp": True}], "untrained": {}},
            "regimes.0.swapp: Extra inputs are not permitted; allowed: ['name', 'set', 'swap', 'task', 'tasks']",
        ),
        (
            {"regimes": [{"name": "x", "task": "tasks/{stem}_nope.yaml"}], "untrained": {}},
            "tasks[0] (toy) x regimes[0] (x): ",
        ),
        ({"untrained": {"before": "nobody"}}, "untrained.before: 'nobody' is not a regime"),
        ({"tasks": [{"key": "Toy!", "stem": "toy"}]}, "tasks.0.key: String should match pattern"),
        ({"seeds": []}, "seeds: List should have at least 1 item"),
        ({"set": ["steps"]}, "'steps': expected key.path=value"),
        ({"set": ["train.steps=-1"]}, "train.steps"),
        ({"budget": 3}, "budget: Extra inputs are not permitted; allowed: ["),
    ],
)
def test_a_wrong_study_file_names_the_file_and_the_field(tmp_path, change, expected):
    path = _toy_study(tmp_path, **change)
    with pytest.raises(StudyFileError) as error:
        load_study(path)
    assert str(error.value).startswith(str(path)) and expected in str(error.value), str(error.value)


def test_the_cli_refuses_a_wrong_study_with_exit_2_and_writes_nothing(tmp_path):
    path = _toy_study(tmp_path, untrained={"before": "nobody"})
    result = CliRunner().invoke(app, ["study", str(path)])
    assert result.exit_code == 2 and "is not a regime" in result.output
    good = _toy_study(tmp_path)
    for args in (["--task", "sokoban"], ["--only", "nobody"], ["--seeds", "x"]):
        result = CliRunner().invoke(app, ["study", str(good), *args])
        assert result.exit_code == 2, (args, result.output)
    assert not (tmp_path / "study").exists() and not (tmp_path / "report.md").exists()


def test_cells_go_seed_by_seed_and_status_reads_without_writing(tmp_path):
    families = load_study(_toy_study(tmp_path))
    order = [(c.regime, c.seed) for c in cells(families)]
    assert order == [("single agent", 0), ("MAS + AT-GRPO", 0), ("single agent", 1), ("MAS + AT-GRPO", 1)]
    assert [c.seed for c in cells(families, seeds=[1])] == [1, 1]
    rows = study_status(families)
    assert [r["status"] for r in rows] == ["pending"] * 4
    assert not (tmp_path / "study").exists()


@pytest.mark.integration
def test_a_toy_study_runs_nests_its_runs_in_mlflow_and_does_not_run_kept_runs_again(tmp_path):
    path = _toy_study(tmp_path, seeds=[0])
    proc = subprocess.run([MAS_LAB, "study", str(path)], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.splitlines()[-1])
    assert sorted(r["regime"] for r in rows) == ["MAS + AT-GRPO", "single agent"]
    report = (tmp_path / "report.md").read_text()
    assert "| MAS (before RL) | 0 |" in report and "| MAS + AT-GRPO | 0 |" in report
    assert (tmp_path / "images" / "reproduce_toy.png").is_file()
    study = tmp_path / "study"
    parent = json.loads((study / "study.json").read_text())["mlflow_parent"]
    ((uri, parent_id),) = parent.items()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_run(parent_id).info.experiment_id])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
    assert sorted(r.data.tags["mas_lab.regime"] for r in children) == ["MAS + AT-GRPO", "single agent"]
    assert all(r.data.tags["mas_lab.study"] == "toy-study" for r in children)
    assert client.get_run(parent_id).info.status == "FINISHED"
    status = CliRunner().invoke(app, ["study", "status", str(path), "--json"])
    assert [json.loads(line)["status"] for line in status.output.splitlines()] == ["kept", "kept"]
    run_dirs = sorted(p.parent for p in study.glob("**/seed-0/runs/*/run.db"))
    assert len(run_dirs) == 2 and all((d / "checkpoints").is_dir() for d in run_dirs)  # kept by default
    packed = [p.read_bytes() for p in sorted(study.glob("**/archive/*/seed-0/*"))]
    assert len(packed) == 6  # per run: run.db.xz, summary.json, task.yaml
    again = subprocess.run(
        [MAS_LAB, "study", str(path), "--drop-checkpoints"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert again.returncode == 0 and "runs to go" not in again.stderr  # nothing run twice
    assert not any((d / "checkpoints").exists() for d in run_dirs) and all((d / "run.db").is_file() for d in run_dirs)
    assert again.stderr.count("removed (the run is kept; --drop-checkpoints)") == 2
    assert [p.read_bytes() for p in sorted(study.glob("**/archive/*/seed-0/*"))] == packed  # the archive untouched


def _kill_driver(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started in its session


@pytest.mark.integration
@pytest.mark.ray
@pytest.mark.slow
def test_a_study_on_a_two_node_cluster_runs_two_runs_at_once_and_survives_a_driver_kill(cluster, tmp_path):
    """2 regimes x 2 seeds, each run a Ray task asking 2 CPUs of nodes that have 2: two runs at once,
    one per node. The driver is SIGKILLed while runs are in flight; its Ray tasks die with it, and
    their runs get SIGTERM (they checkpoint and free their folders). A second driver does not run a
    kept run again and continues each interrupted run from its checkpoint."""
    address, _, env = cluster
    path = _toy_study(tmp_path, set=["train.steps=12", "train.eval_every=6", "checkpoint.every=1"])
    command = [MAS_LAB, "study", str(path), "--address", address, "--cpus-per-run", "2"]
    first = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    study = tmp_path / "study" / "toy"
    try:
        # two runs in flight at once, each past a checkpoint (older ones are pruned: any step)
        wait_for(
            lambda: len({p.parents[2] for p in study.glob("*/seed-*/runs/*/checkpoints/step-*/manifest.json")}) >= 2,
            timeout=600,
            what="two runs past a checkpoint at once",
            interval=0.2,
        )
    except AssertionError:
        _kill_driver(first)
        raise AssertionError(first.stderr.read().decode()[-3000:] if first.stderr else "") from None
    nodes = {json.loads(p.read_text())[-1]["node"] for p in study.glob("*/seed-*/segments.json")}
    assert len(nodes) == 2, nodes  # one run on each node
    _kill_driver(first)
    first.wait(timeout=60)
    wait_for(
        lambda: not any(_held(p.parent) for p in study.glob("*/seed-*/runs/*/run.lock")),
        timeout=180,
        what="the orphaned runs to checkpoint and stop",
        interval=0.5,
    )
    kept_before = {p.parent.name + p.parent.parent.name for p in study.glob("archive/*/seed-*/summary.json")}
    second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in study.glob("archive/*/seed-*/summary.json")]
    assert len(results) == 4 and all(r["summary"]["steps"] == 12 for r in results)
    resumed = [r for r in results if r["attempts"] == 2]
    assert len(resumed) >= 2, [r["attempts"] for r in results]  # the two in flight continued
    assert all(len(r["placement"]) == r["attempts"] and all(r["placement"]) for r in results)
    assert all(" ray:" in node for r in results for node in r["placement"])
    assert len({node for r in results for node in r["placement"]}) == 2
    assert kept_before <= {p.parent.name + p.parent.parent.name for p in study.glob("archive/*/seed-*/summary.json")}
    for r in resumed:  # continued in the same run folder, not started again
        assert len(list(Path(r["run_dir"]).parent.glob("*/run.db"))) == 1
    report = (tmp_path / "report.md").read_text()
    assert "| MAS + AT-GRPO | 0, 1 |" in report
    out = tmp_path / "compare"
    compare = CliRunner().invoke(app, ["compare", str(study / "archive"), "-o", str(out)])
    assert compare.exit_code == 0, compare.output
    assert list(out.glob("*.png"))


def _held(run_dir: Path) -> bool:
    from mas_lab.records.control import lock_held

    return lock_held(run_dir)


def test_status_tells_running_interrupted_and_started_runs_apart(tmp_path, toy_run):
    """A copy of a finished toy run as the one attempt of a cell: with its checkpoints it is
    interrupted (continued by the next `mas-lab study`), without them it only started, and while a
    process holds its lock it runs; its step and last held-out success come from its store."""
    import shutil

    from mas_lab.records.control import acquire_lock, release_lock
    from mas_lab.records.store import RunStore
    from mas_lab.study.families import slug

    families = load_study(_toy_study(tmp_path, seeds=[0]))
    _, run_dir, summary = toy_run
    folder = Path(families[0].out) / slug("MAS + AT-GRPO") / "seed-0" / "runs" / run_dir.name
    shutil.copytree(run_dir, folder, ignore=shutil.ignore_patterns("run.lock"))
    (folder.parent.parent / "segments.json").write_text(json.dumps([{"node": "here", "wall_s": 1, "cpu_s": 1}]))
    row = study_status(families)[1]
    assert row["status"] == "interrupted" and row["step"] == summary["steps"] and row["node"] == "here"
    assert row["success"] == summary["eval_after"]
    assert acquire_lock(folder)
    try:
        assert study_status(families)[1]["status"] == "running"
    finally:
        release_lock(folder)
    assert row["steps"] == summary["steps"] and row["left_s"] == 0.0  # a finished copy has nothing left
    task_file = folder / "task.yaml"
    task = yaml.safe_load(task_file.read_text())
    task["train"]["steps"] = summary["steps"] + 2  # two steps left, an evaluation after each (every 2, the end)
    task_file.write_text(yaml.safe_dump(task))
    store = RunStore(folder / "run.db", create=False)
    step_times, eval_times = [v for _, v in store.series("time/step")], [v for _, v in store.series("eval/time")]
    store.close()
    row = study_status(families)[1]
    expected = 2 * statistics.median(step_times[-5:]) + 2 * eval_times[-1]
    assert row["steps"] == summary["steps"] + 2 and row["left_s"] == pytest.approx(expected)
    shutil.rmtree(folder / "checkpoints")
    assert study_status(families)[1]["status"] == "started"
    assert folder.is_dir()  # status removes nothing


def test_time_left_counts_the_steps_and_the_evaluations_still_to_come():
    """At the run's pace: the median of its last five step times per step left, its last
    evaluation's time per evaluation left (every eval_every and at the end)."""
    from mas_lab.training.progress import time_left

    steps = [100.0, 10, 20, 30, 40, 80]  # the first (slow) step is past the last five; their median 30
    assert time_left(steps, [300.0, 7.0], 4, 10, 5) == 6 * 30 + 2 * 7  # evaluations at 5 and 10
    assert time_left(steps, [7.0], 4, 9, 5) == 5 * 30 + 2 * 7  # at 5 and at the end, 9
    assert time_left(steps, [], 4, 9, None) == 5 * 30  # never evaluated yet
    assert time_left(steps, [7.0], 10, 10, 5) == 0.0
    assert time_left([], [7.0], 0, 10, 5) is None  # no step timed yet


def test_the_study_screen_lists_cells_opens_a_run_and_compares_a_task(tmp_path, toy_run):
    """Pilot on a study whose seed-0 MAS cell holds a copy of a finished toy run: the table shows
    every cell live from the folders, enter on a pending cell says there is no run, enter on the
    finished one exits with its run folder (the CLI then opens the dashboard on it), and c shows the
    task's comparison (the pooled table from mas_lab.analysis.compare) with its PNGs written."""
    import asyncio
    import shutil

    from textual.widgets import DataTable, Markdown

    from mas_lab.study.families import slug
    from tui.study import StudyApp, StudyCompareScreen

    families = load_study(_toy_study(tmp_path))
    _, run_dir, summary = toy_run
    folder = Path(families[0].out) / slug("MAS + AT-GRPO") / "seed-0"
    copy = folder / "runs" / run_dir.name
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("run.lock"))
    result = {"regime": "MAS + AT-GRPO", "seed": 0, "run_dir": str(copy), "placement": ["here"], "summary": summary}
    (folder / "summary.json").write_text(json.dumps(result))

    async def go():
        app = StudyApp(families, refresh_s=0.5)
        async with app.run_test(size=(150, 40)) as pilot:
            await pilot.pause()
            table = app.query_one("#cells", DataTable)
            assert table.row_count == 4
            assert [table.get_row_at(i)[3] for i in range(4)] == ["pending", "finished", "pending", "pending"]
            finished = table.get_row_at(1)
            assert finished[4] == f"{summary['steps']}/{summary['steps']}" and finished[7] == "here"
            assert finished[5] == f"{summary['eval_after']:.3f}" and finished[6] == ""  # nothing left
            assert "4 cells: 3 pending, 1 finished" in str(app.query_one("#study-counts").render())
            await pilot.press("enter")  # the first row: pending
            await pilot.pause()
            assert app.is_running
            await pilot.press("c")
            deadline = asyncio.get_running_loop().time() + 120
            while not isinstance(app.screen, StudyCompareScreen):
                assert asyncio.get_running_loop().time() < deadline, "no compare screen"
                await pilot.pause(0.2)
            markdown = app.screen.query_one(Markdown).source
            assert "1 runs compared" in markdown and "MAS + AT-GRPO" in markdown
            assert list((Path(families[0].out) / "compare").glob("*.png"))
            await pilot.press("escape")
            await pilot.press("down")
            await pilot.press("enter")
            await pilot.pause()
        return app.return_value

    assert asyncio.run(go()) == copy


def test_a_pending_cell_is_estimated_at_its_regimes_kept_wall_time():
    """Regimes of one task differ in cost (plan_path_paper: one agent with the tool 5.1 h, a team
    1.2 h): a pending cell takes its own regime's mean, its task's only while its regime has none."""
    from mas_lab.study.driver import _pending_left, status_line

    def row(task, regime, status, wall=None):
        return {"task": task, "regime": regime, "status": status, "wall_s": wall, "left_s": None}

    rows = _pending_left(
        [
            row("paper", "team", "kept", 3600.0),
            row("paper", "team", "finished", 5400.0),
            row("paper", "single with the tool", "kept", 18000.0),
            row("paper", "team", "pending"),
            row("paper", "single with the tool", "pending"),
            row("paper", "per-role LoRA", "pending"),
            row("sokoban", "team", "pending"),
        ]
    )
    assert [r["left_s"] for r in rows[3:]] == [4500.0, 18000.0, 9000.0, None]
    assert "about 8.8 h of runs left for 3 of the 4 unfinished" in status_line(rows)


def test_a_kept_cell_opens_from_its_unpacked_store(tmp_path, toy_run, monkeypatch):
    """A run kept only in the archive (run.db.xz, as results/ ships them) opens as a run folder
    unpacked once into the cache; its status row reads the kept summary."""
    from mas_lab.records.store import RunStore
    from mas_lab.study.driver import cell_run_folder
    from mas_lab.study.runner import keep

    monkeypatch.setenv("MAS_LAB_CACHE", str(tmp_path / "cache"))
    families = load_study(_toy_study(tmp_path, seeds=[0]))
    _, run_dir, summary = toy_run
    result = {"regime": "single agent", "seed": 0, "run_dir": str(run_dir), "summary": summary, "wall_s": 7200.0}
    keep(result, families[0].archive_dir)
    (moved := dict(result))["run_dir"] = str(tmp_path / "gone")  # the work folder is gone
    (families[0].archive_dir / "single-agent" / "seed-0" / "summary.json").write_text(json.dumps(moved))
    row, pending = study_status(families)
    assert row["status"] == "kept" and row["run_dir"] is None and row["success"] == summary["eval_after"]
    assert pending["status"] == "pending" and pending["left_s"] == 7200.0  # its task's mean kept wall time
    shown = CliRunner().invoke(app, ["study", "status", str(tmp_path / "toy-study.yaml")])
    assert "1 kept, 1 pending; about 2.0 h of runs left" in shown.output, shown.output
    folder = cell_run_folder(row)
    assert folder.is_relative_to(tmp_path / "cache") and (folder / "task.yaml").is_file()
    store = RunStore(folder / "run.db", create=False)
    try:
        assert store.steps() == RunStore(run_dir / "run.db", create=False).steps()
    finally:
        store.close()
    assert cell_run_folder(row) == folder  # unpacked once


def test_gradient_norm_spikes_are_counted_per_regime_from_the_kept_stores(tmp_path):
    """A step whose gradient norm exceeds 3x its run's median of nonzero norms is a spike; steps
    with no sample trained (norm 0) are left out; seeds of a regime add up; the samples trained at
    the spike steps and at the others are told apart."""
    import lzma

    from mas_lab.records.store import RunStore
    from mas_lab.study.report import grad_spikes

    def kept(name, norms):
        store = RunStore(tmp_path / f"{name}.db")
        for step, norm in enumerate(norms, 1):
            samples = 4.0 if norm > 3.0 else 64.0  # the spikes trained one group of 4
            metrics = {"grad_norm/shared": norm, "samples/shared": samples, "reward/mean": 0.1}
            store.write_step(step, 0.0, [], "train", metrics=metrics)
        store.finish()
        store.close()
        packed = tmp_path / f"{name}.db.xz"
        packed.write_bytes(lzma.compress((tmp_path / f"{name}.db").read_bytes()))
        return str(packed)

    results = [
        {"regime": "A", "seed": 0, "store": kept("a0", [1.0, 1.1, 0.0, 0.9, 3.5, 1.0])},  # one spike (3.5 > 3 x 1.0)
        {"regime": "A", "seed": 1, "store": kept("a1", [2.0, 2.0, 6.5, 2.1, 7.0])},  # two (median 2.1)
        {"regime": "B", "seed": 0, "store": kept("b0", [1.0, 1.2, 0.8, 2.9])},  # none (median 1.1)
    ]
    lines = grad_spikes(results)
    assert lines[0] == (
        "A: 3 over 2 runs (the largest norm 3.5x its run's median; samples trained at the spike steps, "
        "median 4; at the other steps, median 64)"
    )
    assert lines[1] == "B: 0 over 1 run (the largest norm 2.6x its run's median; at the other steps, median 64)"


def test_the_report_says_which_arms_of_a_seed_began_from_the_same_replies(tmp_path, toy_run):
    """Arms whose first held-out evaluation has the same greedy replies are paired; one reply
    changed in a run's first evaluation puts that run in a group of its own; a later evaluation
    does not count."""
    import lzma
    import sqlite3

    from mas_lab.study.report import starts_line

    def packed(name, change=None):
        db = tmp_path / f"{name}.db"
        shutil.copyfile(toy_run[1] / "run.db", db)
        if change:
            with sqlite3.connect(db) as conn:
                conn.execute(change)
            conn.close()
        (tmp_path / f"{name}.db.xz").write_bytes(lzma.compress(db.read_bytes()))
        return str(tmp_path / f"{name}.db.xz")

    first = "(SELECT min(step) FROM episodes WHERE kind != 'train')"
    changed = (
        "UPDATE candidates SET response = response || ' ' WHERE id = (SELECT min(c.id) FROM candidates c "
        f"JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id WHERE e.kind != 'train' "
        f"AND e.step {{}} {first})"
    )
    same, later, other = packed("same"), packed("later", changed.format(">")), packed("other", changed.format("="))
    runs = [{"regime": name, "seed": 0, "store": store} for name, store in (("A", same), ("B", later))]
    assert starts_line(runs).startswith("Paired starts: on seed 0, every regime's first held-out evaluation")
    said = starts_line([*runs, {"regime": "C", "seed": 0, "store": other}])
    assert said.startswith("Starting points") and said.endswith("seed 0: A, B | C.")
    assert starts_line([runs[0], {**runs[1], "seed": 1}]) == ""  # no seed with two arms: nothing to pair


def test_the_report_counts_each_evaluations_different_first_answers_per_arm(tmp_path, toy_run):
    """answers_lines: per regime and seed, the different first answers at each evaluation, recounted
    from the kept store's greedy replies by eval/distinct_answers' rule (the toy run's recount equals
    the metric it stored); a store whose replies are made one text everywhere shows 1 (a collapsed
    policy), whatever its stored metric says."""
    import lzma
    import sqlite3

    from mas_lab.study.report import answers_lines

    def packed(name, reply=None):
        folder = tmp_path / name
        folder.mkdir()
        db = folder / "run.db"
        shutil.copyfile(toy_run[1] / "run.db", db)
        shutil.copyfile(toy_run[1] / "task.yaml", folder / "task.yaml")
        if reply is not None:
            with sqlite3.connect(db) as conn:
                conn.execute("UPDATE candidates SET response = ?", (reply,))
            conn.close()
        (folder / "run.db.xz").write_bytes(lzma.compress(db.read_bytes()))
        db.unlink()
        return str(folder / "run.db.xz")

    with sqlite3.connect(toy_run[1] / "run.db") as conn:
        found = conn.execute("SELECT step, value FROM metrics WHERE key = 'eval/distinct_answers' ORDER BY step")
        steps = [(step, int(value)) for step, value in found]
    conn.close()
    assert [s for s, _ in steps] == [0, 2, 3]  # before RL, eval_every 2, the end
    assert any(v > 1 for _, v in steps)  # the collapsed copy below differs from it
    runs = [{"regime": "A", "seed": 1, "store": packed("a")}, {"regime": "A", "seed": 0, "store": packed("b", "x")}]
    shown = ", ".join(f"{s}:{v}" for s, v in steps)
    assert answers_lines(runs) == [f"A: seed 0 0:1, 2:1, 3:1; seed 1 {shown}"]


def _source_archive(tmp_path: Path, toy_run) -> Path:
    """Another study's archive holding the finished toy run (3 steps, eval every 2, seed 0) as its
    seed-0 MAS run, the way runner.keep keeps runs."""
    from mas_lab.study.runner import keep

    _, run_dir, summary = toy_run
    archive = tmp_path / "other-archive"
    sets = ["train.steps=3", "train.eval_every=2", "train.seed=0"]
    result = {"regime": "MAS team", "seed": 0, "task": str(ROOT / "tasks" / "toy.yaml"), "overrides": sets}
    result |= {"run_dir": str(run_dir), "wall_s": 7.0, "cpu_s": 9.0, "attempts": 1, "summary": summary}
    keep(result, archive)
    return archive / "mas-team"


def test_a_study_takes_the_same_run_another_study_kept_instead_of_training_it(tmp_path, toy_run):
    """reuse: the source's seed 0 resolves to this study's task (placement aside) and is copied into
    this archive under this study's regime name, marked `reused_from`, reported as taken; nothing is
    trained (no work folder for the cell); a seed the source lacks is left to run."""
    from mas_lab.study.driver import run_study
    from mas_lab.study.families import slug
    from mas_lab.study.runner import archive_folder

    source = _source_archive(tmp_path, toy_run)
    path = _toy_study(
        tmp_path,
        seeds=[0, 1],
        set=["train.steps=3", "train.eval_every=2"],
        tasks=[{"key": "toy", "stem": "toy", "title": "the toy task", "reuse": {"MAS + AT-GRPO": str(source)}}],
    )
    families = load_study(path)
    logged: list[str] = []
    results = run_study(families, only=["MAS + AT-GRPO"], report_only=True, log=logged.append)["toy"]
    assert [(r["regime"], r["seed"], r["reused_from"]) for r in results] == [
        ("MAS + AT-GRPO", 0, str(source / "seed-0"))
    ]
    kept = archive_folder(families[0].archive_dir, "MAS + AT-GRPO", 0)
    assert (kept / "run.db.xz").read_bytes() == (source / "seed-0" / "run.db.xz").read_bytes()
    assert any("seed 0: the same run kept in" in line for line in logged)
    assert not (Path(families[0].out) / slug("MAS + AT-GRPO")).exists()  # not trained here
    assert "1 runs are taken from another study's archive" in (tmp_path / "report.md").read_text()
    assert [r["status"] for r in study_status(families)] == ["pending", "kept", "pending", "pending"]


@pytest.mark.parametrize(
    "change, field", [("train.steps=2", "train.steps: 2 here, 3 kept"), ("algorithm.lr=0.5", "algorithm.lr: 0.5 here")]
)
def test_a_kept_run_that_differs_is_refused_naming_the_field_and_nothing_is_written(tmp_path, toy_run, change, field):
    source = _source_archive(tmp_path, toy_run)
    path = _toy_study(
        tmp_path,
        seeds=[0],
        set=["train.steps=3", "train.eval_every=2", change],
        tasks=[{"key": "toy", "stem": "toy", "reuse": {"MAS + AT-GRPO": str(source)}}],
    )
    result = CliRunner().invoke(app, ["study", "run", str(path), "--only", "MAS + AT-GRPO"])
    assert result.exit_code == 2 and field in result.output and "is not the one this study makes" in result.output
    assert not (tmp_path / "study").exists() and not (tmp_path / "report.md").exists()


@pytest.mark.parametrize(
    "code, said",
    [
        (None, "records no code fingerprint"),
        (["0123456789abcdef"], "was trained by other mas_lab code (0123456789abcdef"),
    ],
)
def test_a_kept_run_made_by_other_code_is_refused_and_nothing_is_written(tmp_path, toy_run, code, said):
    """The same resolved task trained by changed code is not the same run: reuse refuses a kept run
    whose recorded code fingerprint is missing (made before runs recorded one) or differs."""
    import json

    source = _source_archive(tmp_path, toy_run)
    kept = source / "seed-0" / "summary.json"
    result = json.loads(kept.read_text())
    result["summary"].pop("code")
    if code is not None:
        result["summary"]["code"] = code
    kept.write_text(json.dumps(result))
    path = _toy_study(
        tmp_path,
        seeds=[0],
        set=["train.steps=3", "train.eval_every=2"],
        tasks=[{"key": "toy", "stem": "toy", "reuse": {"MAS + AT-GRPO": str(source)}}],
    )
    result = CliRunner().invoke(app, ["study", "run", str(path), "--only", "MAS + AT-GRPO"])
    assert result.exit_code == 2 and said in " ".join(result.output.split())
    assert not (tmp_path / "study").exists() and not (tmp_path / "report.md").exists()


def test_placement_and_an_auto_dtype_do_not_make_a_run_different():
    """tracking and resources say where a run went, not what it is; `dtype: auto` is the dtype the
    run reported computing in."""
    from mas_lab.study.reuse import _computed, differences

    ours = {"policies": {"p": {"dtype": "auto", "lr": 1}}, "tracking": {"runs_dir": "a"}, "resources": {"cpus": 1}}
    kept = {"policies": {"p": {"dtype": "bfloat16", "lr": 1}}, "tracking": {"runs_dir": "b"}, "resources": {"cpus": 2}}
    assert differences(_computed(ours, {"p": "bfloat16"}), _computed(kept, None)) == []
    assert differences(_computed(ours, {"p": "float32"}), _computed(kept, None)) == [
        "policies.p.dtype: 'float32' here, 'bfloat16' kept"
    ]


@pytest.mark.parametrize(
    "reuse, expected",
    [({"nobody": "."}, "tasks.0.reuse: 'nobody' is not a regime"), ({"single agent": "nowhere"}, "no such folder")],
)
def test_a_reuse_naming_no_regime_or_no_folder_is_a_study_file_error(tmp_path, reuse, expected):
    path = _toy_study(tmp_path, tasks=[{"key": "toy", "stem": "toy", "reuse": reuse}])
    with pytest.raises(StudyFileError) as error:
        load_study(path)
    assert expected in str(error.value)


def test_a_run_stopped_by_a_signal_is_not_kept_as_finished(tmp_path, monkeypatch):
    """A run that a SIGTERM stopped at a step boundary says `stopped` in its summary (and exits 143): the
    study leaves it unfinished (no summary.json, nothing archived), for the next `mas-lab study` to
    continue from its checkpoint, instead of reporting a run without its final evaluation."""
    from mas_lab.study import runner

    fake = tmp_path / "mas-lab"
    fake.write_text('#!/bin/sh\necho \'{"run_dir": "runs/x", "steps": 13, "stopped": true, "eval_after": null}\'\n')
    fake.chmod(0o755)
    monkeypatch.setattr(runner, "MAS_LAB", str(fake))
    family = load_study(_toy_study(tmp_path, seeds=[0]))[0]
    assert runner.run_regime(family, "MAS + AT-GRPO", 0, Path(family.out), []) is None
    assert not list(Path(family.out).glob("*/seed-*/summary.json"))
    assert runner.complete(Path(family.out), family.archive_dir) == []


def test_a_run_killed_by_sigkill_is_named_as_such_and_its_peak_memory_recorded(tmp_path, monkeypatch, capsys):
    """A run the kernel's out-of-memory killer ends exits by SIGKILL: the study says so in words
    (not `exit -9`), keeps nothing, and records the attempt's peak memory for choosing --jobs."""
    from mas_lab.study import runner

    fake = tmp_path / "mas-lab"
    fake.write_text("#!/bin/sh\nkill -9 $$\n")
    fake.chmod(0o755)
    monkeypatch.setattr(runner, "MAS_LAB", str(fake))
    family = load_study(_toy_study(tmp_path, seeds=[0]))[0]
    assert runner.run_regime(family, "MAS + AT-GRPO", 0, Path(family.out), []) is None
    err = capsys.readouterr().err
    assert "killed by SIGKILL" in err and "out-of-memory" in err and "exit -9" not in err
    (segments,) = [json.loads(p.read_text()) for p in Path(family.out).glob("*/seed-0/segments.json")]
    assert segments[-1]["max_rss_mb"] >= 0
    assert not list(Path(family.out).glob("*/seed-*/summary.json"))


@pytest.mark.parametrize(
    "code, words",
    [(1, "exit 1"), (2, "exit 2"), (-signal.SIGTERM, "killed by SIGTERM"), (-signal.SIGKILL, "out-of-memory")],
)
def test_describe_exit_names_the_signal(code, words):
    from mas_lab.study.runner import describe_exit

    assert words in describe_exit(code)


def test_two_studies_on_one_cell_train_it_once(tmp_path, monkeypatch, capsys):
    """Two study files with one `out`, started 0.5 s apart, once trained the same cell at once and
    one attempt vanished from segments.json: a cell is trained under its lock, the second driver
    leaves it to the first."""
    import threading

    from mas_lab.study import runner

    starts = tmp_path / "starts"
    fake = tmp_path / "mas-lab"
    fake.write_text(f'#!/bin/sh\necho started >> {starts}\nsleep 2\necho \'{{"run_dir": "runs/x", "steps": 2}}\'\n')
    fake.chmod(0o755)
    monkeypatch.setattr(runner, "MAS_LAB", str(fake))
    family = load_study(_toy_study(tmp_path, seeds=[0]))[0]
    results = []
    first = threading.Thread(
        target=lambda: results.append(runner.run_regime(family, "MAS + AT-GRPO", 0, Path(family.out), []))
    )
    first.start()
    time.sleep(0.5)
    second = runner.run_regime(family, "MAS + AT-GRPO", 0, Path(family.out), [])
    first.join()
    assert second is None and "another study is training this cell" in capsys.readouterr().err
    assert starts.read_text().count("started") == 1 and results[0] is not None
    (segments,) = [json.loads(p.read_text()) for p in Path(family.out).glob("*/seed-0/segments.json")]
    assert len(segments) == 1


@pytest.mark.parametrize("name", ["summary.json", "segments.json"])
def test_a_damaged_kept_file_is_one_line_in_status_report_and_compare(tmp_path, name):
    """A garbage summary.json or segments.json once ended `study status`, `--report-only` and
    `compare` in a JSONDecodeError traceback or a bare "Aborted."."""
    path = _toy_study(tmp_path, seeds=[0])
    family = load_study(path)[0]
    cell = Path(family.out) / "mas--at-grpo" / "seed-0"
    cell.mkdir(parents=True)
    (cell / name).write_text("{not json")
    runner = CliRunner()
    commands = [["study", "status", str(path)]]
    if name == "summary.json":  # the report reads the summaries (segments only say where a run went)
        commands.append(["study", "run", str(path), "--report-only"])
    for args in commands:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert f"{name}: damaged, not JSON" in result.output and "Traceback" not in result.output


def test_a_cell_that_would_compute_in_another_dtype_than_the_kept_runs_is_refused(tmp_path, toy_run, monkeypatch):
    """One precision a table (mas_lab/study/precision.py): `dtype: auto` resolves by the machine, so
    the next seed of a family kept in float32 would be bf16 where bf16 is native. Refused before
    anything trains, naming the override that keeps the table in one dtype; that override, or a
    machine that resolves as the kept runs did, goes on."""
    from mas_lab.modeling import precision
    from mas_lab.study.families import slug
    from mas_lab.study.precision import MixedPrecision, check
    from mas_lab.study.runner import keep

    path = _toy_study(tmp_path, seeds=[0, 1], set=["train.steps=3", "train.eval_every=2", "policies.shared.dtype=auto"])
    families = load_study(path)
    _, run_dir, summary = toy_run
    kept = {"regime": "MAS + AT-GRPO", "seed": 0, "task": str(ROOT / "tasks" / "toy.yaml"), "overrides": []}
    kept |= {"run_dir": str(run_dir), "wall_s": 7.0, "cpu_s": 9.0, "attempts": 1, "summary": summary}
    keep(kept, families[0].archive_dir)  # the toy run computed in float32 (its task says so)
    assert set(summary["precision"].values()) == {"float32"}
    todo = cells(families, [1], ["MAS + AT-GRPO"])

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    with pytest.raises(MixedPrecision) as refused:
        check(todo, [])
    said = str(refused.value)
    assert "seed 1 would compute in bfloat16" in said and "computed in float32" in said, said
    assert "--set policies.shared.dtype=float32" in said
    check(todo, ["policies.shared.dtype=float32"])  # named: one dtype
    result = CliRunner().invoke(app, ["study", "run", str(path), "--only", "MAS + AT-GRPO", "--seeds", "1"])
    assert result.exit_code == 2 and "would compute in bfloat16" in result.output
    assert not (Path(families[0].out) / slug("MAS + AT-GRPO") / "seed-1").exists()  # nothing trained

    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset({"avx2"}))
    check(todo, [])  # auto resolves to float32 here, as the kept run did
