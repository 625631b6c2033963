"""MLflow tracking through MlflowClient with an explicit run id (safe from any thread).

The task file is logged as params (flattened) and as an artifact; per-step metrics in one batch
per step. The default store is a local SQLite file (`sqlite:///mlruns.db`).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path


def resolve_uri(uri: str, base: Path | None = None) -> str:
    """A tracking URI that means the same from any working folder: a relative SQLite or file path
    is made absolute against `base` (default: the working folder)."""
    base = Path(base or Path.cwd())
    for scheme in ("sqlite:///", "file://"):
        if uri.startswith(scheme):
            path = uri[len(scheme):]
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
    key = hashlib.sha256(str(Path(uri[len("sqlite:///"):]).resolve()).encode()).hexdigest()[:16]
    with open(Path(tempfile.gettempdir()) / f"mas-lab-mlflow-{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class Tracker:
    def __init__(self, uri: str, experiment: str, run_name: str, run_id: str | None = None):
        os.environ.setdefault("MLFLOW_ENABLE_ASYNC_LOGGING", "false")
        from mlflow.tracking import MlflowClient

        for name in ("alembic", "mlflow"):
            logging.getLogger(name).setLevel(logging.WARNING)

        self.uri = uri
        with _setup_lock(uri):
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            if run_id is None:
                run_id = self.client.create_run(self.experiment_id, run_name=run_name).info.run_id
            else:
                self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_artifact(self, path: str | Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def log_metrics(self, step: int, metrics: dict[str, float], timestamp: float | None = None) -> None:
        from mlflow.entities import Metric

        now = int((timestamp or time.time()) * 1000)
        items = [Metric(_key(k), float(v), now, step) for k, v in metrics.items()]
        for i in range(0, len(items), 500):
            self.client.log_batch(self.run_id, metrics=items[i : i + 500])

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def sync_from_store(self, store, through_step: int) -> None:
        """Log the store's metrics of every step up to `through_step` not yet in MLflow.

        Called when a checkpoint makes those steps durable: steps after the last checkpoint may be
        rolled back and re-run by a resume, so logging them earlier could log a step twice. The
        run store (which the dashboard reads) is live; MLflow follows at checkpoint granularity.
        A tag records how far MLflow has been fed, so a crash between the two loses nothing."""
        run = self.client.get_run(self.run_id)
        done = int(run.data.tags.get("mas_lab.logged_through_step", "-1"))
        finished = store.step_finish_times()
        for step, metrics in store.metrics().items():
            if done < step <= through_step:
                self.log_metrics(step, metrics, finished.get(step))
        if through_step > done:
            self.set_tag("mas_lab.logged_through_step", str(through_step))

    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def _key(name: str) -> str:
    """MLflow keys allow letters, digits, _ - . / and spaces."""
    return "".join(ch if ch.isalnum() or ch in "_-./ " else "_" for ch in name)
