"""MLflow tracking through MlflowClient with an explicit run id (safe from any thread).

The task file is logged as params (flattened) and as an artifact; per-step metrics in one batch
per step. The default store is a local SQLite file (`sqlite:///mlruns.db`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import yaml

from mas_lab.analysis.plots import plot_run
from mas_lab.config import TaskConfig, flat_params, stored_task_data
from mas_lab.records.store import RunStore


def resolve_uri(uri: str, base: Path | None = None) -> str:
    """A tracking URI that means the same from any working folder: a relative SQLite or file path
    is made absolute against `base` (default: the working folder)."""
    base = Path(base or Path.cwd())
    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme):
            path = uri[len(scheme) :]
            if path and not path.startswith("/") and path != ":memory:":
                return scheme + str((base / path).resolve())
    if "://" not in uri and not uri.startswith("/"):
        return str((base / uri).resolve())
    return uri


@contextlib.contextmanager
def _setup_lock(uri: str):
    """One process at a time sets up a local SQLite store: MLflow creates its tables and the
    experiment on first use, and two runs starting together against a fresh file both try to
    ("table experiment_tags already exists"). The lock file lives in the temp folder, keyed by
    the store's path, so nothing is left beside the store."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    key = hashlib.sha256(str(Path(uri[len("sqlite:///") :]).resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"mas-lab-mlflow-{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class TrackingError(OSError):
    """The MLflow store could not be written (a full disk, a lost mount, a locked or damaged
    file). An OSError, so every caller that reports a full disk in one line reports this too;
    MLflow's own exception came after a 55-line SQLAlchemy traceback it logs itself."""


def _writes(method):
    """Turn MLflow's exception for a store that could not be written (its cause an OS or
    database error) into a TrackingError naming the store; other MLflow errors pass unchanged."""

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        # lazy: mlflow (~1.5 s), only in a tracked run
        from mlflow.exceptions import MlflowException

        try:
            return method(self, *args, **kwargs)
        except MlflowException as exc:
            cause = exc.__cause__
            if not (isinstance(cause, OSError) or type(cause).__module__.startswith(("sqlalchemy", "sqlite3"))):
                raise
            first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
            raise TrackingError(f"the MLflow store {self.uri} could not be written: {first}") from exc

    return wrapped


class Tracker:
    def __init__(
        self,
        uri: str,
        experiment: str,
        run_name: str,
        run_id: str | None = None,
        artifact_location: str | None = None,
        tags: dict[str, str] | None = None,
    ):
        """A new MLflow run (or the run `run_id`, continued); `tags` on a new run, among them
        mlflow.parentRunId to nest it under a study's parent run (MLflow's sweep convention)."""
        os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
        # the completions tables append through a download: no progress bar on the run's console
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        # lazy: mlflow (~1.5 s), only in a tracked run
        from mlflow.tracking import MlflowClient

        for name in ("alembic", "mlflow"):
            logging.getLogger(name).setLevel(logging.WARNING)
        # it logs a full traceback before raising the error a TrackingError reports in one line
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)

        self.uri = uri
        with _setup_lock(uri):
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = (
                found.experiment_id
                if found
                else self.client.create_experiment(experiment, artifact_location=artifact_location)
            )
            if run_id is None:
                run_id = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags).info.run_id
            else:
                self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    @_writes
    def log_params(self, params: dict[str, str]) -> None:
        # lazy: mlflow (~1.5 s), only in a tracked run
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    @_writes
    def log_artifact(self, path: str | Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    @_writes
    def log_metrics(self, step: int, metrics: dict[str, float], timestamp: float | None = None) -> None:
        # lazy: mlflow (~1.5 s), only in a tracked run
        from mlflow.entities import Metric

        now = int((timestamp or time.time()) * 1000)
        items = [Metric(_key(k), float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i : i + 500])

    @_writes
    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    @_writes
    def sync_from_store(self, store, through_step: int) -> None:
        """Log the store's metrics of every step up to `through_step` not yet in MLflow.

        Called when a checkpoint makes those steps durable: steps after the last checkpoint may be
        rolled back and re-run by a resume, so logging them earlier could log a step twice. The
        run store (which the dashboard reads) is live; MLflow follows at checkpoint granularity.
        A tag records how far MLflow has been fed, so a crash between the two loses nothing."""
        run = self.client.get_run(self.run_id)
        done = int(run.data.tags.get("mas_lab.logged_through_step", "-1"))
        finished = store.step_finish_times()
        metrics = store.metrics()
        steps = [step for step in metrics if done < step <= through_step]
        for step in steps:
            self.log_metrics(step, metrics[step], finished.get(step))
        self.log_completions(store, steps)
        if through_step > done:
            self.set_tag("mas_lab.logged_through_step", str(through_step))

    @_writes
    def log_completions(self, store, steps: list[int], episodes: int = 16, problems: int = 4) -> None:
        """What the team said, as two MLflow tables that grow by rows, one row set per step (the
        UI's artifact view, and `mlflow.load_table("completions/train.json", extra_columns=
        ["run_id"])` across runs): `completions/eval.json`, at each evaluation every turn of the
        first `episodes` held-out episodes with each agent's chosen reply, rewards and success;
        `completions/train.json`, at each training step the best and the worst candidate of each
        (agent, turn) group of the first `problems` problems.

        Two fixed table names keep the run tag that MLflow lists tables in
        (`mlflow.loggedArtifacts`, cut at 8,000 characters by the SQL store) at two entries: a
        table per step grew it until the cut JSON failed to parse at step ~83."""
        # lazy: pandas (~0.3 s), only for tables
        import pandas as pd

        eval_rows: list[dict] = []
        train_rows: list[dict] = []
        for step in steps:
            evals = [
                r for r in store.candidate_records("eval", step, step, chosen_only=True) if r["episode"] < episodes
            ]
            eval_rows += _completion_rows(evals)
            train_rows += _best_and_worst(list(store.candidate_records("train", step, step)), problems)
        if not eval_rows and not train_rows:
            return
        self._repair_table_tag()
        if eval_rows:
            self.client.log_table(self.run_id, pd.DataFrame(eval_rows), EVAL_TABLE)
        if train_rows:
            self.client.log_table(self.run_id, pd.DataFrame(train_rows), TRAIN_TABLE)

    def _repair_table_tag(self) -> None:
        """A run logged by an older mas-lab (a table per step) may hold a tag the SQL store cut
        mid-JSON; MLflow's next table would fail to parse it. Keep the entries that parse and
        drop the older per-step ones, whose files stay in the run's artifacts."""
        value = self.client.get_run(self.run_id).data.tags.get(TABLES_TAG)
        if value is None:
            return
        try:
            entries = json.loads(value)
        except json.JSONDecodeError:
            entries = None
        if isinstance(entries, list) and len(value) < 4000:
            return
        kept = [e for e in entries or [] if isinstance(e, dict) and e.get("path") in (EVAL_TABLE, TRAIN_TABLE)]
        self.set_tag(TABLES_TAG, json.dumps(kept))

    @_writes
    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


TABLES_TAG = "mlflow.loggedArtifacts"
EVAL_TABLE = "completions/eval.json"
TRAIN_TABLE = "completions/train.json"


def _best_and_worst(train: list[dict], problems: int) -> list[dict]:
    """The best and the worst candidate of each (episode, role, turn) group of the first
    `problems` problems of one training step, as table rows with a `which` column."""
    chosen_problems = list(dict.fromkeys(r["problem_id"] for r in train))[:problems]
    rows = []
    for problem in chosen_problems:
        by_group: dict[tuple, list[dict]] = {}
        for r in (r for r in train if r["problem_id"] == problem):
            by_group.setdefault((r["episode"], r["role"], r["turn"]), []).append(r)
        for members in by_group.values():
            ranked = sorted(members, key=lambda r: r["reward"])
            for record, which in ((ranked[-1], "best"), (ranked[0], "worst")):
                rows += [{"which": which} | row for row in _completion_rows([record])]
    return rows


def _completion_rows(records: list[dict]) -> list[dict]:
    keep = (
        "step",
        "episode",
        "problem_id",
        "turn",
        "role",
        "response",
        "reward",
        "team",
        "local",
        "advantage",
        "chosen",
        "episode_success",
    )
    return [{k: r.get(k) for k in keep} | {"observation": (r.get("observation") or "")[-2000:]} for r in records]


def rebuild(run_dir: Path, target: Path) -> str:
    """An MLflow store for a run folder that does not carry one (copied, shipped, downloaded: its
    recorded tracking store is on another machine), written from the run store alone: the task as
    params and artifact, every step's metrics, the completions tables and the charts. Returns its
    URI. Made once per run folder; later calls reuse it."""
    target.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{(target / 'mlruns.db').resolve()}"
    done = target / "rebuilt"
    if done.is_file():
        return uri
    store = RunStore(run_dir / "run.db", create=False)
    try:
        tracker = Tracker(
            uri,
            "mas-lab (rebuilt from run stores)",
            run_dir.name,
            artifact_location=str((target / "artifacts").resolve()),
        )
        task_file = run_dir / "task.yaml"
        if task_file.is_file():
            task = TaskConfig.model_validate(stored_task_data(yaml.safe_load(task_file.read_text())))
            tracker.log_params(flat_params(task))
            tracker.log_artifact(task_file)
        tracker.set_tag("mas_lab.rebuilt_from", str(run_dir.resolve()))
        last = max(store.metrics(), default=-1)
        tracker.sync_from_store(store, last)

        charts = target / "charts"
        for path in plot_run(run_dir, charts):
            tracker.client.log_artifact(tracker.run_id, str(path), "charts")
        ended = str(store.meta().get("status", "finished"))
        tracker.finish({"finished": "FINISHED", "stopped": "KILLED", "killed": "KILLED"}.get(ended, "FAILED"))
    finally:
        store.close()
    done.write_text(uri)
    return uri


def _key(name: str) -> str:
    """MLflow keys allow letters, digits, _ - . / and spaces."""
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in name)
