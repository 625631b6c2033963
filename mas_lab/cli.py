"""The command line (typer): run, eval, tui, replay, pause, resume, stop, status, models.

Printing and argument parsing only: a run's lifecycle lives in mas_lab/runs.py, the dashboard in
tui/ (imported inside the commands that open it, so the core never loads textual)."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import signal
import socket
import sqlite3
import sys
import time
from enum import Enum
from importlib.metadata import version
from pathlib import Path
from typing import List, NoReturn, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from mas_lab import runs
from mas_lab.analysis.compare import compare as write_comparison
from mas_lab.analysis.evidence import run_evidence
from mas_lab.analysis.export import ExportError, export_records
from mas_lab.analysis.export import export_policy as write_policy
from mas_lab.analysis.paired import sentence
from mas_lab.analysis.plots import plot_run
from mas_lab.analysis.reporting import baselines_from_metrics, hard_split_text, update_text, utilisation_text
from mas_lab.config import TaskConfig, Tracking, task_to_yaml
from mas_lab.envs import ENVS
from mas_lab.envs.base import EnvError
from mas_lab.mlflow_ui import serve
from mas_lab.modeling.models import NAMED, cache_dir, check_model_name
from mas_lab.records import checkpoint  # at import: a failed run's line (_again) must not import under a memory limit
from mas_lab.records.control import RunControl
from mas_lab.records.episode_text import format_episode
from mas_lab.records.run_folder import PACKED, NotARunFolder, is_run_folder, run_folder
from mas_lab.records.store import RunStore, StoreError
from mas_lab.records.tracking import rebuild, resolve_uri
from mas_lab.study.driver import STATUS_COLUMNS, run_study, status_cells, status_line, summary_rows
from mas_lab.study.driver import study_status as read_study_status
from mas_lab.study.precision import MixedPrecision
from mas_lab.study.reuse import ReuseError
from mas_lab.study.spec import DamagedStudyFile, StudyFileError, load_study
from mas_lab.training.baselines import RULE_LABELS
from mas_lab.training.metric_names import (
    CONSTANT_CI_HIGH,
    CONSTANT_CI_LOW,
    CONSTANT_SUCCESS,
    DISTINCT_ANSWERS,
    EVAL_CI_HIGH,
    EVAL_CI_LOW,
    EVAL_PREFIX,
    EVAL_SUCCESS,
    EVAL_TEAM_REWARD,
    EVAL_TIME,
    EVAL_TURNS,
    HARD_PROBLEMS,
    STEP_TIME,
    TIME_KEYS,
)
from mas_lab.training.progress import ProgressEvent

app = typer.Typer(no_args_is_help=True, help="Train teams of LLM agents with AT-GRPO.")
# markup off: what the CLI prints is data (paths, patterns, verdicts); styled parts are Text objects
console = Console(stderr=True, markup=False)


class Kind(str, Enum):
    train = "train"
    eval = "eval"


class Mode(str, Enum):
    """Who plays in `eval` (config.EVAL_MODES): the team, or one agent; `mas` is the old name of team."""

    team = "team"
    single_agent = "single_agent"
    mas = "mas"


def _version(value: bool) -> None:
    if value:
        print(f"mas-lab {version('mas-lab')}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Train teams of LLM agents with AT-GRPO."""


def _fail(message: str, code: int = 2) -> NoReturn:
    # the message is text, not markup: a pattern like [a-z0-9] or a path with [bold] in it stays as written
    console.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def run(
    task_file: Optional[Path] = typer.Argument(None, help="task file (tasks/*.yaml); with --resume, optional"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: key.path=value (repeatable)"),
    address: Optional[str] = typer.Option(None, "--address", help="join this Ray cluster instead of starting one"),
    no_ray: bool = typer.Option(False, "--no-ray", help="run the actors in-process (debugging)"),
    resume: Optional[Path] = typer.Option(None, "--resume", help="continue this run folder from its last checkpoint"),
    run_dir_option: Optional[Path] = typer.Option(None, "--run-dir", help="put the new run in this folder"),
) -> None:
    """Train a task headless, with a progress bar and a summary at the end."""
    overrides = list(set_ or [])
    if address:
        overrides.append(f"resources.ray_address={address}")
    try:
        if resume is not None:
            opened = runs.resume(resume, task_file, overrides)
        elif task_file is None:
            raise runs.RunError("give a task file, or --resume RUN_DIR")
        else:
            opened = runs.new_run(runs.load(task_file, overrides), task_file, run_dir_option)
    except runs.RunError as exc:
        _fail(str(exc))
    except MemoryError:  # an address-space or RAM limit before the first step: nothing was kept
        _fail(
            "the run ran out of memory while starting (MemoryError); nothing was kept: start it again with more memory",
            code=1,
        )
    console.print(
        Text.assemble(
            "run ",
            (opened.run_dir.name, "bold"),
            f"  store {opened.run_dir / 'run.db'}  mlflow run {opened.tracker.run_id}",
        ),
        highlight=False,
        soft_wrap=True,
    )
    stopped_by: list[int] = []
    try:
        summary = _train_with_progress(opened, use_ray=not no_ray, stopped_by=stopped_by)
    except (MemoryError, RuntimeError) as exc:  # the progress bar's thread refused before the run began
        if not runs.short_of_memory(exc):
            raise
        runs.record_error(opened, exc)
        opened.store.set_meta(status="failed")
        opened.tracker.finish("FAILED")
        _fail(
            f"the run ran out of memory before its first step ({type(exc).__name__}: {exc}); {_again(opened)}", code=1
        )
    _print_summary(opened, summary)
    if summary.get("stopped"):  # a run that did not finish never exits 0, the code of one that did
        raise typer.Exit(128 + stopped_by[0] if stopped_by else STOPPED_ON_REQUEST)


# exit codes of `run` (docs/cli.md): 0 finished, 1 failed, 2 a wrong task file or argument,
# 128 + N stopped by signal N with a checkpoint (130: Ctrl+C, 143: SIGTERM), 3 stopped by `mas-lab stop`
STOPPED_ON_REQUEST = 3


def _train_with_progress(opened: runs.Run, use_ray: bool, stopped_by: list[int] | None = None) -> dict:
    columns = (
        TextColumn("step"),
        MofNCompleteColumn(),
        BarColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as bar:
        handle = bar.add_task("starting", total=opened.task.train.steps, completed=0)

        held = [False]  # whether the run is paused: the console says when that changes

        def progress(event: ProgressEvent) -> None:
            bar.update(handle, description=event.phase)
            if (event.phase == "paused") != held[0]:
                held[0] = event.phase == "paused"
                said = "paused" if held[0] else "stopped while paused" if event.phase == "stopped" else "resumed"
                bar.console.print(f"{said} after step {event.step}", highlight=False)
            if event.phase.startswith("resumed"):
                bar.update(handle, completed=event.step)
                bar.console.print(f"{event.phase} (step {event.step})", highlight=False)
            if event.phase.startswith("warning: "):
                bar.console.print(Text(event.phase, style="yellow"), highlight=False)
            if event.phase == "done":
                bar.update(handle, completed=event.step)
                m = event.metrics or {}
                bar.console.print(
                    f"step {event.step:>4}  reward {m['reward/mean']:.3f}  team {m['team_reward']:.3f}  "
                    f"zero-std {m['zero_std_frac']:.2f}  step {m['time/step']:.1f}s  {m['tokens_per_s']:.0f} tok/s",
                    highlight=False,
                )

        def on_signal(name: str) -> None:
            if stopped_by is not None and not stopped_by:
                stopped_by.append(int(signal.Signals[name]))
            bar.console.print(
                f"\n{name}: stopping with a checkpoint at the next step boundary (send it again to abort at once)",
                highlight=False,
            )

        try:
            return runs.train(opened, use_ray=use_ray, progress=progress, on_signal=on_signal)
        except (runs.RunError, EnvError, MemoryError, RuntimeError, ImportError, OSError, sqlite3.Error) as exc:
            message = _run_failure(exc, opened)
            if message is None:
                raise
            bar.stop()
            _fail(message, code=1)


def _run_failure(exc: BaseException, opened: runs.Run) -> str | None:
    """The one line a run's failure prints (None: a bug, whose traceback is the report)."""
    if isinstance(exc, runs.RunError):
        return str(exc)
    if isinstance(exc, EnvError):  # a plugin's reward or observation the trainer cannot use
        return f"the run stopped: {exc}; nothing of this step was trained on or stored"
    short_of_memory = runs.short_of_memory(exc)  # an address-space or RAM limit
    if isinstance(exc, (RuntimeError, ImportError)) and not short_of_memory:
        return None
    if short_of_memory:
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        return (
            f"the run ran out of memory ({type(exc).__name__}: {first}); its store and MLflow run are marked "
            f"failed; with more memory (or a smaller micro_batch), {_again(opened)}"
        )
    # a full disk, a lost mount: one line, not a traceback
    return (
        f"the run failed: {type(exc).__name__}: {exc} (is the disk full?); its store and MLflow run are "
        f"marked failed; once fixed, {_again(opened)}"
    )


def _again(opened: runs.Run) -> str:
    """How to go on after a failure: resume from the last checkpoint, or start again where none
    was written (a resume would refuse: no complete checkpoint)."""
    if checkpoint.complete(opened.run_dir):
        return f"continue with: mas-lab run --resume {opened.run_dir}"
    return "start it again (no checkpoint was written)"


def _print_summary(opened: runs.Run, summary: dict) -> None:
    task, run_dir, tracker = opened.task, opened.run_dir, opened.tracker
    metrics = opened.store.metrics()
    train_steps = [m for m in metrics.values() if STEP_TIME in m]

    def mean(key: str) -> float:
        values = [m[key] for m in train_steps if key in m]
        return sum(values) / len(values) if values else math.nan

    console.print(Text("\nsummary", style="bold"), highlight=False)

    def shown(result: dict | None) -> str:
        if result is None:
            return "not evaluated" + (" (stopped before the last step)" if summary.get("stopped") else "")
        low, high = result["ci"]
        return f"{result['success']:.3f}  95% [{low:.3f}, {high:.3f}]  (step {result['step']})"

    def shown_hard(hard: dict) -> str:
        return f"{hard['success']:.3f}  95% [{hard['ci'][0]:.3f}, {hard['ci'][1]:.3f}]  ({hard['problems']} problems)"

    def shown_constant(constant: dict | None) -> str:
        if constant is None:
            return "- (this task has none)"
        low, high = constant["ci"]
        return f"{constant['success']:.3f}  95% [{low:.3f}, {high:.3f}]  ({constant['answer']!r} to every problem)"

    rows = [
        ("stopped early" if summary.get("stopped") else "finished", f"after step {summary.get('steps')}"),
        ("eval success before", shown(summary.get("before"))),
        ("eval success after", shown(summary.get("after"))),
        *([("latest evaluation", shown(summary["latest"]))] if summary.get("latest") else []),
        ("best constant answer (no model)", shown_constant(summary.get("constant"))),
        *[
            (f"{b['label']} (no model)", f"{b['success']:.3f}  95% [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}]")
            for name, b in (summary.get("baselines") or {}).items()
            if name != "constant"
        ],
        *(
            [("hard split after (a detour needed)", shown_hard(summary["hard_after"]))]
            if summary.get("hard_after")
            else []
        ),
        ("so", summary.get("verdict", "")),
        ("what the updates did", update_text(summary.get("update") or {}) or "-"),
        ("steps", str(len(train_steps))),
        ("mean step time (s)", f"{mean('time/step'):.2f}" if train_steps else "-"),
        ("  rollout / reward / learner / sync / other", " / ".join(f"{mean(key):.2f}" for key in TIME_KEYS)),
        ("tokens per second (rollout)", f"{mean('tokens_per_s'):.1f}"),
        ("utilisation (counted FLOPs)", utilisation_text(train_steps) or "-"),
        ("dtype (rollout and learner)", ", ".join(sorted(set(summary.get("precision", {}).values()))) or "-"),
        ("run store", str(run_dir / "run.db")),
        ("mlflow", f"{task.tracking.mlflow_uri}  run {tracker.run_id}"),
    ]
    for name, value in rows:
        console.print(f"  {name:<44} {value}", highlight=False, soft_wrap=True)
    print(json.dumps({"run_dir": str(run_dir), "mlflow_run_id": tracker.run_id, **summary}, allow_nan=False))


@app.command()
def replay(
    run_dir: Path = typer.Argument(..., help="a run folder (runs/<run-id>)"),
    text: bool = typer.Option(False, "--text", help="print the episode as text"),
    step: Optional[int] = typer.Option(None, "--step", help="training step (default: the first)"),
    episode: int = typer.Option(0, "--episode", help="episode index within the step"),
    kind: Kind = typer.Option(Kind.train, "--kind", help="which episodes: training or evaluation"),
) -> None:
    """Print one saved episode turn by turn: every candidate, its reward and advantage, the chosen one."""
    run_dir = _run_folder(run_dir)
    store = _open_store(run_dir)
    if step is None:
        step = store.first_step(kind.value) or 0
    record = store.episode(step, episode, kind.value)
    if record is None:
        _fail(f"{run_dir}: no {kind.value} episode {episode} at step {step}")
    if not text and not _terminal():
        print("not a terminal: printing the episode as text (--text)", file=sys.stderr)
        text = True
    if not text:
        # lazy: textual, only for the dashboard (the core never imports it at module level)
        from tui.app import MasLabApp

        MasLabApp(run_dir, "replay", {"kind": kind.value, "step": step, "episode": episode}).run()
        return
    sys.stdout.write(format_episode(record))


def _terminal() -> bool:
    """Whether the dashboard has a terminal to draw on (it wrote escape codes into pipes and waited
    for keys that never came)."""
    return sys.stdin.isatty() and sys.stdout.isatty()


@app.command("eval")
def evaluate(
    task_file: Path = typer.Argument(..., help="task file (tasks/*.yaml)"),
    checkpoint_dir: Optional[Path] = typer.Option(
        None, "--checkpoint", help="a checkpoint folder (runs/<run>/checkpoints/step-N)"
    ),
    mode: Optional[Mode] = typer.Option(
        None, "--mode", help="team or single_agent (one agent; mas: old name of team); default: the task's own"
    ),
    swap: bool = typer.Option(False, "--swap-policies", help="rotate the role -> policy map (two roles: swap)"),
    problems: Optional[int] = typer.Option(None, "--problems", help="held-out problems (default: train.eval_problems)"),
    samples: int = typer.Option(1, "--samples", min=1, help="1: greedy; S > 1: S sampled trajectories per problem"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: key.path=value (repeatable)"),
    no_ray: bool = typer.Option(False, "--no-ray", help="run the actors in-process"),
) -> None:
    """Evaluate a task's team (or single agent) on fixed held-out problems; print a table."""
    overrides = list(set_ or []) + ([f"train.eval_problems={problems}"] if problems is not None else [])
    try:
        task = runs.eval_task(task_file, overrides, mode.value if mode else None, swap)
        with console.status("starting actors and loading models, then evaluating ..."):
            opened, metrics = runs.evaluate(
                task,
                task_file,
                samples,
                checkpoint_dir,
                {"mode": mode.value if mode else task.algorithm.mode, "swap_policies": str(swap)},
                use_ray=not no_ray,
            )
    except runs.RunError as exc:
        _fail(str(exc))
    _print_eval(task, opened.run_dir, metrics, samples, opened.store)


def _print_eval(task: TaskConfig, run_dir: Path, metrics: dict, samples: int, store) -> None:
    n = len(task.roles)
    table = Table(
        title=f"{task.name}: {task.train.eval_problems} held-out problems x {samples} "
        f"({'greedy' if samples == 1 else 'sampled'}), {n} role{'s' * (n > 1)}"
    )
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("success rate", f"{metrics[EVAL_SUCCESS]:.3f}")
    table.add_row("95% interval", f"[{metrics[EVAL_CI_LOW]:.3f}, {metrics[EVAL_CI_HIGH]:.3f}]")
    if CONSTANT_SUCCESS in metrics:
        table.add_row(
            "best constant answer (no model)",
            f"{metrics[CONSTANT_SUCCESS]:.3f} [{metrics[CONSTANT_CI_LOW]:.3f}, {metrics[CONSTANT_CI_HIGH]:.3f}]",
        )

    baselines = baselines_from_metrics(metrics, RULE_LABELS)
    for name, b in baselines.items():
        if name != "constant":
            table.add_row(f"{b['label']} (no model)", f"{b['success']:.3f} [{b['ci'][0]:.3f}, {b['ci'][1]:.3f}]")
    if HARD_PROBLEMS in metrics:
        table.add_row("hard split (a detour needed)", hard_split_text(metrics))
    evidence = run_evidence(task, store, 0)
    if evidence.get("baselines"):
        first = "" if samples == 1 else ", the first sample of each problem"
        table.add_row(f"so (paired on the same problems{first})", sentence(evidence["baselines"]))
    table.add_row("distinct first answers", f"{metrics.get(DISTINCT_ANSWERS, math.nan):.0f}")
    table.add_row("mean turns", f"{metrics[EVAL_TURNS]:.2f}")
    table.add_row("mean final team reward", f"{metrics[EVAL_TEAM_REWARD]:.3f}")
    for role in task.roles:
        table.add_row(
            f"mean reward: {role.name} ({role.policy})",
            f"{metrics.get(f'{EVAL_PREFIX}reward/{role.name}', math.nan):.3f}",
        )
    table.add_row("seconds", f"{metrics[EVAL_TIME]:.1f}")
    Console(soft_wrap=True).print(table)
    print(
        json.dumps(
            {
                "run_dir": str(run_dir),
                **{k.removeprefix(EVAL_PREFIX): v for k, v in metrics.items() if k.count("/") == 1},
            }
        )
    )


@app.command()
def tui(
    target: Path = typer.Argument(..., help="a task file (starts a run) or a run folder (live or replay)"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a task field: key.path=value"),
) -> None:
    """The dashboard. A task file starts `mas-lab run` in the background and shows it live; a run
    folder (or a kept run, run.db.xz) opens on the live screen: its charts, evaluations and events,
    following the run while it runs; `r` switches to replay (no Ray needed)."""
    # lazy: textual, only for the dashboard (the core never imports it at module level)
    from tui.app import MasLabApp

    if not target.exists():
        _fail(f"{target}: no such task file or run folder")
    if target.is_dir():
        if not is_run_folder(target):
            _fail(f"{target}: a folder, but not a run folder (no run.db, nor run.db.xz); a task file starts a run")
        target = _run_folder(target)
        _open_store(target).close()  # a damaged or foreign store: one line, before anything else
    if not _terminal():
        _fail(
            "the dashboard needs a terminal (stdin and stdout); for text: mas-lab replay RUN_DIR --text, "
            "mas-lab status RUN_DIR, mas-lab plot RUN_DIR"
        )
    if target.is_dir():
        MasLabApp(target, "live").run()  # a finished run too: its charts, evaluations and events
        return
    try:
        run_dir, process = runs.start_in_background(target, list(set_ or []))
    except runs.RunError as exc:
        _fail(str(exc))
    MasLabApp(run_dir, "live").run()
    if process.poll() is None:
        console.print(
            f"the run goes on in the background: mas-lab tui {run_dir}  |  mas-lab stop {run_dir}",
            highlight=False,
            soft_wrap=True,
        )


def _run_folder(path: Path) -> Path:
    """The folder holding the run's run.db: the run folder itself, or a kept run (run.db.xz)
    unpacked into the cache (mas_lab/records/run_folder.py); one clear line otherwise."""
    try:
        return run_folder(path)
    except NotARunFolder as exc:
        _fail(str(exc))


def _open_store(run_dir: Path):
    """A run folder's store, read-only (requests go through a writable connection of their own)."""
    run_dir = _run_folder(run_dir)
    try:
        store = RunStore(run_dir / "run.db", create=False)
    except StoreError as exc:
        _fail(str(exc))
    problem = store.integrity_problem()
    if problem:
        store.close()
        _fail(f"{run_dir / 'run.db'}: damaged ({problem}); nothing was read or changed")
    return store


def _control(run_dir: Path):
    return RunControl(_open_store(run_dir))


def _request(run_dir: Path, command: str, wait: bool) -> None:
    control = _control(run_dir)
    state = control.status()
    if not state["running"]:
        _fail(f"{run_dir}: the run is not running (status: {state['status']}); nothing to {command}")
    if (command == "pause" and state.get("paused")) or (command == "resume" and not state.get("paused")):
        console.print(
            f"the run is already {'paused' if state.get('paused') else 'running'} (step {state.get('step')})",
            highlight=False,
        )
        return
    control.request(command)
    console.print(
        f"{command} requested; it takes effect at the next step boundary (now in step "
        f"{state.get('step')}, phase {state.get('phase')})",
        highlight=False,
        soft_wrap=True,
    )
    target = {
        "pause": lambda s: s.get("paused"),
        "resume": lambda s: not s.get("paused"),
        "stop": lambda s: not s["running"],
    }[command]
    if not wait:
        return
    while not target(now := control.status()):
        if not now["running"] and command != "stop":
            _fail(f"{run_dir}: the run ended before the {command} took effect")
        time.sleep(0.2)
    said = {
        "pause": f"paused after step {now.get('step')} (a checkpoint was written)",
        "resume": f"resumed (step {now.get('step')}, phase {now.get('phase')})",
        "stop": f"stopped after step {now.get('step')} (status {now['status']}, last checkpoint "
        f"{now.get('last_checkpoint')})",
    }[command]
    console.print(said, highlight=False, soft_wrap=True)


@app.command()
def pause(
    run_dir: Path = typer.Argument(..., help="a run folder (runs/<run-id>)"),
    wait: bool = typer.Option(False, "--wait", help="return once the run is paused"),
) -> None:
    """Pause a running run at its next step boundary (checkpointed; the actors stay alive)."""
    _request(run_dir, "pause", wait)


@app.command()
def resume(
    run_dir: Path = typer.Argument(..., help="a run folder (runs/<run-id>)"),
    wait: bool = typer.Option(False, "--wait", help="return once the run is running"),
) -> None:
    """Resume a paused run. (To continue a run that ended or crashed: mas-lab run --resume RUN_DIR.)"""
    _request(run_dir, "resume", wait)


@app.command()
def stop(
    run_dir: Path = typer.Argument(..., help="a run folder (runs/<run-id>)"),
    wait: bool = typer.Option(False, "--wait", help="return once the run has stopped"),
) -> None:
    """Stop a run gracefully at its next step boundary, with a final checkpoint."""
    _request(run_dir, "stop", wait)


@app.command()
def status(run_dir: Path = typer.Argument(..., help="a run folder (runs/<run-id>)")) -> None:
    """Step, phase, paused or not, last checkpoint, and whether the run's process is alive."""
    state = _control(run_dir).status()
    print(
        json.dumps(
            {
                k: state.get(k)
                for k in (
                    "status",
                    "running",
                    "step",
                    "phase",
                    "paused",
                    "last_checkpoint",
                    "actors_alive",
                    "pid",
                    "pending",
                    "error",
                )
            }
        )
    )


@app.command("runs")
def list_runs(
    folder: Path = typer.Argument(Path("runs"), help="a folder of run folders (default: runs)"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per line instead of a table"),
) -> None:
    """The runs in a folder: id, task, kind, status (crashed when its process died), step, eval
    success first and last, when it started, MLflow run id."""
    if not folder.is_dir():
        _fail(f"{folder}: no such folder")
    rows = runs.list_runs(folder)
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table(title=f"{len(rows)} runs in {folder}")
    for name in ("run", "task", "kind", "status", "step", "eval first", "eval last", "started", "mlflow run"):
        table.add_column(name, justify="right" if name in ("step", "eval first", "eval last") else "left")

    def rate(value) -> str:
        return "-" if value is None else f"{value:.3f}"

    for r in rows:
        started = datetime.datetime.fromtimestamp(r["started"]).strftime("%Y-%m-%d %H:%M") if r.get("started") else "-"
        table.add_row(
            r["run"],
            r.get("task") or "-",
            r.get("kind") or "-",
            r["status"],
            f"{r.get('step') or 0}/{r.get('steps') or '?'}",
            rate(r.get("eval_first")),
            rate(r.get("eval_last")),
            started,
            (r.get("mlflow_run_id") or "-")[:12],
        )
    Console(width=None if sys.stdout.isatty() else 160).print(table)


@app.command()
def ui(
    target: Path = typer.Argument(
        Path("runs"), help="a run folder (its tracking store) or any folder (the default store)"
    ),
    port: int = typer.Option(5000, "--port", min=1, max=65535, help="port on 127.0.0.1"),
) -> None:
    """Start the MLflow UI on a run's tracking store and print its address (Ctrl+C stops it, with
    every process it started). A run whose tracking store is not here (copied from another machine
    or folder, a sample run) gets one rebuilt from its run store: params, metrics, the completions
    tables and the charts. Exits 2 without starting anything when the port is taken."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            _fail(f"--port {port}: cannot listen there ({exc.strerror or exc}); choose another port")
    uri = resolve_uri(Tracking().mlflow_uri)
    if (target / "run.db").is_file():
        uri = _open_store(target).meta().get("mlflow_uri") or uri
        if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
            # a copied, shipped or downloaded run: its tracking store stayed where it was made

            key = hashlib.sha256(str(target.resolve()).encode()).hexdigest()[:12]
            console.print(
                f"{target}: its tracking store {uri.removeprefix('sqlite:///')} is not here; rebuilding "
                "one from the run store",
                highlight=False,
                soft_wrap=True,
            )
            uri = rebuild(target, cache_dir() / "tracking" / f"{target.name}-{key}")

    console.print(f"starting the MLflow UI on {uri} ...", highlight=False, soft_wrap=True)
    code = serve(
        uri, port, lambda url: console.print(f"MLflow UI: {url}  (Ctrl+C stops it)", highlight=False, soft_wrap=True)
    )
    if code:
        _fail(f"the MLflow UI ended with exit code {code}", code=1)


class Format(str, Enum):
    jsonl = "jsonl"
    parquet = "parquet"


@app.command()
def export(
    run_dir: Path = typer.Argument(..., help="a run folder (runs/<run-id>)"),
    output: Path = typer.Option(..., "--output", "-o", help="the file to write (.jsonl or .parquet)"),
    fmt: Optional[Format] = typer.Option(None, "--format", help="JSON lines or Parquet (default: from the suffix)"),
    kind: Kind = typer.Option(Kind.train, "--kind", help="training or evaluation episodes"),
    steps: Optional[str] = typer.Option(None, "--steps", help="A:B, the steps from A to B (either may be left out)"),
    chosen_only: bool = typer.Option(False, "--chosen-only", help="only the chosen candidate of each (turn, agent)"),
    force: bool = typer.Option(False, "--force", help="replace the output file if it exists"),
) -> None:
    """One record per candidate: problem, role, turn, messages (system, user, assistant), response,
    reward and components, advantage, chosen, group kept, sampler log-probs, step, policy."""
    given, run_dir = run_dir, _run_folder(run_dir)
    _open_store(run_dir).close()
    first = last = None
    if steps:
        try:
            a, b = steps.split(":")
            first, last = (int(a) if a else None), (int(b) if b else None)
        except ValueError:
            _fail(f"--steps '{steps}': expected A:B, e.g. 1:10, 5: or :3")
    suffixes = {".jsonl": Format.jsonl, ".ndjson": Format.jsonl, ".json": Format.jsonl, ".parquet": Format.parquet}
    chosen = fmt or suffixes.get(output.suffix.lower())
    if chosen is None:
        _fail(f"{output}: cannot tell the format from the suffix '{output.suffix}'; give --format jsonl|parquet")
    if fmt is not None and output.suffix.lower() in suffixes and suffixes[output.suffix.lower()] != fmt:
        _fail(f"{output}: the suffix says {suffixes[output.suffix.lower()].value}, --format says {fmt.value}")
    _check_output_file(output, force)
    if output.resolve().parent in (run_dir.resolve(), given.resolve()) and output.name.startswith("run.db"):
        _fail(f"{output}: the run's own store; give another file")
    try:
        count = export_records(run_dir, output, chosen.value, kind.value, (first, last), chosen_only)
    except OSError as exc:
        _fail(f"{output}: cannot write it ({exc.strerror or exc})")
    if count == 0:
        _fail(f"no {kind.value} records in {run_dir}" + (f" for steps {steps}" if steps else "") + "; nothing written")
    console.print(f"{count} records written to {output}", highlight=False)


def _check_output_file(output: Path, force: bool) -> None:
    """An output file may be replaced only with --force, and its folder must be one we can write."""
    if output.is_dir():
        _fail(f"{output}: is a folder; give a file name")
    if output.exists() and not force:
        _fail(f"{output}: exists; add --force to replace it")
    folder = output.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        _fail(f"{output}: cannot write there ({folder} is not a writable folder)")


@app.command("export-policy")
def export_policy(
    checkpoint_dir: Path = typer.Argument(..., help="a checkpoint folder (runs/<run>/checkpoints/step-N)"),
    policy: str = typer.Argument(..., help="the policy's name in the task file"),
    output: Path = typer.Argument(..., help="the Hugging Face model folder to write"),
    adapter: bool = typer.Option(False, "--adapter", help="LoRA: keep a peft adapter folder instead of merging"),
) -> None:
    """A policy as a Hugging Face folder (config, tokenizer, safetensors) that from_pretrained and
    vLLM load; a LoRA policy is merged into its base unless --adapter."""
    try:
        folder = write_policy(checkpoint_dir, policy, output, merge=not adapter)
    except ExportError as exc:
        _fail(str(exc))
    console.print(f"policy '{policy}' written to {folder}", highlight=False)


@app.command()
def plot(
    run_dir: Path = typer.Argument(..., help="a run folder (runs/<run-id>)"),
    output: Optional[Path] = typer.Option(
        None, "--output", "-o", help="folder for the PNG files (default: RUN_DIR/plots)"
    ),
) -> None:
    """Write the run's charts as PNG files: held-out success with intervals, reward per role and
    per (agent, turn), team reward, zero-std share, learner and sampling diagnostics, time split."""
    kept = (run_dir / PACKED).is_file() and not (run_dir / "run.db").is_file()
    if kept and output is None:
        output = run_dir / "plots"  # beside the kept run, not in the cache it is read from
    run_dir = _run_folder(run_dir)
    _open_store(run_dir).close()
    try:
        written = plot_run(run_dir, output or run_dir / "plots")
    except OSError as exc:
        _fail(f"{output or run_dir / 'plots'}: cannot write the charts there ({exc.strerror or exc})")
    for path in written:
        print(path)


@app.command()
def compare(
    targets: List[Path] = typer.Argument(..., help="run folders, or folders of runs (a study, results/reproduce/X)"),
    output: Path = typer.Option(Path("compare"), "--output", "-o", help="folder for compare.md and the PNG files"),
    group_by: str = typer.Option(
        "regime",
        "--group-by",
        help="label runs by: regime (a study run's; else each run its own), run, task, or a task key (algorithm.mode)",
    ),
    label: Optional[List[str]] = typer.Option(
        None, "--label", help="a label per target, in order (repeat once per target)"
    ),
) -> None:
    """Runs side by side: curves overlaid (each run faint, each label's mean bold), the settings
    that differ, the final held-out success per label, and every pair of labels paired on the same
    held-out problems (discordant counts, exact test, difference)."""
    for target in targets:
        if not target.is_dir():
            _fail(f"{target}: not a folder")
    if label and len(label) != len(targets):
        _fail(f"--label: {len(label)} labels for {len(targets)} targets (give one per target)")
    try:
        path = write_comparison(targets, output, dict(zip(targets, label)) if label else None, group_by)
    except (OSError, ValueError, StoreError, sqlite3.DatabaseError) as exc:  # missing, damaged, foreign stores
        _fail(str(exc))
    print(path)


class _StudyGroup(TyperGroup):
    """`mas-lab study FILE ...` is `mas-lab study run FILE ...`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


study_app = typer.Typer(
    cls=_StudyGroup,
    no_args_is_help=True,
    help="Studies: tasks x regimes x seeds from a study file (studies/*.yaml), run resumably, reported.",
)
app.add_typer(study_app, name="study")


def _load_study(study_file: Path, tasks: Optional[List[str]]) -> list:
    try:
        families = load_study(study_file)
    except StudyFileError as exc:
        _fail(str(exc))
    keys = [f.key for f in families]
    chosen = [k for item in tasks or [] for k in item.split(",") if k]
    unknown = [k for k in chosen if k not in keys]
    if unknown:
        _fail(f"--task {unknown[0]}: not a task of {study_file}; allowed: {keys}")
    return [f for f in families if not chosen or f.key in chosen]


def _seed_list(seeds: Optional[List[str]]) -> Optional[List[int]]:
    if not seeds:
        return None
    try:
        return [int(s) for item in seeds for s in item.split(",") if s]
    except ValueError:
        _fail(f"--seeds {' '.join(seeds)}: expected integers (--seeds 0,1,2 or --seeds 0 --seeds 1)")


@study_app.command("run")
def study_run(
    study_file: Path = typer.Argument(..., help="a study file (studies/paper.yaml)"),
    task: Optional[List[str]] = typer.Option(None, "--task", help="only these tasks of the study (repeatable, or a,b)"),
    seeds: Optional[List[str]] = typer.Option(None, "--seeds", help="only these seeds (0,1,2 or repeated)"),
    only: Optional[List[str]] = typer.Option(None, "--only", help="only this regime (repeatable)"),
    jobs: int = typer.Option(1, "--jobs", min=1, help="runs at once on this machine (each cores/jobs torch threads)"),
    address: Optional[str] = typer.Option(
        None, "--address", help="a Ray cluster (host:port): each run a Ray task on a node with free CPUs"
    ),
    cpus_per_run: float = typer.Option(1.0, "--cpus-per-run", min=0.1, help="CPUs a run asks of the cluster"),
    report_only: bool = typer.Option(False, "--report-only", help="run nothing: rewrite the report from kept runs"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="an override of every run: key.path=value"),
    drop_checkpoints: bool = typer.Option(
        False,
        "--drop-checkpoints",
        help="remove a run's checkpoints once it is kept (~1.6 GB each for the 135M model in float32); its store, "
        "summary and task stay, but `eval --checkpoint` and `export` cannot use it",
    ),
) -> None:
    """Run a study: every task x regime x seed not kept yet (an interrupted run continues from its
    checkpoint), then its report; prints, as its last line, one JSON list with a row per complete run."""
    families = _load_study(study_file, task)
    names = {n for f in families for n in f.names}
    for name in only or []:
        if name not in names:
            _fail(f"--only '{name}': not a regime of {study_file}; allowed: {sorted(names)}")
    if address:
        # lazy: torch, only where a run trains or evaluates
        from mas_lab.actors.backend import check_cluster

        problem = check_cluster(address, 10.0)
        if problem:
            _fail(f"--address: {problem}")

    try:
        results = run_study(
            families,
            seeds=_seed_list(seeds),
            only=list(only) if only else None,
            jobs=jobs,
            address=address,
            cpus_per_run=cpus_per_run,
            extra=list(set_ or []),
            report_only=report_only,
            prune=drop_checkpoints,
        )
    except (ReuseError, MixedPrecision) as exc:
        _fail(f"{study_file}: {exc}")
    except DamagedStudyFile as exc:
        _fail(str(exc))
    print(json.dumps(summary_rows(results)))


@study_app.command("status")
def study_status(
    study_file: Path = typer.Argument(..., help="a study file"),
    task: Optional[List[str]] = typer.Option(None, "--task", help="only these tasks"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per cell"),
) -> None:
    """Every cell of a study: status (kept, finished, running, interrupted, started, pending), step,
    last held-out success, the node of its last attempt."""
    try:
        rows = read_study_status(_load_study(study_file, task))
    except DamagedStudyFile as exc:
        _fail(str(exc))
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    table = Table(*STATUS_COLUMNS)
    for row in rows:
        table.add_row(*status_cells(row))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    print(status_line(rows))


@study_app.command("tui")
def study_tui(
    study_file: Path = typer.Argument(..., help="a study file"),
    task: Optional[List[str]] = typer.Option(None, "--task", help="only these tasks"),
) -> None:
    """The study screen: every cell with its status, refreshed live; enter opens a cell's run in
    the dashboard (q there comes back), c compares the selected task's runs."""
    families = _load_study(study_file, task)
    if not _terminal():
        _fail("the study screen needs a terminal; for text: mas-lab study status STUDY.yaml")
    # lazy: textual, only for the dashboard (the core never imports it at module level)
    from tui.app import MasLabApp
    from tui.study import StudyApp

    while True:
        folder = StudyApp(families).run()
        if folder is None:
            return
        MasLabApp(Path(folder), "live").run()


@app.command()
def config(
    task_file: Optional[Path] = typer.Argument(None, help="task file (tasks/*.yaml)"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: key.path=value (repeatable)"),
    schema: bool = typer.Option(False, "--schema", help="print the task files' JSON Schema (for editor completion)"),
) -> None:
    """Print a task as resolved (defaults filled in, overrides applied, checked), or the schema."""
    if schema:
        print(json.dumps(TaskConfig.model_json_schema(), indent=1))
        return
    if task_file is None:
        _fail("give a task file, or --schema")
    try:
        task = runs.load(task_file, list(set_ or []))
        runs.check_runs_dir(task)  # what `run` would refuse, `config` refuses too
        runs.check_problems(task)
    except runs.RunError as exc:
        _fail(str(exc))
    sys.stdout.write(task_to_yaml(task))


@app.command()
def envs(as_json: bool = typer.Option(False, "--json", help="one JSON object per environment")) -> None:
    """The environments a task file may name: built-in and installed plugins (entry-point group
    mas_lab.envs), each with its roles and parameters; plugins that did not load, with why."""
    for name in sorted(ENVS):
        env = ENVS[name]
        params = {key: (field.description or "") for key, field in env.Params.model_fields.items()}
        origin = ENVS.plugins.get(name, "built-in")
        if as_json:
            print(
                json.dumps(
                    {
                        "name": name,
                        "roles": list(env.roles),
                        "single_role": env.single_role,
                        "parallel": env.parallel,
                        "params": params,
                        "from": origin,
                    }
                )
            )
            continue
        workflow = "parallel" if env.parallel else "sequential"
        console.print(
            Text.assemble(
                (name, "bold"),
                f"  roles {', '.join(env.roles)} ({workflow}); one agent: {env.single_role}  ",
                (origin, "dim"),
            ),
            highlight=False,
            soft_wrap=True,
        )
        for key, description in params.items():
            console.print(f"    {key}: {description}", highlight=False, soft_wrap=True)
    for name, why in sorted(ENVS.failed.items()):
        console.print(Text.assemble((name, "red"), f": did not load: {why}"), highlight=False, soft_wrap=True)


@app.command()
def models() -> None:
    """List the named models and whether they are available here."""
    for name in NAMED:
        problem = check_model_name(name)
        print(f"{name:<24} {'ok' if problem is None else problem}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
