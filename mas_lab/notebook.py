"""A run (or a folder of runs) as pandas tables, for notebooks:

    import mas_lab
    run = mas_lab.load_run("sample_runs/plan_path_learns_smollm2")
    run.metrics[["eval/success_rate", "eval/rule/rows_first"]].dropna()   # one row per step
    run.candidates.query("role == 'planner' and chosen")[["step", "response", "reward", "advantage"]]
    study = mas_lab.load_study("results/reproduce/plan_path")
    study.summary                       # one row per run: regime, seed, success before and after

Every table is read from the run store (store.py holds the SQL); a kept run whose store is
compressed (`run.db.xz`, as results/reproduce/ keeps them) is unpacked into a temporary file.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mas_lab.algo.groups import GroupStats
from mas_lab.analysis.export import records
from mas_lab.analysis.paired import compare_paired, on_common_problems
from mas_lab.records.run_folder import run_folder
from mas_lab.records.store import RunStore, StoreError
from mas_lab.training.metric_names import EVAL_SUCCESS

if TYPE_CHECKING:
    import pandas as pd

# The documented columns of each table (tests check them on a committed sample run).
COLUMNS = {
    "episodes": ["step", "kind", "episode", "problem_id", "problem", "success", "turns", "final_state"],
    "turns": [
        "step",
        "kind",
        "episode",
        "problem_id",
        "turn",
        "role",
        "policy",
        "system",
        "observation",
        "chosen",
        "state_after",
    ],
    "candidates": [
        "step",
        "kind",
        "episode",
        "problem_id",
        "turn",
        "role",
        "policy",
        "candidate",
        "messages",
        "response",
        "reward",
        "team",
        "local",
        "components",
        "advantage",
        "chosen",
        "group_kept",
        "logprobs",
        "prompt_tokens",
        "response_tokens",
        "policy_version",
    ],
    "groups": ["step", *(f.name for f in dataclasses.fields(GroupStats))],  # one owner: the group statistics
    "events": ["ts", "step", "kind", "message"],
}


@dataclass
class RunData:
    """One run's tables. `metrics` is wide (one row per step, a column per metric key, NaN where a
    step did not record it); the others are long (one row per record)."""

    path: Path
    task: dict
    store_file: Path
    _scratch: Any = field(default=None, repr=False)  # the temporary folder of an unpacked store

    def _store(self) -> RunStore:
        return RunStore(self.store_file, create=False)

    def _frame(self, rows: list[dict], name: str) -> "pd.DataFrame":
        # lazy: pandas (~0.3 s), only for tables
        import pandas as pd

        return pd.DataFrame(rows, columns=COLUMNS[name]) if not rows else pd.DataFrame(rows)[COLUMNS[name]]

    def _table(self, read: Callable[[RunStore], list[dict]], name: str) -> "pd.DataFrame":
        store = self._store()
        try:
            return self._frame(read(store), name)
        finally:
            store.close()

    @functools.cached_property
    def metrics(self) -> "pd.DataFrame":
        # lazy: pandas (~0.3 s), only for tables
        import pandas as pd

        store = self._store()
        try:
            by_step = store.metrics()
        finally:
            store.close()
        frame = pd.DataFrame.from_dict(by_step, orient="index").sort_index()
        frame.index.name = "step"
        return frame

    @functools.cached_property
    def episodes(self) -> "pd.DataFrame":
        return self._table(RunStore.episode_table, "episodes")

    @functools.cached_property
    def turns(self) -> "pd.DataFrame":
        return self._table(RunStore.turn_table, "turns")

    @functools.cached_property
    def candidates(self) -> "pd.DataFrame":
        """Training and evaluation candidates with the chat messages each policy saw (export's records)."""
        store = self._store()
        try:
            rows = [
                dict(r, problem=json.loads(r["problem"]), components=json.loads(r["components"]))
                for kind in ("train", "eval")
                for r in records(store, kind)
            ]
        finally:
            store.close()
        return self._frame(rows, "candidates")

    @functools.cached_property
    def groups(self) -> "pd.DataFrame":
        return self._table(RunStore.group_table, "groups")

    @functools.cached_property
    def events(self) -> "pd.DataFrame":
        return self._table(lambda store: store.events(0.0), "events")


def load_run(path: str | Path) -> RunData:
    """A run folder (runs/<run>, a sample run, a kept run with run.db.xz) as tables."""
    folder = Path(path)
    store_file = run_folder(folder) / "run.db"  # a kept run (run.db.xz) is unpacked once, into the cache
    store = RunStore(store_file, create=False)  # StoreError: not a store, or from a newer mas-lab
    try:
        problem = store.integrity_problem()
    finally:
        store.close()
    if problem:  # as status, export, replay and plot refuse it: no table of a damaged store
        raise StoreError(f"{store_file}: damaged ({problem}); nothing was read")
    task_file = folder / "task.yaml"
    try:
        task = yaml.safe_load(task_file.read_text()) if task_file.is_file() else {}
    except yaml.YAMLError as exc:
        raise StoreError(f"{task_file}: not valid YAML ({str(exc).splitlines()[0]})") from None
    return RunData(folder, task if isinstance(task, dict) else {}, store_file)


@dataclass
class StudyData:
    """Every run under a folder (a study, results/reproduce/<family>): `runs` maps each run's path
    relative to the folder to its RunData; `summary` has a row per run."""

    path: Path
    runs: dict[str, RunData]
    damaged: dict[str, str] = field(default_factory=dict)  # run -> why it could not be read

    @functools.cached_property
    def summary(self) -> "pd.DataFrame":
        # lazy: pandas (~0.3 s), only for tables
        import pandas as pd

        rows = []
        for name, run in self.runs.items():
            kept = run.path / "summary.json"
            summary = json.loads(kept.read_text()) if kept.is_file() else {}
            evals = run.metrics[EVAL_SUCCESS].dropna() if EVAL_SUCCESS in run.metrics else None
            rows.append(
                {
                    "run": name,
                    "task": run.task.get("name"),
                    "regime": summary.get("regime"),
                    "seed": summary.get("seed", (run.task.get("train") or {}).get("seed")),
                    "steps": int(run.metrics.index.max()) if len(run.metrics) else 0,
                    "success_before": float(evals.iloc[0]) if evals is not None and len(evals) else None,
                    "success_after": float(evals.iloc[-1]) if evals is not None and len(evals) > 1 else None,
                }
            )
        rows += [{"run": name, "damaged": why} for name, why in self.damaged.items()]
        return pd.DataFrame(rows)


def load_study(path: str | Path) -> StudyData:
    """Every run folder under `path` (one with run.db or run.db.xz), by its relative path. A path
    that does not exist, a file (a study *file*: give the folder its runs are kept in) or a folder
    without a run is an error, not an empty study."""
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"{root}: no such folder")
    if not root.is_dir():
        raise NotADirectoryError(
            f"{root}: a file; load_study takes the folder of a study's runs (its `out`, or results/<study>/<task>)"
        )
    found = sorted({p.parent for pattern in ("**/run.db", "**/run.db.xz") for p in root.glob(pattern)})
    if not found:
        raise FileNotFoundError(f"{root}: no run folder (run.db or run.db.xz) under it")
    runs: dict[str, RunData] = {}
    damaged: dict[str, str] = {}
    for folder in found:  # one damaged run is named, it does not take the study down with it
        name = str(folder.relative_to(root))
        try:
            runs[name] = load_run(folder)
        except (OSError, StoreError, sqlite3.DatabaseError) as exc:
            damaged[name] = str(exc)
    return StudyData(root, runs, damaged)


def final_splits(run: RunData) -> dict[str, dict[str, bool]]:
    """Success per held-out problem at the run's last evaluation (RunStore.eval_outcomes: the first
    sample of each problem, in the evaluation's order), split as the evaluation made them: "main"
    (the evaluation set, the first `train.eval_problems`) and "hard" (the extra hard problems that
    follow it, `train.hard_eval_problems`; mas_lab/training/evaluation.py). One read of the store."""
    store = run._store()
    try:
        steps = store.episode_steps("eval")
        found = list(store.eval_outcomes(steps[-1]).items()) if steps else []
    finally:
        store.close()
    n = int((run.task.get("train") or {}).get("eval_problems") or len(found))
    return {"main": dict(found[:n]), "hard": dict(found[n:])}


def final_outcomes(run: RunData, split: str = "main") -> dict[str, bool]:
    """final_splits' `split`: "main", "hard" or "all" (both). Two runs are compared split by split:
    pooling them would weigh a split by how many problems each has."""
    if split not in ("main", "hard", "all"):
        raise ValueError(f"split: 'main', 'hard' or 'all', not {split!r}")
    splits = final_splits(run)
    return {**splits["main"], **splits["hard"]} if split == "all" else splits[split]


def paired_runs(runs_a, runs_b, split: str = "main"):
    """Runs of one arm against runs of another on the same held-out problems, seed by seed
    (mas_lab/analysis/paired.py): `runs_a` and `runs_b` are run folders or RunData, or lists of them in
    the same seed order. Returns a `Verdict` (its `word`, `evidence()`, `as_dict()`); the final
    evaluations are paired on the problems both evaluated, on the main split or, `split="hard"`, on
    the hard split (final_outcomes)."""

    def listed(runs) -> list[RunData]:
        items = runs if isinstance(runs, (list, tuple)) else [runs]
        return [r if isinstance(r, RunData) else load_run(r) for r in items]

    a_runs, b_runs = listed(runs_a), listed(runs_b)
    if len(a_runs) != len(b_runs):
        raise ValueError(f"paired_runs needs one run of each arm per seed: {len(a_runs)} against {len(b_runs)}")
    pairs = []
    for a, b in zip(a_runs, b_runs):
        x, y = on_common_problems(final_outcomes(a, split), final_outcomes(b, split))
        if not x:
            raise ValueError(
                f"{a.path} and {b.path}: no held-out problem in common on the {split} split "
                "(different seeds or tasks, or no hard split?)"
            )
        pairs.append((x, y))
    return compare_paired(pairs)
