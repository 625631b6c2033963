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
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mas_lab.analysis.plots import plot_run
from mas_lab.config import (
    TaskConfig,
    TaskFileError,
    as_mode,
    flat_params,
    load_task,
    stored_task_data,
    swap_policies,
    task_to_yaml,
)
from mas_lab.records import checkpoint
from mas_lab.records.control import RunControl, acquire_lock, release_lock
from mas_lab.records.provenance import code_version
from mas_lab.records.run_folder import NotARunFolder, is_run_folder, run_folder
from mas_lab.records.store import RunStore, StoreError
from mas_lab.records.tracking import Tracker, resolve_uri
from mas_lab.sandbox.isolation import SandboxUnavailable
from mas_lab.training.baselines import task_pool
from mas_lab.training.metric_names import EVAL_SUCCESS
from mas_lab.training.progress import Progress, ProgressEvent


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


def load(task_file: Path, overrides: list[str], stored: bool = False) -> TaskConfig:
    try:
        return load_task(task_file, overrides, stored)
    except TaskFileError as exc:
        raise RunError(str(exc)) from None


def check_runs_dir(task: TaskConfig) -> None:
    """Whether run folders can be made under tracking.runs_dir, without making anything: it is a
    folder, or the nearest folder above it that exists is one we may write to."""
    where = Path(task.tracking.runs_dir)
    existing = where
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        raise RunError(f"tracking.runs_dir '{task.tracking.runs_dir}': {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunError(f"tracking.runs_dir '{task.tracking.runs_dir}': {existing} is not writable here")


def check_problems(task: TaskConfig) -> None:
    """Whether the task's parameters can make its held-out set (and hard split) and one step of
    distinct training problems: checked before a run folder exists, so a task that cannot run
    leaves nothing behind."""
    try:
        pool = task_pool(task)
        pool.distinct_train(0, task.train.problems_per_step)
    except ValueError as exc:
        raise RunError(f"{task.env.name} with env.params {json.dumps(task.env.params)[:300]}: {exc}") from None


def new_run_dir(task: TaskConfig, explicit: Path | None = None) -> Path:
    """runs_dir/<name>-<time>-<random>, or `explicit` when it does not already hold a run."""
    if explicit is not None:
        if (explicit / "run.db").exists():
            raise RunError(f"{explicit}: already holds a run; continue it with --resume {explicit}")
        run_dir = explicit
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = Path(task.tracking.runs_dir) / f"{task.name}-{stamp}-{secrets.token_hex(2)}"
    try:
        run_dir.mkdir(parents=True, exist_ok=explicit is not None)
    except OSError as exc:
        raise RunError(
            f"cannot make the run folder {run_dir} (tracking.runs_dir '{task.tracking.runs_dir}'): "
            f"{exc.strerror or exc}"
        ) from None
    return run_dir


# what a failure says when the machine's memory or address space ran out: a thread's stack and a
# shared library's pages are address space too, so under `prlimit --as` a new thread is refused and
# torch (ImportError), ray's or MLflow's libraries (OSError, ImportError) fail to load
OUT_OF_MEMORY_WORDS = ("allocate memory", "out of memory", "can't start new thread", "failed to map segment")


def short_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is the machine's memory limit, not the run's or the input's fault."""
    return isinstance(exc, MemoryError) or any(words in str(exc) for words in OUT_OF_MEMORY_WORDS)


def new_run(task: TaskConfig, task_file: Path, run_dir: Path | None = None) -> Run:
    """A run folder (locked by this process for its life) with the resolved task.yaml, a fresh
    store and a new MLflow run. The tracking URI is recorded absolute, so a resume from another
    working folder finds the same MLflow store. If any of it fails, the folder is removed again."""
    _check_cluster(task)  # before anything is created: a wrong address leaves nothing behind
    check_problems(task)
    created = run_dir is None or not run_dir.exists()
    run_dir = new_run_dir(task, run_dir)
    if not _lock(run_dir):
        raise RunError(f"{run_dir}: another mas-lab process holds this run folder")
    try:
        uri = resolve_uri(task.tracking.mlflow_uri)
        try:
            tags = dict(task.tracking.tags)
            if task.tracking.parent_run:
                tags["mlflow.parentRunId"] = task.tracking.parent_run
            tracker = Tracker(uri, task.tracking.experiment, run_dir.name, tags=tags)
        except MemoryError:  # the machine's limit, not the URI's fault: the caller says so
            raise
        except Exception as exc:
            if short_of_memory(exc):  # MLflow's libraries failed to map under an address-space limit
                raise MemoryError(str(exc)) from exc
            raise RunError(
                f"tracking.mlflow_uri '{task.tracking.mlflow_uri}': MLflow cannot use it "
                f"({type(exc).__name__}: {str(exc)[:300]})"
            ) from None
        (run_dir / "task.yaml").write_text(task_to_yaml(task))
        store = RunStore(run_dir / "run.db")
        tracker.log_params(flat_params(task))
        tracker.log_artifact(run_dir / "task.yaml")
        tracker.set_tag("mas_lab.kind", "train")
        tracker.set_tag("mas_lab.code", code_version())
        store.set_meta(
            run_id=run_dir.name,
            task=task.model_dump(mode="json"),
            task_file=str(task_file),
            mlflow_uri=uri,
            mlflow_run_id=tracker.run_id,
            status="starting",
            code=[code_version()],
        )
    except BaseException:
        release_lock(run_dir)
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return Run(task, run_dir, store, tracker)


# What a resumed task may not change: the checkpoint's weights and groups depend on these (the
# roles' names and policies, the team's shape; a role's K, sampling, alpha, loss weight and prompt may
# change, as the other settings may: each change is an MLflow tag of the run). The AdamW
# implementation stays: fused and foreach differ by float rounding, so a switch would not continue exactly;
# so does the overlap (a checkpoint taken with a rollout already made holds it for the next step).
# A policy's dtype may change only where it resolves as before: `auto` resolves by the machine (bf16
# where the CPU or GPU has it natively), so the actors' resolved dtypes are checked when they report
# (_check_precision): a run trained in float32 continues in float32, or refuses.
FIXED_ON_RESUME = ("env.name", "roles[].name", "roles[].policy", "policies", "algorithm.adamw", "algorithm.overlap")


def resume(run_dir: Path, task_file: Path | None, overrides: list[str]) -> Run:
    """Check everything before changing anything: a run folder that no process holds, a store this
    mas-lab can read, a sound checkpoint, a task that matches it, the MLflow run reachable, and a
    store that still holds every step the checkpoint recorded (a lost or corrupted WAL would have
    dropped some). Only then roll the store back to the checkpoint."""
    if not (run_dir / "run.db").is_file() or not (run_dir / "task.yaml").is_file():
        raise RunError(f"{run_dir}: not a run folder (needs run.db and task.yaml)")
    if not _lock(run_dir):
        raise RunError(
            f"{run_dir}: the run is still running (another process holds it); stop it first: mas-lab stop {run_dir}"
        )
    try:
        return _resume_locked(run_dir, task_file, overrides)
    except BaseException:
        release_lock(run_dir)
        raise


def _resume_locked(run_dir: Path, task_file: Path | None, overrides: list[str]) -> Run:
    try:  # read-only until every check has passed
        reader = RunStore(run_dir / "run.db", create=False)
    except StoreError as exc:
        raise RunError(str(exc)) from None
    problem = reader.integrity_problem()
    if problem:
        reader.close()
        raise RunError(
            f"{run_dir / 'run.db'}: damaged ({problem}); the run cannot continue exactly, and nothing was changed"
        )
    found = checkpoint.complete(run_dir)
    if not found:
        raise RunError(f"{run_dir}: no complete checkpoint to resume from")
    last = found[-1]
    try:
        saved = checkpoint.verify(last)
    except checkpoint.CheckpointError as exc:
        raise RunError(f"{exc}; remove that folder to resume from an earlier checkpoint") from None
    source = task_file or run_dir / "task.yaml"
    task = load(source, overrides, stored=task_file is None)
    before = TaskConfig.model_validate(stored_task_data(saved["task"]))
    for key in FIXED_ON_RESUME:
        a, b = _get(_fixed_part(before), key), _get(_fixed_part(task), key)
        if a != b:
            raise RunError(
                f"{source}: does not match the checkpoint {last}: field '{key}' was {json.dumps(a)}, "
                f"now {json.dumps(b)}"
            )
    _check_cluster(task)
    expected, held = saved.get("store"), reader.digest(saved["step"])
    if expected is not None and expected != held:
        missing = sorted(set(expected["steps"]) - set(held["steps"]))
        raise RunError(
            f"{run_dir / 'run.db'}: does not hold what checkpoint {last.name} recorded (steps missing: "
            f"{missing or 'none'}; {held['candidates']} of {expected['candidates']} candidates); the store "
            "lost data (a lost or damaged run.db-wal?), so the run cannot continue exactly"
        )
    meta = reader.meta()
    reader.close()
    same_uri = task.tracking.mlflow_uri == before.tracking.mlflow_uri and meta.get("mlflow_uri")
    uri = meta["mlflow_uri"] if same_uri else resolve_uri(task.tracking.mlflow_uri)
    try:
        tracker = Tracker(uri, task.tracking.experiment, run_dir.name, run_id=saved["mlflow_run_id"])
    except Exception as exc:
        raise RunError(
            f"{run_dir}: its MLflow run {saved['mlflow_run_id']} is not reachable at {uri} "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    store = RunStore(run_dir / "run.db")
    store.rollback(saved["step"])
    stale = store.take_controls()  # requests meant for the process that died: a stale pause would hold this one
    if stale:
        store.event(saved["step"], "control", f"dropped requests left by the previous process: {stale}")
    (run_dir / "task.yaml").write_text(task_to_yaml(task))
    code = list(meta.get("code") or ["unrecorded"])
    if code[-1] != code_version():  # the run goes on with other code: both are recorded, and said
        store.event(saved["step"], "code", f"resumed with mas_lab code {code_version()} (until now {code[-1]})")
        code.append(code_version())
    store.set_meta(mlflow_uri=uri, task=task.model_dump(mode="json"), code=code)
    old = flat_params(before)
    changed = {k: v for k, v in flat_params(task).items() if old.get(k) != v}
    if changed:  # MLflow params cannot change: the new values become tags, the artifact is replaced
        tracker.log_artifact(run_dir / "task.yaml")
        for key, value in changed.items():
            tracker.set_tag(f"mas_lab.resumed.{key}", f"{old.get(key)} -> {value}"[:5000])
        # the store too (the dashboard and load_run read it, not MLflow): what changed, from what, to what
        store.event(
            saved["step"],
            "resume",
            "changed on resume: " + "; ".join(f"{k} {old.get(k)} -> {v}" for k, v in changed.items())[:5000],
        )
    return Run(task, run_dir, store, tracker, resume_from=last)


def _lock(run_dir: Path) -> bool:
    """acquire_lock, with a folder where no lock file can be made (read-only media, another user's
    folder) said in one line: a run continues only where it can write."""
    try:
        return acquire_lock(run_dir)
    except OSError as exc:
        raise RunError(
            f"{run_dir}: cannot take the run's lock file ({exc.strerror or exc}); a run continues "
            "only in a folder it can write (copy it somewhere writable)"
        ) from None


def _check_cluster(task: TaskConfig) -> None:
    if task.resources.ray_address:
        # lazy: torch, only where a run trains or evaluates
        from mas_lab.actors.backend import check_cluster

        problem = check_cluster(task.resources.ray_address, task.resources.connect_timeout_s)
        if problem:
            raise RunError(f"resources.ray_address: {problem}")


PRECISION_EVENT = "actor dtypes: "  # a `precision` event's message: this prefix, then each actor's report as JSON


def _fixed_part(task: TaskConfig) -> dict:
    """The task as FIXED_ON_RESUME compares it: the policies without their dtype (checked as
    resolved, once the actors report it: _check_precision)."""
    data = task.model_dump(mode="json")
    for policy in data["policies"].values():
        policy.pop("dtype", None)
    return data


def _check_precision(run: Run, reports: dict[str, dict]) -> None:
    """A resume refuses to go on in another floating-point type than the run trained in: `dtype:
    auto` resolves by the machine (mas_lab/modeling/precision.py), so a run started where bf16 is not
    native and resumed where it is would switch from float32 to bf16 autocast mid-run, silently. The
    earlier process's resolved dtypes are its last `precision` event (events survive the rollback)."""
    earlier: dict[str, dict] = {}
    for event in run.store.events():
        if event["kind"] == "precision" and event["message"].startswith(PRECISION_EVENT):
            try:
                earlier = json.loads(event["message"].removeprefix(PRECISION_EVENT))
            except json.JSONDecodeError:
                continue
    changed = {
        actor: (str(earlier[actor].get("dtype")), str(report["dtype"]))
        for actor, report in reports.items()
        if actor in earlier and earlier[actor].get("dtype") != report["dtype"]
    }
    if not changed:
        return
    said = ", ".join(f"{actor} {was} -> {now}" for actor, (was, now) in sorted(changed.items()))
    trained = {was for was, _ in changed.values()}
    hint = (
        " ".join(f"--set policies.{name}.dtype={next(iter(trained))}" for name in run.task.policies)
        if len(trained) == 1
        else "each policy's dtype as it trained"
    )
    raise RunError(
        f"{run.run_dir}: the run would not continue exactly: its actors resolve another dtype than the run "
        f"trained in ({said}; `dtype: auto` resolves by the machine). Continue in the dtype it trained in: "
        f"mas-lab run --resume {run.run_dir} {hint}"
    )


def _get(data: dict, dotted: str):
    """The value at a dotted key; `list[].field` is that field of every item of the list."""
    head, _, rest = dotted.partition("[].")
    for part in head.split("."):
        data = data[part]
    return [_get(item, rest) for item in data] if rest else data


def train(
    run: Run, use_ray: bool = True, progress: Progress | None = None, on_signal: Callable[[str], None] | None = None
) -> dict:
    """Start the actors, restore the checkpoint of a resume, train, and record how the run ended
    (store status and MLflow status) whatever happens. SIGINT / SIGTERM stop at the next step
    boundary with a checkpoint (`on_signal` is told); a second one aborts at once."""
    control = RunControl(run.store)

    def tell(event: ProgressEvent) -> None:  # start-up phases reach the dashboard too
        control.publish(phase=event.phase)
        if progress:
            progress(event)

    status, backend, summary, restarts = "FAILED", None, {}, 0
    run.store.set_meta(status="running", error=None)
    try:
        while True:
            try:
                tell(ProgressEvent("starting actors and loading models", 0))
                # imported here, inside the run's record: torch failing to load (under an
                # address-space limit) marks the run failed with its reason, not "crashed"
                # lazy: torch, only where a run trains or evaluates
                from mas_lab.actors.backend import Backend
                from mas_lab.training.trainer import Trainer

                backend = None
                backend = Backend(run.task, use_ray=use_ray)
                trainer = Trainer(run.task, backend, run.store, run.tracker, run.run_dir)
                if run.resume_from is not None:
                    state = trainer.restore(run.resume_from)
                    run.store.event(state["step"], "resume", f"resumed from {run.resume_from.name}")
                    tell(ProgressEvent(f"resumed from {run.resume_from.name}", state["step"]))
                run.store.event(trainer.step, "placement", "actors on nodes: " + json.dumps(backend.placement()))
                reports = backend.precision()
                if run.resume_from is not None:
                    _check_precision(run, reports)
                dtypes = _record_precision(run, trainer.step, reports, tell)
                _stop_on_signals(trainer, on_signal)
                summary = {**trainer.run(progress), "precision": dtypes, "code": run.store.meta().get("code", [])}
                break
            except SandboxUnavailable as exc:
                raise RunError(f"sandbox: {exc}") from None
            except Exception as exc:
                died = _dead_actor(exc)
                if died is None:
                    raise
                if backend is not None:  # None when the actors died while starting
                    backend.shutdown()
                backend = None
                if restarts >= run.task.resources.actor_restarts:
                    raise RunError(
                        f"{died} died ({restarts} restarts allowed by resources.actor_restarts, "
                        f"all used); continue with: mas-lab run --resume {run.run_dir}"
                    ) from None
                restarts += 1
                run.resume_from = _back_to_last_checkpoint(run, f"{died} died; restart {restarts}")
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except BaseException as exc:  # the reason, for `status` and the dashboard
        record_error(run, exc)
        raise
    finally:
        # Each ending step on its own: a full disk that broke the run may break one of them too.
        ended = ("stopped" if summary.get("stopped") else "finished") if status == "FINISHED" else status.lower()
        mlflow_status = "KILLED" if ended in ("stopped", "killed") else status  # a stopped run did not finish
        for finish in (
            lambda: run.store.set_meta(status=ended),
            lambda: run.tracker.set_tag("mas_lab.end", ended),
            lambda: _log_charts(run),
            lambda: run.tracker.finish(mlflow_status),
            run.store.finish,
            lambda: backend.shutdown() if backend else None,
        ):
            try:
                finish()
            except Exception:
                pass
    run.summary = summary
    return summary


def _log_charts(run: Run) -> None:
    """The run's charts (`mas-lab plot`) as MLflow artifacts, so its UI shows them beside the metrics."""
    for path in plot_run(run.run_dir, run.run_dir / "plots"):
        run.tracker.client.log_artifact(run.tracker.run_id, str(path), "charts")


def _record_precision(run: Run, step: int, reports: dict[str, dict], tell) -> dict[str, str]:
    """Store each actor's resolved dtype (an event); where bf16 is emulated, say so to the user:
    it is tens of times slower than float32 there (mas_lab/modeling/precision.py). Actor -> dtype."""
    run.store.event(step, "precision", PRECISION_EVENT + json.dumps(reports))
    emulated = sorted(actor for actor, r in reports.items() if r["emulated_bf16"])
    if emulated:
        message = (
            f"bfloat16 is emulated on this machine's CPU (no avx512_bf16, amx_bf16 or bf16 flag) for "
            f"{', '.join(emulated)}: expect it tens of times slower than float32; set the policy's "
            "dtype to auto or float32"
        )
        run.store.event(step, "warning", message)
        tell(ProgressEvent("warning: " + message, step))
    # asked for float32 where the actor's device has native bf16 (an actor reports it: it may be another node)
    wasted = sorted(actor for actor, r in reports.items() if r.get("requested") == "float32" and r.get("native_bf16"))
    if wasted:
        message = (
            f"float32 where this machine computes bfloat16 natively, for {', '.join(wasted)}: about twice the "
            "time a step needs; set the policy's dtype to auto (or bfloat16)"
        )
        run.store.event(step, "warning", message)
        tell(ProgressEvent("warning: " + message, step))
    return {actor: str(r["dtype"]) for actor, r in reports.items()}


def record_error(run: Run, exc: BaseException) -> None:
    """The failure's reason in the store (`status`, the dashboard): its type and first line."""
    try:
        run.store.set_meta(
            error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:400] if str(exc).strip() else ''}"
        )
    except Exception:
        pass


def _dead_actor(exc: BaseException) -> str | None:
    """'the Ray actor <class> (pid N)' when `exc` says an actor died, else None."""
    try:
        # lazy: ray (~0.4 s), only where the actors run
        from ray.exceptions import RayActorError
    except ImportError:
        return None
    if not isinstance(exc, RayActorError):
        return None
    error = getattr(exc, "error_msg", "") or str(exc)
    name = next((w for w in ("RolloutWorker", "Learner", "Colocated") if w in error), "a Ray actor")
    return f"the Ray actor {name}" if name != "a Ray actor" else name


def _back_to_last_checkpoint(run: Run, reason: str) -> Path:
    """After an actor died: drop the store's rows after the last checkpoint (MLflow has only steps
    up to it) and return that checkpoint, to restart the actors from it."""
    found = checkpoint.complete(run.run_dir)
    if not found:
        raise RunError(f"{reason}, and {run.run_dir} has no checkpoint to restart from")
    saved = checkpoint.verify(found[-1])
    run.store.rollback(saved["step"])
    run.store.event(saved["step"], "actor_restart", f"{reason}: restarting from {found[-1].name}")
    return found[-1]


def _stop_on_signals(trainer, on_signal: Callable[[str], None] | None) -> None:
    def handler(signum, frame):
        if trainer.stop_requested:
            raise KeyboardInterrupt
        trainer.request_stop()
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


def evaluate(
    task: TaskConfig,
    task_file: Path,
    samples: int = 1,
    checkpoint_dir: Path | None = None,
    settings: dict[str, str] | None = None,
    use_ray: bool = True,
) -> tuple[Run, dict[str, float]]:
    """An evaluation run: its own run folder and MLflow run (tag mas_lab.kind=eval)."""
    # lazy: torch, only where a run trains or evaluates
    from mas_lab.actors.backend import Backend
    from mas_lab.training.trainer import Trainer

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
        metrics = Trainer(task, backend, run.store, run.tracker).evaluate(0, samples)
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
def start_in_background(
    task_file: Path, overrides: list[str], run_dir: Path | None = None, poll_s: float = 0.2
) -> tuple[Path, subprocess.Popen]:
    """Validate the task, then start `mas-lab run` as its own process (it goes on if the caller
    exits; stop it with `mas-lab stop RUN_DIR`), logging to RUN_DIR/run.log. Returns once the
    run's store exists, or raises RunError when the process ended first."""
    task = load(task_file, overrides)
    run_dir = new_run_dir(task, run_dir)
    command = [sys.executable, "-m", "mas_lab.cli", "run", str(task_file), "--run-dir", str(run_dir)]
    for item in overrides:
        command += ["--set", item]
    with open(run_dir / "run.log", "w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "120"},
        )
    while not (run_dir / "run.db").is_file():
        if process.poll() is not None:
            raise RunError(f"the run ended at start; see {run_dir / 'run.log'}")
        time.sleep(poll_s)
    return run_dir, process


# --- runs at a glance --------------------------------------------------------------------------
def find_run_folders(folder: Path, depth: int = 4) -> list[Path]:
    """The run folders (run.db or run.db.xz) at or under `folder`, down to `depth` levels, not
    looking inside a run folder (its checkpoints)."""
    if is_run_folder(folder):
        return [folder]
    if depth == 0 or not folder.is_dir():
        return []
    found: list[Path] = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        found += find_run_folders(child, depth - 1)
    return found


def list_runs(folder: Path) -> list[dict]:
    """One row per run folder under `folder` (at any depth: a study's kept runs, run.db.xz, are
    <regime>/seed-<n>/): id, task, kind, status (true: a run whose process died is "crashed"),
    step / total, eval success first and last, started, MLflow run id."""
    rows: list[dict[str, Any]] = []
    for found in find_run_folders(Path(folder)):
        name = str(found.relative_to(folder)) if found != Path(folder) else found.name
        row = {"run": name, "path": str(found)}
        try:
            run_dir = run_folder(found)
            store = RunStore(run_dir / "run.db", create=False)
        except (StoreError, sqlite3.Error, NotARunFolder) as exc:
            rows.append({**row, "status": f"unreadable: {exc}"})
            continue
        try:
            meta, state = store.meta(), RunControl(store).status()
            task = meta.get("task") or {}
            evals = store.series(EVAL_SUCCESS)
            started, _ = store.time_span()
            rows.append(
                {
                    **row,
                    "task": task.get("name"),
                    "kind": meta.get("kind", "train"),
                    "status": state["status"],
                    "step": state.get("step"),
                    "steps": (task.get("train") or {}).get("steps"),
                    "eval_first": evals[0][1] if evals else None,
                    "eval_last": evals[-1][1] if evals else None,
                    "started": started,
                    "mlflow_run_id": meta.get("mlflow_run_id"),
                }
            )
        except sqlite3.Error as exc:
            rows.append({**row, "status": f"unreadable: {exc}"})
        finally:
            store.close()
    return rows
