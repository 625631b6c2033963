"""Every store an older mas-lab wrote opens in every reader (issue: `load_run("sample_runs/toy").turns`
raised `no such column: t.system`). The shipped sample runs hold every past schema version (0, 2
and 3; there was no 1): each reader runs on each of them, without changing the file."""

import hashlib
import sqlite3
from pathlib import Path

import pytest
from conftest import ROOT

from mas_lab.records.store import SCHEMA_VERSION, RunStore

SAMPLES = sorted(p.parent for p in (ROOT / "sample_runs").glob("*/run.db"))


def _version(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


def test_the_sample_runs_cover_every_past_schema_version():
    assert {_version(p / "run.db") for p in SAMPLES} == {0, 2, SCHEMA_VERSION}


@pytest.mark.parametrize("run_dir", SAMPLES, ids=[p.name for p in SAMPLES])
def test_every_reader_opens_a_store_of_every_schema_version(run_dir):
    import mas_lab
    from mas_lab.analysis.export import records
    from mas_lab.analysis.plots import panel_series
    from mas_lab.records.episode_text import format_episode

    before = hashlib.sha256((run_dir / "run.db").read_bytes()).hexdigest()
    run = mas_lab.load_run(run_dir)
    for table in ("metrics", "episodes", "turns", "candidates", "groups", "events"):
        assert len(getattr(run, table)) > 0 or table == "events", table
    assert "system" in run.turns.columns and "policy_version" in run.candidates.columns
    store = RunStore(run_dir / "run.db", create=False)
    try:
        step = store.episode_steps("train")[0]
        assert format_episode(store.episode(step, 0)).strip()
        first = next(records(store, "train"))
        assert {"messages", "logprobs", "policy_version"} <= first.keys()
        assert panel_series(store)
        assert store.turn_table() and store.eval_outcomes(store.episode_steps("eval")[-1])
    finally:
        store.close()
    assert hashlib.sha256((run_dir / "run.db").read_bytes()).hexdigest() == before  # read-only: untouched
