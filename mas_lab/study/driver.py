"""Running a study: every cell (task x regime x seed) an ordinary `mas-lab run`, kept runs skipped
and interrupted ones continued from their checkpoints, so a study resumes anywhere; at most
`jobs` runs at once on this machine, or, on a Ray cluster, each run a Ray task placed on a node with
free CPUs (the whole run on that node, `--no-ray` inside it), the node recorded per attempt. MLflow:
one parent run for the study, each run nested under it (tag mlflow.parentRunId)."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import statistics
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from mas_lab.config import load_task
from mas_lab.modeling.models import cache_dir
from mas_lab.records import checkpoint
from mas_lab.records.control import lock_held
from mas_lab.records.store import RunStore
from mas_lab.records.tracking import Tracker
from mas_lab.study.families import Cell, Family, archive_folder, cells
from mas_lab.study.precision import check as check_precision
from mas_lab.study.report import report
from mas_lab.study.reuse import take_all
from mas_lab.study.runner import STORE, complete, drop_checkpoints, run_regime
from mas_lab.study.spec import read_kept_json
from mas_lab.training.metric_names import EVAL_SUCCESS, EVAL_TIME, STEP_TIME
from mas_lab.training.progress import time_left


def parent_run(families: list[Family]) -> tuple[str, ...]:
    """The study's MLflow parent run (made once; its id kept in <study out>/study.json), as the
    overrides that nest a new run under it and tag it. Empty when MLflow cannot be opened: the runs
    then stand alone (said on stderr)."""
    family = families[0]
    state_file = Path(family.study_out or family.out) / "study.json"
    state = json.loads(state_file.read_text()) if state_file.is_file() else {}
    uri = f"sqlite:///{family.mlflow_store.resolve()}"
    try:
        experiment = load_task(Path(family.root) / next(iter(family.regimes.values()))[0]).tracking.experiment
        tracker = Tracker(
            uri,
            experiment,
            family.study or "study",
            run_id=state.get("mlflow_parent", {}).get(uri),
            tags={"mas_lab.kind": "study", "mas_lab.study_file": family.study_file},
        )
    except Exception as exc:  # noqa: BLE001 - the study runs without its parent run
        print(f"[study] no MLflow parent run ({type(exc).__name__}: {str(exc)[:200]})", file=sys.stderr)
        return ()
    if tracker.run_id != state.get("mlflow_parent", {}).get(uri):
        tracker.log_params(
            {
                "tasks": ",".join(f.key for f in families),
                "regimes": " | ".join(family.names),
                "seeds": ",".join(str(s) for s in family.seeds),
            }
        )
        state.setdefault("mlflow_parent", {})[uri] = tracker.run_id
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_text(json.dumps(state, indent=1) + "\n")
    return (f"tracking.parent_run={tracker.run_id}",)


def finish_parent(families: list[Family], status: str) -> None:
    family = families[0]
    state_file = Path(family.study_out or family.out) / "study.json"
    uri = f"sqlite:///{family.mlflow_store.resolve()}"
    run_id = json.loads(state_file.read_text()).get("mlflow_parent", {}).get(uri) if state_file.is_file() else None
    if run_id:
        # lazy: mlflow (~1.5 s), only in a tracked run
        from mlflow.tracking import MlflowClient

        MlflowClient(tracking_uri=uri).set_terminated(run_id, status)


def cell_tracking(cell: Cell, parent: tuple[str, ...]) -> tuple[str, ...]:
    tags = {"mas_lab.study": cell.family.study, "mas_lab.regime": cell.regime, "mas_lab.seed": str(cell.seed)}
    tags["mas_lab.task"] = cell.family.key
    return (*parent, f"tracking.tags={json.dumps(tags)}")


def run_study(
    families: list[Family],
    seeds: list[int] | None = None,
    only: list[str] | None = None,
    jobs: int = 1,
    address: str | None = None,
    cpus_per_run: float = 1.0,
    extra: list[str] | None = None,
    report_only: bool = False,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    prune: bool = False,
) -> dict[str, list[dict]]:
    """Run what is not kept yet, report each task after each of its runs and once at the end;
    returns each task's complete runs. `prune`: each kept run's checkpoints are removed as it is
    kept (runner.drop_checkpoints), and those of runs kept before."""
    extra = list(extra or [])
    for taken in take_all(families, seeds, only, extra):  # checked first: a ReuseError writes nothing
        log(f"[study] {taken['regime']} seed {taken['seed']}: the same run kept in {taken['reused_from']}, taken")
    todo = [c for c in cells(families, seeds, only) if not c.kept]
    if todo and not report_only and not address:
        check_precision(todo, extra)  # one dtype a table: raises MixedPrecision before anything trains
    for family in families:
        Path(family.out).mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()

    def kept(family: Family) -> list[dict]:
        results = complete(Path(family.out), family.archive_dir, family.names)
        for folder in drop_checkpoints(results) if prune else []:
            log(f"[study] {folder}: removed (the run is kept; --drop-checkpoints)")
        return results

    def finished(family: Family) -> None:
        with lock:
            report(family, kept(family), Path(family.out))

    if todo and not report_only:
        parent = parent_run(families)
        log(f"[study] {len(todo)} runs to go ({'Ray cluster ' + address if address else f'{jobs} at a time here'})")
        if address:
            _on_cluster(todo, address, cpus_per_run, extra, parent, finished)
        else:
            if jobs > 1 and not any(s.startswith("resources.torch_threads=") for s in extra):
                extra.append(f"resources.torch_threads={max(1, (os.cpu_count() or 1) // jobs)}")
            _here(todo, jobs, extra, parent, finished)
        if all(c.kept for c in cells(families, seeds, only)):
            finish_parent(families, "FINISHED")
    out = {}
    for family in families:
        results = kept(family)
        report(family, results, Path(family.out))
        out[family.key] = results
    return out


def summary_rows(results: dict[str, list[dict]]) -> list[dict]:
    """One line per complete run: task, regime, seed, times, held-out success before and after."""
    return [
        {"task": key}
        | {k: r[k] for k in ("regime", "seed", "wall_s", "cpu_s")}
        | {"before": r["summary"]["eval_before"], "after": r["summary"]["eval_after"]}
        for key, runs in results.items()
        for r in runs
    ]


def _here(todo: list[Cell], jobs: int, extra: list[str], parent: tuple[str, ...], finished) -> None:
    queue = list(todo)
    lock = threading.Lock()

    def work() -> None:
        while True:
            with lock:
                if not queue:
                    return
                cell = queue.pop(0)
            result = run_regime(
                cell.family, cell.regime, cell.seed, Path(cell.family.out), extra, cell_tracking(cell, parent)
            )
            if result is not None:
                finished(cell.family)

    workers = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


def _on_cluster(
    todo: list[Cell], address: str, cpus_per_run: float, extra: list[str], parent: tuple[str, ...], finished
) -> None:
    """Each cell a Ray task needing `cpus_per_run` CPUs: Ray starts it on a node with them free, so
    N nodes run N runs at once. The cluster's nodes see the study's folders at the same paths (one
    machine, or a shared file system). A task whose node dies is retried (max_retries): the run
    continues from its checkpoint."""
    # lazy: torch, only where a run trains or evaluates
    from mas_lab.actors.backend import check_cluster, start_ray

    problem = check_cluster(address, 10.0)
    if problem:
        raise RuntimeError(problem)
    start_ray(address)
    # lazy: ray (~0.4 s), only where the actors run
    import ray

    @ray.remote(num_cpus=cpus_per_run, max_retries=2)
    def run_cell(cell: Cell, tracking: tuple[str, ...]) -> dict | None:
        return run_regime(cell.family, cell.regime, cell.seed, Path(cell.family.out), extra, tracking)

    pending = {run_cell.remote(c, cell_tracking(c, parent)): c for c in todo}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        cell = pending.pop(ready[0])
        try:
            result = ray.get(ready[0])
        except Exception as exc:  # noqa: BLE001 - one cell's failure does not stop the study
            print(f"[study] {cell.family.key}: {cell.regime} seed {cell.seed}: {exc}", file=sys.stderr)
            continue
        if result is not None:
            finished(cell.family)


def study_status(families: list[Family], seeds: list[int] | None = None) -> list[dict]:
    """Every cell: kept / finished / running / interrupted (a checkpoint to continue from) /
    started (no checkpoint yet, not running) / pending, its step, its last held-out success and
    the node of its last attempt. Read-only: nothing is kept or removed."""
    rows = []
    for cell in cells(families, seeds):
        row: dict = {"task": cell.family.key, "regime": cell.regime, "seed": cell.seed}
        kept = archive_folder(cell.family.archive_dir, cell.regime, cell.seed) / "summary.json"
        summary = kept if kept.is_file() else cell.folder / "summary.json"
        segments_file = cell.folder / "segments.json"
        segments = read_kept_json(segments_file) if segments_file.is_file() else []
        row["node"] = segments[-1].get("node") if segments else None
        if summary.is_file():
            result = read_kept_json(summary)
            row.update(
                status="kept" if summary == kept else "finished",
                step=result["summary"].get("steps"),
                steps=result["summary"].get("steps"),
                left_s=0.0,
                wall_s=result.get("wall_s"),
                success=result["summary"].get("eval_after"),
                node=(result.get("placement") or [row["node"]])[-1],
                run_dir=result["run_dir"] if Path(result["run_dir"], "run.db").is_file() else None,
                kept=str(kept.parent) if summary == kept else None,
            )
            rows.append(row)
            continue
        run_dirs = sorted(p.parent for p in (cell.folder / "runs").glob("*/run.db"))
        if not run_dirs:
            rows.append(
                {**row, "status": "pending", "step": None, "steps": None, "left_s": None}
                | {"success": None, "run_dir": None, "kept": None}
            )
            continue
        run_dir = run_dirs[-1]
        status = "running" if lock_held(run_dir) else "interrupted" if checkpoint.complete(run_dir) else "started"
        step = success = steps = left = None
        try:
            store = RunStore(run_dir / "run.db", create=False)
            try:
                step = max((s for s, m in store.metrics().items() if STEP_TIME in m), default=0)
                evals = store.series(EVAL_SUCCESS)
                success = evals[-1][1] if evals else None
                step_times = [v for _, v in store.series(STEP_TIME)]
                eval_times = [v for _, v in store.series(EVAL_TIME)]
            finally:
                store.close()
            train = load_task(run_dir / "task.yaml").train
            steps, left = train.steps, time_left(step_times, eval_times, step, train.steps, train.eval_every)
        except Exception:  # noqa: BLE001 - a store or task file being created right now
            pass
        rows.append(
            {**row, "status": status, "step": step, "steps": steps, "left_s": left}
            | {"success": success, "run_dir": str(run_dir), "kept": None}
        )
    return _pending_left(rows)


STATUS_COLUMNS = ("task", "regime", "seed", "status", "step", "held-out", "left", "node")


def status_cells(row: dict) -> tuple[str, ...]:
    """A study_status row as `study status` and the study screen show it (STATUS_COLUMNS)."""
    step = "" if row["step"] is None else f"{row['step']}/{row['steps']}" if row.get("steps") else str(row["step"])
    return (
        row["task"],
        row["regime"],
        str(row["seed"]),
        row["status"],
        step,
        "" if row["success"] is None else f"{row['success']:.3f}",
        "" if row["status"] in ("kept", "finished") else hours(row.get("left_s")),
        row["node"] or "",
    )


def status_line(rows: list[dict]) -> str:
    """The cells counted by status, and the time the unfinished ones have left in all."""
    counts = {s: sum(r["status"] == s for r in rows) for s in dict.fromkeys(r["status"] for r in rows)}
    unfinished = [r for r in rows if r["status"] not in ("kept", "finished")]
    known = [r["left_s"] for r in unfinished if r.get("left_s") is not None]
    line = ", ".join(f"{n} {s}" for s, n in counts.items())
    if known:
        line += f"; about {hours(sum(known))} of runs left" + (
            f" for {len(known)} of the {len(unfinished)} unfinished" if len(known) < len(unfinished) else ""
        )
        line += (
            " (a started run at its own pace, a pending one at its regime's mean kept wall time,"
            " else its task's; runs at once divide it)"
        )
    return line


def hours(seconds: float | None) -> str:
    """A duration as the study's status shows it: minutes under an hour, else hours."""
    if seconds is None:
        return "?"
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def _pending_left(rows: list[dict]) -> list[dict]:
    """A pending cell's time left: the mean wall time of its regime's complete runs of its task in
    this study, else of its task's (regimes differ: on plan_path_paper one agent with the tool took
    5.1 h where a team took 1.2 h); None while the task has none."""
    by_regime: dict[tuple[str, str], list[float]] = {}
    by_task: dict[str, list[float]] = {}
    for row in rows:
        if row["status"] in ("kept", "finished") and row.get("wall_s"):
            by_regime.setdefault((row["task"], row["regime"]), []).append(row["wall_s"])
            by_task.setdefault(row["task"], []).append(row["wall_s"])
    for row in rows:
        walls = by_regime.get((row["task"], row["regime"])) or by_task.get(row["task"])
        if row["status"] == "pending" and walls:
            row["left_s"] = statistics.fmean(walls)
    return rows


def cell_run_folder(row: dict) -> Path | None:
    """A run folder to open for a status row: the live or finished run's own folder, or, for a run
    kept only in the archive, its store unpacked into the cache (made once)."""
    if row.get("run_dir"):
        return Path(row["run_dir"])
    if not row.get("kept"):
        return None

    kept = Path(row["kept"])
    target = cache_dir() / "study-runs" / hashlib.sha256(str(kept.resolve()).encode()).hexdigest()[:16]
    if not (target / "run.db").is_file():
        target.mkdir(parents=True, exist_ok=True)
        partial = target / "run.db.partial"
        with lzma.open(kept / STORE) as packed, open(partial, "wb") as plain:
            shutil.copyfileobj(packed, plain)
        if (kept / "task.yaml").is_file():
            shutil.copyfile(kept / "task.yaml", target / "task.yaml")
        partial.rename(target / "run.db")  # whole or absent
    return target
