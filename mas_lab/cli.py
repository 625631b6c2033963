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


def _new_run_dir(task: TaskConfig) -> Path:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = Path(task.tracking.runs_dir) / f"{task.name}-{stamp}-{secrets.token_hex(2)}"
    run_dir.mkdir(parents=True)
    return run_dir


@app.command()
def run(
    task_file: Path = typer.Argument(..., help="task file (tasks/*.yaml)"),
    set_: Optional[List[str]] = typer.Option(None, "--set", help="override a field: key.path=value (repeatable)"),
    address: Optional[str] = typer.Option(None, "--address", help="join this Ray cluster instead of starting one"),
    no_ray: bool = typer.Option(False, "--no-ray", help="run the actors in-process (debugging)"),
) -> None:
    """Train a task headless, with a progress bar and a summary at the end."""
    overrides = list(set_ or [])
    if address:
        overrides.append(f"resources.ray_address={address}")
    try:
        task = load_task(task_file, overrides)
    except TaskFileError as exc:
        _fail(str(exc))
    from mas_lab.backend import Backend
    from mas_lab.controller import Controller
    from mas_lab.store import RunStore
    from mas_lab.tracking import Tracker

    run_dir = _new_run_dir(task)
    (run_dir / "task.yaml").write_text(task_to_yaml(task))
    store = RunStore(run_dir / "run.db")
    tracker = Tracker(task.tracking.mlflow_uri, task.tracking.experiment, run_dir.name)
    tracker.log_params(flat_params(task))
    tracker.log_artifact(run_dir / "task.yaml")
    store.set_meta(run_id=run_dir.name, task=task.model_dump(mode="json"), task_file=str(task_file),
                   mlflow_uri=task.tracking.mlflow_uri, mlflow_run_id=tracker.run_id, status="running")
    console.print(f"run [bold]{run_dir.name}[/]  store {run_dir / 'run.db'}  mlflow run {tracker.run_id}",
                  highlight=False, soft_wrap=True)
    status = "FAILED"
    backend = None
    try:
        with console.status("starting actors and loading models ..."):
            backend = Backend(task, use_ray=not no_ray)
        controller = Controller(task, backend, store, tracker)
        columns = (TextColumn("step"), MofNCompleteColumn(), BarColumn(), TextColumn("{task.description}"),
                   TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, console=console, transient=False) as bar:
            handle = bar.add_task("eval", total=task.train.steps)

            def progress(event: dict) -> None:
                bar.update(handle, description=event["phase"])
                if event["phase"] == "done":
                    bar.advance(handle)
                    m = event["metrics"]
                    bar.console.print(
                        f"step {event['step']:>4}  reward {m['reward/mean']:.3f}  team {m['team_reward']:.3f}  "
                        f"zero-std {m['zero_std_frac']:.2f}  step {m['time/step']:.1f}s  {m['tokens_per_s']:.0f} tok/s",
                        highlight=False,
                    )

            summary = controller.run(progress)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        store.set_meta(status=status.lower())
        tracker.finish(status)
        if backend is not None:
            backend.shutdown()
    _print_summary(task, run_dir, store, tracker, summary)


def _print_summary(task: TaskConfig, run_dir: Path, store, tracker, summary: dict) -> None:
    metrics = store.metrics()
    train_steps = [m for m in metrics.values() if "time/step" in m]

    def mean(key: str) -> float:
        values = [m[key] for m in train_steps if key in m]
        return sum(values) / len(values) if values else math.nan

    console.print("\n[bold]summary[/]", highlight=False)
    rows = [
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
        console.print("the interactive replay screen is not built yet; printing text", highlight=False)
    sys.stdout.write(format_episode(record))


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
