"""mas_lab/study (make reproduce): the comparison's families, table, swap ablation and resume of an
interrupted run (a real toy `mas-lab run`, SIGKILLed after a checkpoint, then continued)."""

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest


def _reproduce_module():
    from mas_lab.study import reproduce

    return reproduce


def _toy_family(out):
    """The paper study's regimes on the toy task (tasks/toy.yaml, toy_single_agent.yaml), its runs,
    archive and MLflow store under `out`, no Markdown report."""
    import dataclasses

    from mas_lab.study.reproduce import FAMILIES

    return dataclasses.replace(
        FAMILIES["plan_path"], key="toy", stem="toy", out=str(out), archive="", study_out="", results_md="", images=""
    )


PLAN_PATH = "plan_path"


def test_the_reproduction_table_has_a_constant_answer_row():
    reproduce = _reproduce_module()
    runs = [
        {
            "regime": "MAS + AT-GRPO shared",
            "seed": seed,
            "task": "tasks/plan_path_learns.yaml",
            "cpu_s": 60.0,
            "summary": {"eval_before": 0.0, "eval_after": after},
        }
        for seed, after in ((0, 0.5), (1, 0.25))
    ]
    lines, rows = reproduce.table(runs, reproduce.FAMILIES[PLAN_PATH])
    constant = rows["constant answer (no model)"]
    expected = [reproduce.constant_baseline("tasks/plan_path_learns.yaml", seed) for seed in (0, 1)]
    assert constant["n"] == 128 and abs(constant["pooled"] - sum(b.solved for b in expected) / 128) < 1e-12
    assert any(line.startswith("| constant answer (no model) | 0, 1 |") for line in lines)


KEPT = "results/reproduce/plan_path/mas--at-grpo-shared/seed-0"


def _kept_run(folder: str) -> dict:
    from conftest import ROOT

    return {**json.loads((ROOT / folder / "summary.json").read_text()), "store": str(ROOT / folder / "run.db.xz")}


def test_the_table_has_the_reading_rules_rows_and_the_paired_verdicts_against_them():
    """Every baseline without a model has a row on the same held-out problems: on make run's seed 0,
    rows first 55/64, either order 63/64, one move a turn 45/64. The kept run's 44 solved problems
    are a strict subset of rows-first's 55 (the outside recount): paired, it is below that rule
    (0/11 discordant), where the overlapping intervals once said "level with"."""
    reproduce = _reproduce_module()
    run = _kept_run(KEPT)
    lines, rows = reproduce.table([run], reproduce.FAMILIES[PLAN_PATH])
    assert rows["reading rule, rows first (no model)"]["pooled"] == 55 / 64
    assert rows["reading rule, either order (no model)"]["pooled"] == 63 / 64
    assert rows["one move toward the goal a turn (no model)"]["pooled"] == 45 / 64
    assert "1 problems need a detour" in next(line for line in lines if line.startswith("| reading rule, either"))
    found = reproduce.outcomes(rows, run["task"])
    assert sum(found["MAS + AT-GRPO shared"][0].values()) == 44
    said = reproduce.baseline_verdicts(rows, found)["MAS + AT-GRPO shared"]
    assert "below reading rule, rows first (n=64, discordant 0/11, exact McNemar p=0.000977" in said
    assert "not distinguishable from one move toward the goal a turn (n=64, discordant 0/1" in said
    assert "above constant answer (n=64, discordant " in said
    assert "level with" not in said


def test_orderings_follow_the_paired_test_and_a_seed_going_the_other_way_withholds_the_claim():
    """Three seeds of 20 problems each: A beats C on every seed, A beats B pooled but seed 1 goes
    the other way, B and C tie on their discordant problems."""
    reproduce = _reproduce_module()

    def seed_of(solved: list[int]) -> dict[str, bool]:
        return {f"p{i}": i in solved for i in range(20)}

    found = {
        "A": {s: seed_of(list(range(12))) for s in (0, 1, 2)},
        "B": {0: seed_of([0, 1]), 1: seed_of(list(range(14))), 2: seed_of([0])},
        "C": {s: seed_of([0, 1, 15]) for s in (0, 1, 2)},
    }
    claimed, lines = reproduce.orderings(["A", "B", "C"], found)
    assert claimed == ["A above C"]
    row = next(line for line in lines if line.startswith("| A | B |"))
    assert "| 10/0, 0/2, 11/0 |" in row and row.endswith("| not distinguishable |")
    assert next(line for line in lines if line.startswith("| A | C |")).endswith("| A above C |")
    assert next(line for line in lines if line.startswith("| B | C |")).endswith("| not distinguishable |")

    # a regime that ran one seed of three: its claims say on which seed they rest
    found["D"] = {0: seed_of(list(range(20)))}
    claimed, lines = reproduce.orderings(["A", "D"], found)
    assert claimed == ["D above A (on seed 0 only: the seeds both have)"]
    assert next(line for line in lines if line.startswith("| A | D |")).endswith(
        "| D above A (on seed 0 only: the seeds both have) |"
    )


def test_orderings_with_no_pair_on_a_shared_seed_say_so_and_leave_no_empty_table():
    """A study with one kept regime (or two on different seeds) has compared nothing: the report
    says "none yet", not "no pair is distinguishable", and writes no table header."""
    from mas_lab.study.report import orderings, orderings_sentence

    solved = {f"p{i}": i < 5 for i in range(20)}
    for found in ({"A": {0: solved}}, {"A": {0: solved}, "B": {1: solved}}):
        claimed, lines = orderings(sorted(found), found)
        assert (claimed, lines) == ([], [])
        assert orderings_sentence(claimed, lines) == "none yet: no two regimes share a seed"
    claimed, lines = orderings(["A", "B"], {"A": {0: solved}, "B": {0: solved}})
    assert claimed == [] and len(lines) == 3
    assert orderings_sentence(claimed, lines) == "none: no pair of regimes is distinguishable"


def test_every_reproduction_family_has_its_three_task_files_with_one_budget():
    """The regimes of a family differ only in the team and the update: same env, problems, steps,
    K, warm-up and evaluation (the paper's comparison at one budget). K is the largest group a turn
    samples (plan_path_paper's planner has its own K 8: the single agents and trajectory GRPO there
    group 8 trajectories), read with each regime's overrides."""
    from conftest import ROOT

    from mas_lab.config import load_task
    from mas_lab.training.baselines import answer_turns

    reproduce = _reproduce_module()
    assert set(reproduce.FAMILIES) >= {"plan_path", "sokoban"}
    for family in reproduce.FAMILIES.values():
        tasks = [load_task(ROOT / task, overrides) for task, overrides in family.regimes.values()]
        budgets = {
            (
                # the environment but its workflow (the single agent with the tool has one of its own,
                # over twice the turns): the same answer turns
                t.env.model_dump_json(exclude={"max_turns": True, "params": {"workflow"}}),
                answer_turns(t),
                t.train.steps,
                t.train.problems_per_step,
                max(t.k_of(role) for role in t.roles),
                t.train.warmup_steps,
                t.train.eval_problems,
            )
            for t in tasks
        }
        assert len(budgets) == 1, family.key
        assert family.begin != family.end and family.key in family.image


def test_the_swap_ablation_lines_read_the_eval_json():
    reproduce = _reproduce_module()
    runs = [
        {"regime": "MAS + AT-GRPO per-role LoRA", "seed": 0, "summary": {"eval_after": 0.5}},
        {
            "regime": "MAS + AT-GRPO per-role full",
            "seed": 1,
            "summary": {"eval_after": 0.25},
            "swap": {"success_rate": 0.125, "success_ci_low": 0.06, "success_ci_high": 0.23},
        },
    ]
    assert reproduce.swap_lines(runs) == [
        "- MAS + AT-GRPO per-role full, seed 1: trained 0.250 -> swapped 0.125 [0.060, 0.230]"
    ]
    assert reproduce.FAMILIES[PLAN_PATH].swapped == {"MAS + AT-GRPO per-role LoRA", "MAS + AT-GRPO per-role full"}


def test_the_curves_are_averaged_over_the_seeds_that_reached_each_step():
    reproduce = _reproduce_module()
    steps, values = reproduce.mean_curve([[(0, 0.25), (10, 0.5)], [(0, 0.75), (10, 1.0), (20, 0.5)]])
    assert steps == [0, 10, 20] and values == [0.5, 0.75, 0.5]


def _kill_runs_under(folder: Path) -> int:
    """SIGKILL every process whose command line names `folder` (the driver's `mas-lab run`)."""
    killed = 0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(folder) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
        except OSError:
            pass
    return killed


@pytest.mark.integration
def test_an_interrupted_regime_run_resumes_from_its_checkpoint_and_adds_its_times(tmp_path):
    reproduce = _reproduce_module()
    family = _toy_family(tmp_path)
    extra = ["train.steps=6", "train.eval_every=3", "checkpoint.every=1"]
    first: list = []
    driver = threading.Thread(
        target=lambda: first.append(reproduce.run_regime(family, "MAS + AT-GRPO shared", 0, tmp_path, extra))
    )
    driver.start()
    deadline = time.monotonic() + 300
    folder = tmp_path / reproduce.slug("MAS + AT-GRPO shared") / "seed-0"
    while not list(folder.glob("runs/*/checkpoints/step-000002/manifest.json")):
        assert time.monotonic() < deadline and driver.is_alive(), "no checkpoint at step 2"
        time.sleep(0.2)
    assert _kill_runs_under(tmp_path) >= 1
    driver.join(timeout=60)
    assert first == [None]  # the killed attempt wrote no summary
    assert not (folder / "summary.json").exists()
    # continued by a study on two jobs: the run keeps its settings and takes this call's thread count
    result = reproduce.run_regime(family, "MAS + AT-GRPO shared", 0, tmp_path, [*extra, "resources.torch_threads=1"])
    assert result is not None and result["attempts"] == 2
    assert "torch_threads: 1" in (Path(result["run_dir"]) / "task.yaml").read_text()
    segments = json.loads((folder / "segments.json").read_text())
    assert segments[0]["resumed"] is None and segments[1]["resumed"] == result["run_dir"]
    assert all(x["cpu_s"] > 0 and x["wall_s"] > 0 for x in segments)
    assert result["cpu_s"] == pytest.approx(sum(x["cpu_s"] for x in segments), abs=0.2)
    assert result["summary"]["steps"] == 6 and result["summary"]["eval_before"] is not None
    assert result["summary"]["eval_after"] is not None
    assert len(list(folder.glob("runs/*/run.db"))) == 1  # continued, not started again
    assert "resumed from step-" in (folder / "run.log").read_text()


@pytest.mark.integration
def test_two_jobs_run_the_queue_side_by_side_with_one_thread_each(tmp_path, monkeypatch):
    import sys

    reproduce = _reproduce_module()
    from mas_lab.study import driver

    monkeypatch.setattr(reproduce, "FAMILIES", {"toy": _toy_family(tmp_path)})
    reports: list[int] = []
    monkeypatch.setattr(driver, "report", lambda family, results, out: reports.append(len(results)))
    monkeypatch.setattr(driver.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "reproduce.py",
            "--task",
            "toy",
            "--seeds",
            "0",
            "--jobs",
            "2",
            "--only",
            "single agent + GRPO",
            "MAS + AT-GRPO shared",
            "--set",
            "train.steps=2",
        ],
    )
    reproduce.main()
    results = reproduce.complete(tmp_path)
    assert sorted(r["regime"] for r in results) == ["MAS + AT-GRPO shared", "single agent + GRPO"]
    assert all("resources.torch_threads=1" in r["overrides"] for r in results)
    assert all(r["summary"]["steps"] == 2 and r["summary"]["eval_after"] is not None for r in results)
    # each run's own CPU time (one thread each), not the other job's added in
    assert all(0 < r["cpu_s"] <= 1.5 * r["wall_s"] + 1 for r in results), [(r["cpu_s"], r["wall_s"]) for r in results]
    assert sorted(reports)[:2] == [1, 2] and reports[-1] == 2  # after each run, then once at the end
    # the kept runs are all the report needs: the work folders (checkpoints) may go, as they do when a
    # session's machine is replaced, and a second call runs nothing again
    for folder in tmp_path.glob("*/seed-0"):
        if folder.parent.name != "archive":
            shutil.rmtree(folder)
    assert sorted(r["regime"] for r in reproduce.complete(tmp_path)) == sorted(r["regime"] for r in results)
    assert all(reproduce.curves(r)["eval/success_rate"][-1][0] == 2 for r in results)
    kept = tmp_path / "archive" / reproduce.slug("MAS + AT-GRPO shared") / "seed-0"
    assert {p.name for p in kept.iterdir()} == {"summary.json", "task.yaml", reproduce.STORE}
    monkeypatch.setattr(driver, "run_regime", lambda *a: pytest.fail(f"ran a kept run again: {a}"))
    reproduce.main()


def test_a_section_whose_runs_are_not_kept_says_so(tmp_path, monkeypatch):
    reproduce = _reproduce_module()
    import dataclasses

    (tmp_path / "docs").mkdir()
    results_md = tmp_path / "docs" / "results.md"
    family = dataclasses.replace(reproduce.FAMILIES["sokoban"], results_md=str(results_md))
    results_md.write_text(f"# Results\n\nabove\n\n{family.begin}\n| old table | 0.781 |\n{family.end}\n\nbelow\n")
    reproduce.report(family, [], tmp_path)
    text = results_md.read_text()
    assert "0.781" not in text and "No run of this family is kept" in text
    assert text.startswith("# Results\n\nabove\n\n") and text.endswith("\n\nbelow\n")


def test_the_report_says_which_runs_computed_in_which_dtype(tmp_path):
    reproduce = _reproduce_module()
    old = tmp_path / "old"
    old.mkdir()
    (old / "task.yaml").write_text("policies:\n  shared:\n    model: smollm2-135m-instruct\n    dtype: bfloat16\n")
    runs = [
        {"regime": "MAS + AT-GRPO shared", "seed": 0, "store": str(old / reproduce.STORE), "summary": {}},
        {
            "regime": "MAS + trajectory GRPO",
            "seed": 1,
            "store": str(tmp_path / "new" / reproduce.STORE),
            "summary": {"precision": {"rollout full:shared#0": "float32", "learner full:shared": "float32"}},
        },
    ]
    line = reproduce.precision_line(runs)
    assert line.startswith("Precision differs between runs")
    assert "bfloat16: MAS + AT-GRPO shared seed 0" in line and "float32: MAS + trajectory GRPO seed 1" in line
    assert reproduce.precision_line(runs[1:]) == "Every run computed in float32."


def test_the_hard_split_table_puts_the_team_beside_the_rules_on_the_same_problems():
    """On the hard split (problems the either-order rule misses) the reading rules score 0 by
    construction; one move a turn may solve some; the team's pooled success comes from its runs."""
    reproduce = _reproduce_module()
    from mas_lab.study.report import hard_table

    runs = [
        {
            "regime": "MAS + AT-GRPO shared",
            "seed": 0,
            "task": "tasks/plan_path_tool.yaml",
            "summary": {"eval_after": 0.5, "hard_after": {"success": 0.25, "problems": 64, "ci": [0.16, 0.37]}},
        }
    ]
    family = reproduce.FAMILIES["plan_path_tool"]
    lines = hard_table(runs, family)
    assert lines[2].startswith("| MAS + AT-GRPO shared | 0.250 ") and "(n=64)" in lines[2]
    either = next(line for line in lines if line.startswith("| reading rule, either order"))
    assert either.startswith("| reading rule, either order (no model) | 0.000 ")
    assert hard_table([{**runs[0], "summary": {"eval_after": 0.5}}], family) == []
    # a task with no separate hard split: the run's detour problems inside its main set (here 1) get no table
    letters = [{**runs[0], "task": "tasks/plan_path_learns.yaml"}]
    letters[0]["summary"] = {"eval_after": 0.7, "hard_after": {"success": 0.0, "problems": 1, "ci": [0.0, 0.79]}}
    assert hard_table(letters, reproduce.FAMILIES["plan_path"]) == []
    assert reproduce.FAMILIES["plan_path_tool"].stem == "plan_path_tool"


def test_a_task_with_a_tool_helper_has_the_helper_control_rows():
    """The controls that say what the helper alone does (the claims issue): applying solve()'s
    whole output (the BFS optimum, every problem by construction) and its first move each turn,
    shown only where the tool agent may call solve()."""
    reproduce = _reproduce_module()
    with_tool = reproduce.rule_baselines("tasks/plan_path_tool.yaml", [0])
    assert with_tool["apply solve(): the BFS optimum (no model)"]["pooled"] == 1.0
    first = with_tool["the tool's first move a turn (no model)"]["pooled"]
    assert 0 < first <= with_tool["one move toward the goal a turn (no model)"]["pooled"] + 0.2
    without = reproduce.rule_baselines("tasks/plan_path_learns.yaml", [0])
    assert not any("solve()" in row or "tool's first" in row for row in without)


def test_the_study_figure_names_its_real_problem_count_and_shades_the_range_over_seeds(tmp_path, monkeypatch):
    """Its title said "64 problems" whatever the evaluation held, and it drew no spread."""
    import matplotlib.figure

    from mas_lab.study.plots import plot

    runs = [_kept_run(f"results/credit/sokoban/at-grpo-at-grpo/seed-{seed}") for seed in (0, 1, 2)]
    seen = {}
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, path, **kw: seen.setdefault("fig", fig))
    plot(runs, tmp_path / "x.png", None, (), problems=4)
    left = seen["fig"].axes[0]
    assert "4 problems" in left.get_title() and "64" not in left.get_title()
    assert "range over seeds" in left.get_title() and left.collections  # the shaded range


def test_the_hard_split_gets_its_own_paired_verdicts_and_a_pair_of_regimes_is_compared_on_the_main_split():
    """A store's final evaluation holds the main and the hard split; the table's verdicts and the
    regime pairs are on the main problems only, the hard split's on its own (hand-made outcomes:
    A solves m1 and h2, B solves m1, m2 and h1)."""
    from mas_lab.study.report import hard_outcomes, orderings

    ids, rules = {0: {"h1", "h2"}}, {"one move (no model)": {0: {"h1": True, "h2": False}}}
    rows = {"A": {}, "B": {}, "one move (no model)": {}}
    read = {
        "A": {0: {"m1": True, "m2": False, "h1": False, "h2": True}},
        "B": {0: {"m1": True, "m2": True, "h1": True}},
    }
    hard = hard_outcomes(rows, ids, rules, read)
    assert hard == {
        "A": {0: {"h1": False, "h2": True}},
        "B": {0: {"h1": True}},
        "one move (no model)": {0: {"h1": True, "h2": False}},
    }
    _, lines = orderings(["A", "B"], hard)
    assert lines[2].startswith("| A | B | 0/1 |")  # h1 only: the problem both evaluated on the hard split


def test_the_kept_paper_rules_runs_pair_on_each_split_as_sqlite_counts_them():
    """The kept seed-0 team and single agent with the tool on plan_path_paper (counted with sqlite
    over the unpacked stores, eval at step 30, idx < 64 the main split): main 63 vs 59, discordant
    5/1; hard 63 vs 51, 13/1. The report's pairs say so per split, not 18/2 over both at once."""
    reproduce = _reproduce_module()
    from mas_lab.study.report import hard_outcomes, hard_split, orderings, outcomes, run_outcomes

    family = reproduce.FAMILIES["plan_path_paper"]
    runs = [
        _kept_run("results/reproduce/plan_path_paper/mas--at-grpo-shared/seed-0"),
        _kept_run("results/reproduce/plan_path_paper/single-agent--grpo-with-the-tool/seed-0"),
    ]
    _, rows = reproduce.table(runs, family)
    read = run_outcomes(rows)
    main = outcomes(rows, runs[0]["task"], read=read)
    team, single = "MAS + AT-GRPO shared", "single agent + GRPO with the tool"
    assert len(main[team][0]) == 64 and sum(main[team][0].values()) == 63 and sum(main[single][0].values()) == 59
    _, lines = orderings([single, team], main)
    assert lines[2].startswith(f"| {single} | {team} | 1/5 | 0.219 |")
    hard_rows, ids, rules = hard_split(runs, family)
    hard = hard_outcomes(hard_rows, ids, rules, read)
    assert len(hard[team][0]) == 64 and sum(hard[team][0].values()) == 63 and sum(hard[single][0].values()) == 51
    claimed, lines = orderings([single, team], hard)
    assert lines[2].startswith(f"| {single} | {team} | 1/13 | 0.00183 |")
    assert claimed == [f"{team} above {single}"]
    said = reproduce.baseline_verdicts(hard_rows, hard)[team]
    assert "above the tool's first move a turn (n=64, discordant 27/0" in said


def test_the_report_says_how_often_each_arms_clip_bound():
    """The paper-rules team's clip (1.0) bound on every step, its median norm 5.3 cut to 1; the
    matched-update-size AT-GRPO arm (loss / 1024 tokens, clip 20) never bound; a store from before
    the clip was recorded gives no line rather than a wrong 0%."""
    from mas_lab.study.report import update_lines

    team = _kept_run("results/reproduce/plan_path_paper/mas--at-grpo-shared/seed-0")
    matched = _kept_run("results/credit_matched/plan_path/at-grpo-at-grpo/seed-0")
    older = _kept_run("results/credit/plan_path/at-grpo-at-grpo/seed-0")
    assert update_lines([team]) == ["MAS + AT-GRPO shared: seed 0 shared 100% (5.3 -> 1)"]
    assert update_lines([matched, older]) == ["AT-GRPO (at_grpo): seed 0 shared 0% (0.66 -> 0.66)"]
