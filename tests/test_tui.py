"""The dashboard, driven with Textual's Pilot on stores made by real tiny-model runs."""

import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from mas_lab import runs
from mas_lab.records.control import RunControl
from mas_lab.records.store import RunStore
from tui.app import MasLabApp

MAS_LAB = str(Path(sys.executable).parent / "mas-lab")
SIZE = (150, 50)


@pytest.fixture(scope="module")
def finished(toy_run):
    return toy_run[1]


def text(app, selector: str) -> str:
    return str(app.screen.query_one(selector).render())


async def until(pilot, predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        await pilot.pause(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_replay_keys_walk_steps_episodes_turns_and_agents(finished):
    async def go():
        app = MasLabApp(finished, "replay")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert "step 1 (1/3)" in text(app, "#where") and "turn 0   agent first" in text(app, "#where")
            assert "8 candidates" in text(app, "#candidates") and "observation of first at turn 0" in text(
                app, "#observation"
            )
            await pilot.press("right_square_bracket")
            assert "step 2 (2/3)" in text(app, "#where")
            await pilot.press("full_stop")
            assert "episode 1 (2/4" in text(app, "#where")
            await pilot.press("j")
            assert "turn 1   agent first" in text(app, "#where")
            await pilot.press("l")
            assert "turn 1   agent second" in text(app, "#where")
            assert "first@1:" in text(app, "#observation")  # the second agent sees the first's chosen action
            await pilot.press("h")
            assert "turn 1   agent first" in text(app, "#where")
            await pilot.press("k")
            assert "turn 0   agent first" in text(app, "#where")
            await pilot.press("left_square_bracket")
            assert "step 1 (1/3)" in text(app, "#where")
            assert text(app, "#candidates").count("* candidate") == 1  # the chosen one is marked
            assert "state after the chosen action" in text(app, "#state")

    asyncio.run(go())


def test_next_zero_std_group_search_and_compare(finished):
    store = RunStore(finished / "run.db")

    async def go():
        app = MasLabApp(finished, "replay")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            await pilot.press("n")
            shown = app.screen.current
            rewards = {c["reward"] for c in shown["candidates"]}
            assert len(rewards) == 1, "n must land on a group whose rewards are all equal"
            await pilot.press("slash")
            await pilot.pause()
            await pilot.press(*"second: write")
            await pilot.press("enter")
            await pilot.pause()
            assert "agent second" in text(app, "#where") and "second: write" in text(app, "#observation")
            await pilot.press("c")
            await pilot.pause()
            assert type(app.screen).__name__ == "CompareScreen"
            best, worst = str(app.screen.query_one("#best").render()), str(app.screen.query_one("#worst").render())

            def reward(s):
                return float(s.split("reward ")[1].split()[0])

            assert "best: candidate" in best and "worst: candidate" in worst and reward(best) >= reward(worst)
            await pilot.press("escape")
            assert type(app.screen).__name__ == "ReplayScreen"

    asyncio.run(go())
    assert store.rows("SELECT COUNT(*) AS n FROM groups WHERE zero_std = 1")[0]["n"] > 0


def test_groups_screen_filters_sorts_and_opens_candidates(finished):
    store = RunStore(finished / "run.db")

    async def go():
        app = MasLabApp(finished, "groups")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            table = app.screen.query_one("#groups")
            assert table.row_count == len(store.groups(1)) == 16
            await pilot.press("a")
            assert "agent: first" in text(app, "#groups-title")
            assert all(r.role == "first" for r in app.screen.shown) and table.row_count == 8
            await pilot.press("t")
            assert "turn: 0" in text(app, "#groups-title") and table.row_count == 4
            await pilot.press("s")
            assert "sort: reward_mean" in text(app, "#groups-title")
            means = [r.reward_mean for r in app.screen.shown]
            assert means == sorted(means, reverse=True)
            await pilot.press("right_square_bracket")
            assert "groups of step 2" in text(app, "#groups-title")
            assert app.screen.query_one("#aggregate").row_count == 4  # (first, second) x (turn 0, 1)
            await pilot.press("enter")
            await pilot.pause()
            assert type(app.screen).__name__ == "CandidatesScreen"
            assert app.screen.query_one("#candidates").row_count == 8  # K

    asyncio.run(go())


def test_live_screen_of_a_finished_run_shows_charts_and_events(finished):
    async def go():
        app = MasLabApp(finished, "live")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "step 3/3" in text(app, "#run-header"), what="the header")
            assert "FINISHED" in text(app, "#run-header")
            charts = {chart.panel: chart for chart in app.screen.query("Chart")}
            assert {
                "success",
                "reward_per_role",
                "reward_per_agent_turn",
                "team",
                "learner-loss",
                "learner-grad_norm",
                "update-grad_clip_frac",
                "sampling-entropy",
                "sampling-response_len",
                "drift-kl_initial",
                "time-share",
                "time-seconds",
            } <= set(charts)
            # an axis per quantity: no chart holds two quantities of different scales
            for name, chart in charts.items():
                if name not in ("success", "hard", "team", "groups") and not name.startswith("reward"):
                    assert len({key.split("/", 1)[0] for key in chart.keys}) == 1, (name, chart.keys)
            keys = {key for chart in charts.values() for key in chart.keys}
            assert {
                "reward/first",
                "reward/second",
                "eval/success_rate",
                "loss/shared",
                "zero_std_frac",
                "kl_initial/shared",
                "groups_all_fail/first/t0",
                "share/rollout",
                "seconds/step",
            } <= keys
            success = charts["success"].series["eval/success_rate"]
            assert [step for step, _ in success] == [0, 2, 3]  # eval points at their own steps (every 2, and the last)
            legend = str(charts["learner-loss"].query_one(".legend").render())
            assert "loss/shared" in legend and "(min " in legend and "[" not in legend  # a range, not an interval
            log = "\n".join(str(line.text) for line in app.screen.query_one("#events").lines)
            assert "eval" in log and "placement" in log  # checkpoints are the header's, not the log's
            assert "rollout" in text(app, "#split")

    asyncio.run(go())


def _step(app) -> int:
    header = text(app, "#run-header")
    return int(header.split("step ")[1].split("/")[0]) if "step " in header else -1


@pytest.mark.integration
def test_pause_and_resume_from_the_dashboard_of_a_run_in_another_process(tmp_path):
    proc = subprocess.Popen(
        [
            MAS_LAB,
            "run",
            str(ROOT / "tasks" / "toy.yaml"),
            "--no-ray",
            "--set",
            "train.steps=500",
            "--set",
            "checkpoint.every=0",
            "--run-dir",
            "runs/live",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_dir = tmp_path / "runs" / "live"
    try:
        deadline = time.monotonic() + 120
        while (
            not (run_dir / "run.db").is_file()
            or not RunControl(RunStore(run_dir / "run.db", create=False)).status()["running"]
        ):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)

        async def go():
            app = MasLabApp(run_dir, "live")
            async with app.run_test(size=SIZE) as pilot:
                await until(pilot, lambda: _step(app) >= 2, what="step 2")
                await pilot.press("p")
                # the request shows until the run takes it; a toy step can end (and the screen clear
                # it) before the press returns, so the header saying PAUSED answers it as well
                assert "pause requested" in text(app, "#pending") or "PAUSED" in text(app, "#run-header")
                await until(pilot, lambda: "PAUSED" in text(app, "#run-header"), what="paused")
                held = _step(app)
                await pilot.pause(2.0)
                assert _step(app) == held, "the step counter moved while paused"
                assert str(app.screen.query_one("#pause").label) == "Resume"
                await pilot.click("#pause")
                await until(pilot, lambda: _step(app) > held, what="a step after resume")
                assert "RUNNING" in text(app, "#run-header")

        asyncio.run(go())
        RunControl(RunStore(run_dir / "run.db", create=False)).stop()
        assert proc.wait(timeout=120) == 3  # stopped by a stop request: the exit code of a stopped run
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.integration
def test_tui_with_a_task_file_starts_the_run_in_the_background(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "started"
    _, proc = runs.start_in_background(
        ROOT / "tasks" / "toy.yaml", ["train.steps=2", "resources.torch_threads=1"], run_dir
    )
    try:
        assert proc.wait(timeout=300) == 0, (run_dir / "run.log").read_text()[-2000:]
        assert RunStore(run_dir / "run.db").meta()["status"] == "finished"
        assert "summary" in (run_dir / "run.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_replay_text_is_not_all_bold_and_the_help_screen_lists_every_key(finished):
    async def go():
        app = MasLabApp(finished, "replay")
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            observation = app.screen.query_one("#observation").render()
            spans = observation.spans if hasattr(observation, "spans") else []
            heading = len("observation of first at turn 0:\n")
            assert spans and all(span.end <= heading for span in spans), "the heading's style leaked into the body"
            await pilot.press("question_mark")
            await pilot.pause()
            assert type(app.screen).__name__ == "HelpScreen"
            help_text = str(app.screen.query_one("#help").render())
            for key in ("Next zero-std", "Compare", "Search", "Prev step", "Quit", "Keys"):
                assert key in help_text
            await pilot.press("escape")
            assert type(app.screen).__name__ == "ReplayScreen"
            await pilot.press("e")  # the held-out episodes
            assert "eval step 0" in text(app, "#where") and "1 candidate\n" in text(app, "#candidates")
            await pilot.press("e")
            assert text(app, "#where").startswith("step 1")

    asyncio.run(go())


def test_a_finished_run_offers_no_pause_and_a_failed_run_shows_why(finished, tmp_path):
    import shutil
    import sqlite3

    async def commands(app):
        return [c.title for c in app.get_system_commands(app.screen)]

    async def go(run_dir, check):
        app = MasLabApp(run_dir, "live")
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause()
            await check(app, pilot)

    async def finished_check(app, pilot):
        titles = await commands(app)
        assert "Pause run" not in titles and "Resume run" not in titles and "Replay" in titles

    asyncio.run(go(finished, finished_check))
    failed = tmp_path / "failed"
    shutil.copytree(finished, failed)
    with sqlite3.connect(failed / "run.db") as db:
        db.execute("INSERT OR REPLACE INTO meta VALUES ('status', '\"failed\"')")
        db.execute("INSERT OR REPLACE INTO meta VALUES ('error', '\"RunError: the Ray actor Learner died\"')")

    async def failed_check(app, pilot):
        await until(
            pilot,
            lambda: "failed: RunError: the Ray actor Learner died" in text(app, "#run-header"),
            what="the failure reason",
        )

    asyncio.run(go(failed, failed_check))


def test_replay_opens_where_the_command_line_says(finished):
    async def go():
        app = MasLabApp(finished, "replay", {"kind": "train", "step": 2, "episode": 3})
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert "step 2 (2/3)" in text(app, "#where") and "episode 3 (4/4" in text(app, "#where")

    asyncio.run(go())


def test_header_and_footer_fit_a_100_column_terminal(finished):
    from textual.widgets._footer import FooterKey

    async def go():
        app = MasLabApp(finished, "live")
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: "step 3/3" in text(app, "#run-header"), what="the header")
            for mode in ("live", "groups", "replay"):
                app.switch_mode(mode)

                def laid_out():
                    # the footer is composed and laid out a few frames after the switch, in parts (the
                    # screen's grouped keys can be there before the app's): wait for the whole of it.
                    # A key that never fits, or a help/quit key that never shows, keeps this false and
                    # the wait fails
                    keys = list(app.screen.query(FooterKey))
                    shown = " ".join(str(key.render()) for key in keys)
                    fits = bool(keys) and all(0 < key.region.right <= 100 and key.region.width > 0 for key in keys)
                    return fits and "Keys" in shown and "Quit" in shown  # the help key is always in reach

                await until(
                    pilot,
                    laid_out,
                    timeout=20.0,
                    what=f"every footer key of {mode}, Keys and Quit among them, inside 100 columns",
                )
            app.switch_mode("live")
            await pilot.pause(0.3)
            header = text(app, "#run-header")
            assert all(len(line) <= 98 for line in header.splitlines())

    asyncio.run(go())


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "sample_runs").iterdir() if (p / "run.db").is_file()))
def test_every_sample_run_opens_in_replay_from_a_copy(name, tmp_path):
    import shutil

    run_dir = tmp_path / name
    shutil.copytree(ROOT / "sample_runs" / name, run_dir)

    async def go():
        app = MasLabApp(run_dir, "replay")
        async with app.run_test(size=SIZE) as pilot:
            await pilot.pause()
            assert text(app, "#where").startswith("step ") and "candidate" in text(app, "#candidates")

    asyncio.run(go())


def test_the_event_log_fits_100_columns_and_a_finished_run_offers_no_pause(tmp_path):
    """On `make run`'s sample run at 100 columns: every evaluation line is shown whole (wrapped, not
    cut), checkpoint lines and raw JSON do not flood the log, `?` names PageDown, and a finished
    run shows no pause button or key."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(ROOT / "sample_runs" / "plan_path_learns_smollm2", run_dir)

    async def go():
        app = MasLabApp(run_dir, "live")
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: "FINISHED" in text(app, "#run-header"), what="the header")
            log = app.screen.query_one("#events")
            await until(pilot, lambda: len(log.lines) > 0, what="the event log")
            await pilot.pause(0.5)
            shown = "".join(line.text.strip() for line in log.lines)
            assert "bestconstantanswer'Moves:L'0.156" in shown.replace(" ", "")
            assert "checkpoint" not in shown and '{"' not in shown
            assert not app.screen.query_one("#pause").display
            footer = " ".join(str(key.render()) for key in app.screen.query("FooterKey"))
            assert "Pause" not in footer
            await pilot.press("question_mark")
            await pilot.pause()
            assert "pagedown" in text(app, "#help")

    asyncio.run(go())


def test_the_event_log_wraps_at_the_pane_and_never_cuts_a_number():
    """RichLog renders each line at least 78 columns wide by default; the events pane is narrower,
    so "nll/shared 0.466" showed as "nll/shared 0.4". Every stored number must appear whole."""
    from textual.widgets import RichLog

    from mas_lab.records.store import RunStore

    run = ROOT / "sample_runs" / "plan_path_learns_smollm2"

    async def go():
        app = MasLabApp(run, "live")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(1.5)
            log = app.screen.query_one("#events", RichLog)
            assert log.lines and all(strip.cell_length <= log.size.width for strip in log.lines)
            return " ".join(" ".join(strip.text.split()) for strip in log.lines)

    shown = asyncio.run(go())
    for event in RunStore(run / "run.db", create=False).events():
        if event["kind"] == "warmup":
            assert event["message"].split()[-1] in shown  # the nll, e.g. 0.466, whole


def test_the_live_header_eta_counts_the_evaluations_left(finished, tmp_path):
    """The live screen's eta is training/progress.time_left over the run's own step and
    evaluation times (it once multiplied the mean step time by the steps left, leaving out the
    evaluations, each of which can take minutes)."""
    import shutil

    from mas_lab.training.progress import time_left
    from tui.data import live_snapshot

    copy = tmp_path / "run"
    shutil.copytree(finished, copy, ignore=shutil.ignore_patterns("run.lock"))
    store = RunStore(copy / "run.db")  # for writing: the task's steps are changed below
    task = store.meta()["task"]
    assert live_snapshot(copy, 0.0).left_s == 0.0  # finished: nothing left
    store.set_meta(task={**task, "train": {**task["train"], "steps": task["train"]["steps"] + 2}})
    step_times, eval_times = [v for _, v in store.series("time/step")], [v for _, v in store.series("eval/time")]
    store.close()
    left = live_snapshot(copy, 0.0).left_s
    steps, every = task["train"]["steps"], task["train"]["eval_every"]
    assert left == time_left(step_times, eval_times, steps, steps + 2, every) > 2 * min(step_times)
    assert left >= 2 * statistics.median(step_times[-5:]) + eval_times[-1]  # at least the final evaluation
