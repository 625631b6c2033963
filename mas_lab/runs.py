"""A run's lifecycle: a new run folder, the rules of a resume, evaluation runs, a run started in
the background. The CLI and the dashboard both call this module; neither spells out the other's
commands. Every check happens before anything is created or changed, and every refusal is a
`RunError` whose message is one sentence a user can act on.
"""
from __future__ import annotations

import datetime
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mas_lab.config import TaskConfig, TaskFileError, as_mode, flat_params, load_task, swap_policies, task_to_yaml
from mas_lab.progress import Progress, ProgressEvent
from mas_lab.store import RunStore
from mas_lab.tracking import Tracker


class RunError(Exception):
    """A run that cannot be started, resumed or evaluated; the message says why and what to do."""


@dataclass
class Run:
    """An open run: its resolved task, folder, store and MLflow run, and for a resume the
    checkpoint it continues from."""

    task: TaskConfig
    run_dir: Path
    store: RunStore
    tracker: Tracker
    resume_from: Path | None = None
    summary: dict = field(default_factory=dict)


def load(task_file: Path, overrides: list[str]) -> TaskConfig:
    try:
        return load_task(task_file, overrides)
    except TaskFileError as exc:
        raise RunError(str(exc)) from None


def new_run_dir(task: TaskConfig, explicit: Path | None = None) -> Path:
    """runs_dir/<name>-<time>-<random>, or `explicit` when it does not already hold a run."""
    if explicit is not None:
        if (explicit / "run.db").exists():
            raise RunError(f"{explicit}: already holds a run; continue it with --resume {explicit}")
        explicit.mkdir(parents=True, exist_ok=True)
        return explicit
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(task.tracking.runs_dir) / f"{task.name}-{stamp}-{secrets.token_hex(2)}"
    run_dir.mkdir(parents=True)
    return run_dir


def new_run(task: TaskConfig, task_file: Path, run_dir: Path | None = None) -> Run:
    """A run folder with the resolved task.yaml, a fresh store and a new MLflow run."""
    run_dir = new_run_dir(task, run_dir)
    (run_dir / "task.yaml").write_text(task_to_yaml(task))
    store = RunStore(run_dir / "run.db")
    tracker = Tracker(task.tracking.mlflow_uri, task.tracking.experiment, run_dir.name)
    tracker.log_params(flat_params(task))
    tracker.log_artifact(run_dir / "task.yaml")
    store.set_meta(run_id=run_dir.name, task=task.model_dump(mode="json"), task_file=str(task_file),
                   mlflow_uri=task.tracking.mlflow_uri, mlflow_run_id=tracker.run_id, status="starting")
    return Run(task, run_dir, store, tracker)


# What a resumed task may not change: the checkpoint's weights and groups depend on these.
FIXED_ON_RESUME = ("env.name", "roles", "policies")


def resume(run_dir: Path, task_file: Path | None, overrides: list[str]) -> Run:
    """Check everything before touching anything: a run folder, not running, a sound checkpoint,
    a task that matches it. Then roll the store back to the checkpoint and re-attach MLflow."""
    from mas_lab import checkpoint
    from mas_lab.control import RunControl

    if not (run_dir / "run.db").is_file() or not (run_dir / "task.yaml").is_file():
        raise RunError(f"{run_dir}: not a run folder (needs run.db and task.yaml)")
    store = RunStore(run_dir / "run.db")
    state = RunControl(store).status()
    if state["running"]:
        raise RunError(f"{run_dir}: the run is still running (pid {state.get('pid')}); stop it first: mas-lab stop {run_dir}")
    found = checkpoint.complete(run_dir)
    if not found:
        raise RunError(f"{run_dir}: no complete checkpoint to resume from")
    last = found[-1]
    try:
        saved = checkpoint.verify(last)
    except checkpoint.CheckpointError as exc:
        raise RunError(f"{exc}; remove that folder to resume from an earlier checkpoint") from None
    source = task_file or run_dir / "task.yaml"
    task = load(source, overrides)
    before = TaskConfig.model_validate(saved["task"]).model_dump(mode="json")
    now = task.model_dump(mode="json")
    for key in FIXED_ON_RESUME:
        a, b = _get(before, key), _get(now, key)
        if a != b:
            raise RunError(f"{source}: does not match the checkpoint {last}: field '{key}' was {json.dumps(a)}, "
                           f"now {json.dumps(b)}")
    store.rollback(saved["step"])
    (run_dir / "task.yaml").write_text(task_to_yaml(task))
    tracker = Tracker(task.tracking.mlflow_uri, task.tracking.experiment, run_dir.name, run_id=saved["mlflow_run_id"])
    return Run(task, run_dir, store, tracker, resume_from=last)


def _get(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data[part]
    return data


def train(run: Run, use_ray: bool = True, progress: Progress | None = None,
          on_signal: Callable[[str], None] | None = None) -> dict:
    """Start the actors, restore the checkpoint of a resume, train, and record how the run ended
    (store status and MLflow status) whatever happens. SIGINT / SIGTERM stop at the next step
    boundary with a checkpoint (`on_signal` is told); a second one aborts at once."""
    from mas_lab.backend import Backend
    from mas_lab.controller import Controller

    tell = progress or (lambda event: None)
    status, backend, summary = "FAILED", None, {}
    run.store.set_meta(status="running")
    try:
        tell(ProgressEvent("starting actors and loading models", 0))
        backend = Backend(run.task, use_ray=use_ray)
        controller = Controller(run.task, backend, run.store, run.tracker, run.run_dir)
        if run.resume_from is not None:
            state = controller.restore(run.resume_from)
            run.store.event(state["step"], "resume", f"resumed from {run.resume_from.name}")
            tell(ProgressEvent(f"resumed from {run.resume_from.name}", state["step"]))
        _stop_on_signals(controller, on_signal)
        summary = controller.run(progress)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        ended = "stopped" if summary.get("stopped") else "finished"
        run.store.set_meta(status=ended if status == "FINISHED" else status.lower())
        run.tracker.finish(status)
        if backend is not None:
            backend.shutdown()
    run.summary = summary
    return summary


def _stop_on_signals(controller, on_signal: Callable[[str], None] | None) -> None:
    def handler(signum, frame):
        if controller.stop_requested:
            raise KeyboardInterrupt
        controller.request_stop()
        if on_signal:
            on_signal(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


# --- evaluation runs ---------------------------------------------------------------------------
def eval_task(task_file: Path, overrides: list[str], mode: str | None = None, swap: bool = False) -> TaskConfig:
    """The task as evaluated: another mode (team or single agent) or the role -> policy map rotated."""
    task = load(task_file, overrides)
    try:
        if mode is not None:
            task = as_mode(task, mode)
        if swap:
            if len({r.policy for r in task.roles}) < 2:
                raise RunError(f"{task_file}: --swap-policies needs roles with different policies")
            task = swap_policies(task)
    except TaskFileError as exc:
        raise RunError(str(exc)) from None
    return task.model_copy(update={"name": f"eval-{task.name}"})


def policy_folder(checkpoint_dir: Path, task: TaskConfig) -> Path:
    """The folder holding every policy of `task` in a checkpoint (or a folder of saved policies)."""
    from mas_lab import checkpoint

    if not checkpoint_dir.is_dir():
        raise RunError(f"{checkpoint_dir}: no such checkpoint folder")
    try:
        if (checkpoint_dir / "manifest.json").is_file():
            checkpoint.verify(checkpoint_dir)
    except checkpoint.CheckpointError as exc:
        raise RunError(str(exc)) from None
    folder = checkpoint_dir / "policies" if (checkpoint_dir / "policies").is_dir() else checkpoint_dir
    missing = [p for p in task.policies if not (folder / p).is_dir()]
    if missing:
        found = sorted(p.name for p in folder.iterdir() if p.is_dir())
        raise RunError(f"{checkpoint_dir}: no saved policy {missing}; it has {found}")
    return folder


def evaluate(task: TaskConfig, task_file: Path, samples: int = 1, checkpoint_dir: Path | None = None,
             settings: dict[str, str] | None = None, use_ray: bool = True) -> tuple[Run, dict[str, float]]:
    """An evaluation run: its own run folder and MLflow run (tag mas_lab.kind=eval)."""
    from mas_lab.backend import Backend
    from mas_lab.controller import Controller

    folder = policy_folder(checkpoint_dir, task) if checkpoint_dir is not None else None
    run = new_run(task, task_file)
    settings = dict(settings or {}, checkpoint=str(checkpoint_dir or ""), samples=str(samples))
    run.tracker.log_params({f"eval.{k}": v for k, v in settings.items()})
    run.tracker.set_tag("mas_lab.kind", "eval")
    run.store.set_meta(kind="eval", status="running", **settings)
    backend = None
    try:
        backend = Backend(task, use_ray=use_ray)
        if folder is not None:
            backend.load_policies(folder, 0, optimizer=False)
        metrics = Controller(task, backend, run.store, run.tracker).evaluate(0, samples)
        run.tracker.log_metrics(0, metrics)
        run.store.set_meta(status="finished")
        run.tracker.finish("FINISHED")
    except BaseException:
        run.store.set_meta(status="failed")
        run.tracker.finish("FAILED")
        raise
    finally:
        if backend is not None:
            backend.shutdown()
    return run, metrics


# --- a run in the background (the dashboard) ---------------------------------------------------
def start_in_background(task_file: Path, overrides: list[str], run_dir: Path | None = None,
                        poll_s: float = 0.2) -> tuple[Path, subprocess.Popen]:
    """Validate the task, then start `mas-lab run` as its own process (it goes on if the caller
    exits; stop it with `mas-lab stop RUN_DIR`), logging to RUN_DIR/run.log. Returns once the
    run's store exists, or raises RunError when the process ended first."""
    task = load(task_file, overrides)
    run_dir = new_run_dir(task, run_dir)
    command = [sys.executable, "-m", "mas_lab.cli", "run", str(task_file), "--run-dir", str(run_dir)]
    for item in overrides:
        command += ["--set", item]
    with open(run_dir / "run.log", "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, env={**os.environ, "COLUMNS": "120"})
    while not (run_dir / "run.db").is_file():
        if process.poll() is not None:
            raise RunError(f"the run ended at start; see {run_dir / 'run.log'}")
        time.sleep(poll_s)
    return run_dir, process
