"""The command line: `mas-lab run`, `mas-lab replay`, `mas-lab models`."""
from __future__ import annotations

import datetime
import json
import math
import secrets
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from mas_lab.config import TaskFileError, TaskConfig, flat_params, load_task, task_to_yaml

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Train teams of LLM agents with AT-GRPO.")
console = Console(stderr=True)


def _fail(message: str, code: int = 2) -> None:
    console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _new_run_dir(task: TaskConfig, explicit: Path | None = None) -> Path:
    if explicit is not None:
        if (explicit / "run.db").exists():
            _fail(f"{explicit}: already holds a run; continue it with --resume {explicit}")
        explicit.mkdir(parents=True, exist_ok=True)
        return explicit
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(task.tracking.runs_dir) / f"{task.name}-{stamp}-{secrets.token_hex(2)}"
    run_dir.mkdir(parents=True)
    return run_dir


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
    if resume is not None:
        task, run_dir, store, tracker, last = _prepare_resume(resume, task_file, overrides)
    else:
        if task_file is None:
            _fail("give a task file, or --resume RUN_DIR")
        try:
            task = load_task(task_file, overrides)
        except TaskFileError as exc:
            _fail(str(exc))
        run_dir, store, tracker = _new_run(task, task_file, run_dir_option)
        last = None
    from mas_lab.backend import Backend
    from mas_lab.controller import Controller

    console.print(f"run [bold]{run_dir.name}[/]  store {run_dir / 'run.db'}  mlflow run {tracker.run_id}",
                  highlight=False, soft_wrap=True)
    status, backend, summary = "FAILED", None, {}
    store.set_meta(status="running")
    try:
        with console.status("starting actors and loading models ..."):
            backend = Backend(task, use_ray=not no_ray)
            controller = Controller(task, backend, store, tracker, run_dir)
            if last is not None:
                state = controller.restore(last)
                store.event(state["step"], "resume", f"resumed from {last.name}")
                console.print(f"resumed from {last.name} (step {state['step']})", highlight=False)
        _install_signal_handlers(controller)
        summary = _train_with_progress(task, controller)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        store.set_meta(status={"FINISHED": "stopped" if summary.get("stopped") else "finished"}.get(status, status.lower()))
        tracker.finish(status)
        if backend is not None:
            backend.shutdown()
    _print_summary(task, run_dir, store, tracker, summary)


def _new_run(task: TaskConfig, task_file: Path, explicit: Path | None = None):
    from mas_lab.store import RunStore
    from mas_lab.tracking import Tracker

    run_dir = _new_run_dir(task, explicit)
    (run_dir / "task.yaml").write_text(task_to_yaml(task))
    store = RunStore(run_dir / "run.db")
    tracker = Tracker(task.tracking.mlflow_uri, task.tracking.experiment, run_dir.name)
    tracker.log_params(flat_params(task))
    tracker.log_artifact(run_dir / "task.yaml")
    store.set_meta(run_id=run_dir.name, task=task.model_dump(mode="json"), task_file=str(task_file),
                   mlflow_uri=task.tracking.mlflow_uri, mlflow_run_id=tracker.run_id, status="starting")
    return run_dir, store, tracker


# What a resumed task may not change: the checkpoint's weights and groups depend on these.
_FIXED = ("env.name", "roles", "policies")


def _prepare_resume(run_dir: Path, task_file: Optional[Path], overrides: list[str]):
    """Check everything before touching anything: a run folder, not running, a sound checkpoint,
    a task that matches it. Then roll the store back to the checkpoint."""
    from mas_lab import checkpoint
    from mas_lab.control import RunControl
    from mas_lab.store import RunStore
    from mas_lab.tracking import Tracker

    if not (run_dir / "run.db").is_file() or not (run_dir / "task.yaml").is_file():
        _fail(f"{run_dir}: not a run folder (needs run.db and task.yaml)")
    store = RunStore(run_dir / "run.db")
    state = RunControl(store).status()
    if state["running"]:
        _fail(f"{run_dir}: the run is still running (pid {state.get('pid')}); stop it first: mas-lab stop {run_dir}")
    found = checkpoint.complete(run_dir)
    if not found:
        _fail(f"{run_dir}: no complete checkpoint to resume from")
    last = found[-1]
    try:
        saved = checkpoint.verify(last)
    except checkpoint.CheckpointError as exc:
        _fail(f"{exc}; remove that folder to resume from an earlier checkpoint")
    source = task_file or run_dir / "task.yaml"
    try:
        task = load_task(source, overrides)
    except TaskFileError as exc:
        _fail(str(exc))
    before = TaskConfig.model_validate(saved["task"]).model_dump(mode="json")
    now = task.model_dump(mode="json")
    for key in _FIXED:
        a, b = _get(before, key), _get(now, key)
        if a != b:
            _fail(f"{source}: does not match the checkpoint {last}: field '{key}' was {json.dumps(a)}, now {json.dumps(b)}")
    store.rollback(saved["step"])
    (run_dir / "task.yaml").write_text(task_to_yaml(task))
    tracker = Tracker(task.tracking.mlflow_uri, task.tracking.experiment, run_dir.name, run_id=saved["mlflow_run_id"])
    return task, run_dir, store, tracker, last


def _get(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data[part]
    return data


def _install_signal_handlers(controller) -> None:
    import signal

    def handler(signum, frame):
        if controller.stop_requested:
            raise KeyboardInterrupt
        controller.request_stop()
        console.print(f"\n{signal.Signals(signum).name}: stopping with a checkpoint at the next step boundary "
                      "(send it again to abort at once)", highlight=False)

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def _train_with_progress(task: TaskConfig, controller) -> dict:
    columns = (TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.description}"),
               TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        handle = bar.add_task("eval", total=task.train.steps, completed=controller.step)

        def progress(event: dict) -> None:
            bar.update(handle, description=event["phase"])
            if event["phase"] == "done":
                bar.update(handle, completed=event["step"])
                m = event["metrics"]
                bar.console.print(
                    f"step {event['step']:>4}  reward {m['reward/mean']:.3f}  team {m['team_reward']:.3f}  "
                    f"zero-std {m['zero_std_frac']:.2f}  step {m['time/step']:.1f}s  {m['tokens_per_s']:.0f} tok/s",
                    highlight=False,
                )

        return controller.run(progress)


def _print_summary(task: TaskConfig, run_dir: Path, store, tracker, summary: dict) -> None:
    metrics = store.metrics()
    train_steps = [m for m in metrics.values() if "time/step" in m]

    def mean(key: str) -> float:
        values = [m[key] for m in train_steps if key in m]
        return sum(values) / len(values) if values else math.nan

    console.print("\n[bold]summary[/]", highlight=False)
    rows = [
        ("stopped early" if summary.get("stopped") else "finished", f"after step {summary.get('steps')}"),
        ("eval success before", f"{summary['eval_before']:.3f}"),
        ("eval success after", f"{summary['eval_after']:.3f}"),
        ("steps", str(len(train_steps))),
        ("mean step time (s)", f"{mean('time/step'):.2f}"),
        ("  rollout / reward / learner / sync / other",
         " / ".join(f"{mean('time/' + k):.2f}" for k in ("rollout", "reward", "learner", "weight_sync", "other"))),
        ("tokens per second (rollout)", f"{mean('tokens_per_s'):.1f}"),
        ("run store", str(run_dir / "run.db")),
        ("mlflow", f"{task.tracking.mlflow_uri}  run {tracker.run_id}"),
    ]
    for name, value in rows:
        console.print(f"  {name:<44} {value}", highlight=False, soft_wrap=True)
    print(json.dumps({"run_dir": str(run_dir), "mlflow_run_id": tracker.run_id, **summary}))


@app.command()
def replay(
    run_dir: Path = typer.Argument(..., help="a run folder (runs/<run-id>)"),
    text: bool = typer.Option(False, "--text", help="print the episode as text"),
    step: Optional[int] = typer.Option(None, "--step", help="training step (default: the first)"),
    episode: int = typer.Option(0, "--episode", help="episode index within the step"),
    kind: str = typer.Option("train", "--kind", help="train or eval"),
) -> None:
    """Print one saved episode turn by turn: every candidate, its reward and advantage, the chosen one."""
    from mas_lab.replay import format_episode
    from mas_lab.store import RunStore

    db = run_dir / "run.db"
    if not db.is_file():
        _fail(f"{run_dir}: not a run folder (no run.db)")
    store = RunStore(db)
    if step is None:
        found = store.rows("SELECT MIN(step) AS s FROM episodes WHERE kind = ?", kind)
        step = found[0]["s"] if found and found[0]["s"] is not None else 0
    record = store.episode(step, episode, kind)
    if record is None:
        _fail(f"{run_dir}: no {kind} episode {episode} at step {step}")
    if not text:
        from tui.app import MasLabApp

        MasLabApp(run_dir, "replay").run()
        return
    sys.stdout.write(format_episode(record))


@app.command("eval")
def evaluate(
    task_file: Path = typer.Argument(..., help="task file (tasks/*.yaml)"),
    checkpoint_dir: Optional[Path] = typer.Option(None, "--checkpoint", help="a checkpoint folder (runs/<run>/checkpoints/step-N)"),
    mode: Optional[str] = typer.Option(None, "--mode", help="mas or single_agent (default: the task's own)"),
    swap: bool = typer.Option(False, "--swap-policies", help="rotate the role -> policy map (two roles: swap)"),
    problems: Optional[int] = typer.Option(None, "--problems", help="held-out problems (default: train.eval_problems)"),
    samples: int = typer.Option(1, "--samples", min=1, help="1: greedy; S > 1: S sampled trajectories per problem"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: key.path=value (repeatable)"),
    no_ray: bool = typer.Option(False, "--no-ray", help="run the actors in-process"),
) -> None:
    """Evaluate a task's team (or single agent) on fixed held-out problems; print a table."""
    from mas_lab import checkpoint as checkpoints
    from mas_lab.config import as_mode, swap_policies

    overrides = list(set_ or []) + ([f"train.eval_problems={problems}"] if problems is not None else [])
    try:
        task = load_task(task_file, overrides)
        if mode is not None:
            task = as_mode(task, mode)
        if swap:
            if len({r.policy for r in task.roles}) < 2:
                _fail(f"{task_file}: --swap-policies needs roles with different policies")
            task = swap_policies(task)
    except TaskFileError as exc:
        _fail(str(exc))
    folder = None
    if checkpoint_dir is not None:
        try:
            if (checkpoint_dir / "manifest.json").is_file():
                checkpoints.verify(checkpoint_dir)
        except checkpoints.CheckpointError as exc:
            _fail(str(exc))
        folder = checkpoint_dir / "policies" if (checkpoint_dir / "policies").is_dir() else checkpoint_dir
        missing = [p for p in task.policies if not (folder / p).is_dir()]
        if missing:
            found = sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
            _fail(f"{checkpoint_dir}: no saved policy {missing}; it has {found}")
    from mas_lab.backend import Backend
    from mas_lab.controller import Controller

    task = task.model_copy(update={"name": f"eval-{task.name}"})
    run_dir, store, tracker = _new_run(task, task_file)
    settings = {"checkpoint": str(checkpoint_dir or ""), "mode": mode or task.algorithm.mode, "swap_policies": str(swap),
                "samples": str(samples)}
    tracker.log_params({f"eval.{k}": v for k, v in settings.items()})
    tracker.set_tag("mas_lab.kind", "eval")
    store.set_meta(kind="eval", status="running", **settings)
    backend = None
    try:
        with console.status("starting actors and loading models ..."):
            backend = Backend(task, use_ray=not no_ray)
            if folder is not None:
                backend.load_policies(folder, 0, optimizer=False)
        metrics = Controller(task, backend, store, tracker).evaluate(0, samples)
        tracker.log_metrics(0, metrics)
        store.set_meta(status="finished")
        tracker.finish("FINISHED")
    except BaseException:
        store.set_meta(status="failed")
        tracker.finish("FAILED")
        raise
    finally:
        if backend is not None:
            backend.shutdown()
    _print_eval(task, run_dir, metrics, samples)


def _print_eval(task: TaskConfig, run_dir: Path, metrics: dict, samples: int) -> None:
    from rich.table import Table

    n = len(task.roles)
    table = Table(title=f"{task.name}: {task.train.eval_problems} held-out problems x {samples} "
                        f"({'greedy' if samples == 1 else 'sampled'}), {n} role{'s' * (n > 1)}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("success rate", f"{metrics['eval/success_rate']:.3f}")
    table.add_row("95% interval", f"[{metrics['eval/success_ci_low']:.3f}, {metrics['eval/success_ci_high']:.3f}]")
    table.add_row("mean turns", f"{metrics['eval/turns']:.2f}")
    table.add_row("mean final team reward", f"{metrics['eval/team_reward']:.3f}")
    for role in task.roles:
        table.add_row(f"mean reward: {role.name} ({role.policy})", f"{metrics.get(f'eval/reward/{role.name}', math.nan):.3f}")
    table.add_row("seconds", f"{metrics['eval/time']:.1f}")
    Console(soft_wrap=True).print(table)
    print(json.dumps({"run_dir": str(run_dir), **{k.removeprefix("eval/"): v for k, v in metrics.items()
                                                  if k.count("/") == 1}}))


@app.command()
def tui(
    target: Path = typer.Argument(..., help="a task file (starts a run) or a run folder (live or replay)"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a task field: key.path=value"),
) -> None:
    """The dashboard. A task file starts `mas-lab run` in the background and shows it live; a run
    folder opens live while its run is running, in replay once it has finished (no Ray needed)."""
    from tui.app import MasLabApp, mode_for, start_run

    if target.is_dir():
        if not (target / "run.db").is_file():
            _fail(f"{target}: not a run folder (no run.db)")
        MasLabApp(target, mode_for(target)).run()
        return
    try:
        task = load_task(target, list(set_ or []))
    except TaskFileError as exc:
        _fail(str(exc))
    import time

    run_dir = _new_run_dir(task)
    process = start_run(target, list(set_ or []), run_dir)
    while not (run_dir / "run.db").is_file():
        if process.poll() is not None:
            _fail(f"the run ended at start; see {run_dir / 'run.log'}")
        time.sleep(0.2)
    MasLabApp(run_dir, "live").run()
    if process.poll() is None:
        console.print(f"the run goes on in the background: mas-lab tui {run_dir}  |  mas-lab stop {run_dir}",
                      highlight=False, soft_wrap=True)


def _control(run_dir: Path):
    from mas_lab.control import RunControl
    from mas_lab.store import RunStore

    if not (run_dir / "run.db").is_file():
        _fail(f"{run_dir}: not a run folder (no run.db)")
    return RunControl(RunStore(run_dir / "run.db"))


def _request(run_dir: Path, command: str, wait: bool) -> None:
    import time

    control = _control(run_dir)
    state = control.status()
    if not state["running"]:
        _fail(f"{run_dir}: the run is not running (status: {state['status']}); nothing to {command}")
    control.request(command)
    console.print(f"{command} requested; it takes effect at the next step boundary (now in step "
                  f"{state.get('step')}, phase {state.get('phase')})", highlight=False, soft_wrap=True)
    target = {"pause": lambda s: s.get("paused"), "resume": lambda s: not s.get("paused"),
              "stop": lambda s: not s["running"]}[command]
    while wait and not target(control.status()):
        if not control.status()["running"] and command != "stop":
            _fail(f"{run_dir}: the run ended before the {command} took effect")
        time.sleep(0.2)


@app.command()
def pause(run_dir: Path, wait: bool = typer.Option(False, "--wait", help="return once the run is paused")) -> None:
    """Pause a running run at its next step boundary (checkpointed; the actors stay alive)."""
    _request(run_dir, "pause", wait)


@app.command()
def resume(run_dir: Path, wait: bool = typer.Option(False, "--wait", help="return once the run is running")) -> None:
    """Resume a paused run. (To continue a run that ended or crashed: mas-lab run --resume RUN_DIR.)"""
    _request(run_dir, "resume", wait)


@app.command()
def stop(run_dir: Path, wait: bool = typer.Option(False, "--wait", help="return once the run has stopped")) -> None:
    """Stop a run gracefully at its next step boundary, with a final checkpoint."""
    _request(run_dir, "stop", wait)


@app.command()
def status(run_dir: Path) -> None:
    """Step, phase, paused or not, last checkpoint, and whether the run's process is alive."""
    state = _control(run_dir).status()
    print(json.dumps({k: state.get(k) for k in ("status", "running", "step", "phase", "paused", "last_checkpoint",
                                                 "actors_alive", "pid", "pending")}))


@app.command()
def models() -> None:
    """List the named models and whether they are available here."""
    from mas_lab.models import NAMED, check_model_name

    for name in NAMED:
        problem = check_model_name(name)
        print(f"{name:<24} {'ok' if problem is None else problem}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
