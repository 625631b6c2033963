"""The run store: one SQLite file per run (runs/<run-id>/run.db), the single source for replay
and the dashboard. Every episode, turn, candidate (prompt, response, token counts, reward
components, advantage, chosen flag), group statistic and per-step metric is written in one
transaction per step, so a step is either all there or absent.
"""

from __future__ import annotations

import array
import dataclasses
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, cast

from mas_lab.algo.groups import ALL_AGENTS, GroupStats

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS steps (step INTEGER PRIMARY KEY, started REAL, finished REAL);
CREATE TABLE IF NOT EXISTS metrics (step INTEGER, key TEXT, value REAL, PRIMARY KEY (step, key));
CREATE TABLE IF NOT EXISTS episodes (
    id INTEGER PRIMARY KEY, step INTEGER, kind TEXT, idx INTEGER, problem_id TEXT, problem TEXT,
    success INTEGER, final_state TEXT, turns INTEGER);
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY, episode_id INTEGER, turn INTEGER, role TEXT, policy TEXT,
    observation TEXT, chosen INTEGER, state_after TEXT, system TEXT);
CREATE TABLE IF NOT EXISTS candidates (
    id INTEGER PRIMARY KEY, turn_id INTEGER, idx INTEGER, prompt_hash TEXT, response TEXT,
    prompt_tokens INTEGER, response_tokens INTEGER, reward REAL, team REAL, local REAL,
    components TEXT, advantage REAL, chosen INTEGER, info TEXT, state_after TEXT, logprobs BLOB,
    policy_version INTEGER);
CREATE TABLE IF NOT EXISTS groups (
    step INTEGER, problem_id TEXT, role TEXT, turn INTEGER, n INTEGER, reward_mean REAL,
    reward_std REAL, reward_min REAL, reward_max REAL, adv_min REAL, adv_max REAL,
    zero_std INTEGER, kept INTEGER);
CREATE TABLE IF NOT EXISTS events (ts REAL, step INTEGER, kind TEXT, message TEXT);
CREATE TABLE IF NOT EXISTS control (id INTEGER PRIMARY KEY, ts REAL, command TEXT, done INTEGER DEFAULT 0);
CREATE INDEX IF NOT EXISTS episodes_step ON episodes (step, kind);
CREATE INDEX IF NOT EXISTS turns_episode ON turns (episode_id);
CREATE INDEX IF NOT EXISTS candidates_turn ON candidates (turn_id);
CREATE INDEX IF NOT EXISTS groups_step ON groups (step);
"""


# PRAGMA user_version. 0: before versioning; 2: candidates.logprobs (the sampler's per-token
# log-probs, float32) and turns.system (the role's system prompt); 3: candidates.policy_version
# (the weight version of the policy that generated the candidate). Older stores are upgraded
# when opened for writing.
SCHEMA_VERSION = 3
# the columns added since the first schema, with the version that added them: older stores are
# upgraded when opened for writing, and read as if upgraded when opened read-only
ADDED_COLUMNS = (
    ("candidates", "logprobs", "BLOB"),  # 2
    ("turns", "system", "TEXT"),  # 2
    ("candidates", "policy_version", "INTEGER"),  # 3
)


def decode_logprobs(blob: bytes | None) -> list[float]:
    """A stored candidate's sampler log-probs (empty for greedy candidates and older stores)."""
    return array.array("f", blob).tolist() if blob else []


class StoreError(Exception):
    """A run store that cannot be used; the message says why."""


class RunStore:
    def __init__(self, path: str | Path, create: bool = True):
        """`create=True`: open (or make) the store for writing. `create=False`: open an existing
        store read-only (status, replay, the dashboard), also on read-only media; it never changes
        the file. A store written by a newer mas-lab is refused either way."""
        self.path = Path(path)
        if not create:
            if not self.path.is_file():
                raise FileNotFoundError(f"{self.path}: no run store")
            try:
                self.db = self._read_only()
                self._check_version()
                meta = self.db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
            except sqlite3.DatabaseError as exc:  # truncated, or not SQLite at all
                raise StoreError(f"{self.path}: damaged or not a run store ({exc})") from None
            if not meta:
                self.db.close()
                raise StoreError(f"{self.path}: not a mas-lab run store (it has no meta table)")
            self._read_as_current()
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            self._create_atomically()
        self.db = sqlite3.connect(self.path, check_same_thread=False, timeout=10)
        self._check_version()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a committed step survives a power loss
        self.db.executescript(SCHEMA)
        for table, column, kind in ADDED_COLUMNS:
            if column not in {row[1] for row in self.db.execute(f"PRAGMA table_info({table})")}:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self.db.commit()

    def integrity_problem(self) -> str | None:
        """What SQLite's quick check finds wrong with the file (a damaged page, a truncated file),
        or None. Commands run it before they read or change a store, so a damaged one is refused
        in one line before anything is changed."""
        try:
            rows = self.db.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            return str(exc)
        return None if rows == [("ok",)] else "; ".join(str(r[0]) for r in rows[:3])

    def _create_atomically(self) -> None:
        """Build the schema in a private file, then link it into place: a reader (the dashboard, `mas-lab
        status`) that finds run.db always finds every table. sqlite would otherwise create an empty
        run.db at connect and the tables a moment later, and a reader polling in between failed
        with 'no such table'. os.link never replaces a file, so of two concurrent creators one wins
        and the other opens the winner's store."""
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}.new")
        staging.unlink(missing_ok=True)
        try:
            db = sqlite3.connect(staging)
            db.executescript(SCHEMA)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.commit()
            db.close()
            try:
                os.link(staging, self.path)
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links: a rename, which could replace a racer's store
                if not self.path.exists():
                    os.replace(staging, self.path)
        finally:
            staging.unlink(missing_ok=True)

    def _read_only(self) -> sqlite3.Connection:
        uri = f"file:{self.path.resolve()}?mode=ro"
        db = sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=10)
        try:
            db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return db
        except sqlite3.OperationalError:  # a WAL store on read-only media: no -shm can be made
            db.close()
            return sqlite3.connect(uri + "&immutable=1", uri=True, check_same_thread=False, timeout=10)

    def _read_as_current(self) -> None:
        """An older store opened read-only reads as the current schema: a table that lacks a column
        added since (ADDED_COLUMNS) is shadowed by a TEMP view of it with that column NULL (SQLite
        looks up temp objects first; the file is not touched), so every reader's query works on
        every store an older mas-lab wrote."""
        missing: dict[str, list[str]] = {}
        for table, column, _ in ADDED_COLUMNS:
            if column not in {row[1] for row in self.db.execute(f"PRAGMA main.table_info({table})")}:
                missing.setdefault(table, []).append(column)
        for table, columns in missing.items():
            extra = ", ".join(f"NULL AS {column}" for column in columns)
            self.db.execute(f"CREATE TEMP VIEW {table} AS SELECT *, {extra} FROM main.{table}")

    def _check_version(self) -> None:
        (version,) = self.db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            self.db.close()
            raise StoreError(
                f"{self.path}: written by a newer mas-lab (store schema {version}, this one reads "
                f"up to {SCHEMA_VERSION}); upgrade mas-lab to open it"
            )

    @staticmethod
    def copy(source: Path, target: Path) -> None:
        """A consistent copy of the store at `source` into a new file `target`, whatever the
        journal mode (SQLite's online backup), without opening it as a RunStore (no migration,
        no lock): what a study keeps of a finished run."""
        src, dst = sqlite3.connect(source), sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
            src.close()

    def checkpoint_wal(self, mode: str = "PASSIVE") -> None:
        """Move committed steps from run.db-wal into run.db (after every step), so the main file
        alone holds the finished steps. PASSIVE never waits for a reader (the dashboard); frames a
        reader still needs move at the next step; TRUNCATE (at the end of a run) waits."""
        self.db.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()

    def finish(self) -> None:
        """At the end of a run: everything into run.db and back to a rollback journal, so readers
        (and copies, e.g. sample runs) need no -wal or -shm file. Skipped while a reader is open."""
        self.checkpoint_wal("TRUNCATE")
        try:
            self.db.execute("PRAGMA journal_mode=DELETE").fetchone()
        except sqlite3.OperationalError:
            pass

    def digest(self, through_step: int) -> dict[str, Any]:
        """What the store holds up to a step: recorded in each checkpoint, compared on resume."""
        count = lambda query: self.db.execute(query, (through_step,)).fetchone()[0]  # noqa: E731
        turns = "SELECT id FROM turns WHERE episode_id IN (SELECT id FROM episodes WHERE step <= ?)"
        return {
            "steps": [
                s for (s,) in self.db.execute("SELECT step FROM steps WHERE step <= ? ORDER BY step", (through_step,))
            ],
            "episodes": count("SELECT COUNT(*) FROM episodes WHERE step <= ?"),
            "candidates": self.db.execute(
                f"SELECT COUNT(*) FROM candidates WHERE turn_id IN ({turns})", (through_step,)
            ).fetchone()[0],
            "groups": count("SELECT COUNT(*) FROM groups WHERE step <= ?"),
            "metrics": count("SELECT COUNT(*) FROM metrics WHERE step <= ?"),
            "run_id": self.meta().get("run_id"),
        }

    # --- writing -------------------------------------------------------------------------------
    def set_meta(self, **values: Any) -> None:
        with self.db:
            self.db.executemany(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in values.items()]
            )

    def event(self, step: int, kind: str, message: str) -> None:
        with self.db:
            self.db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (time.time(), step, kind, message))

    # --- control requests (the control API's queue) --------------------------------------------
    def add_control(self, command: str) -> None:
        with self.db:
            self.db.execute("INSERT INTO control (ts, command) VALUES (?, ?)", (time.time(), command))

    def pending_controls(self) -> list[str]:
        return [c for (c,) in self.db.execute("SELECT command FROM control WHERE done = 0 ORDER BY id")]

    def take_controls(self) -> list[str]:
        """Pending requests in order, marked as served in the same transaction."""
        with self.db:
            rows = self.db.execute("SELECT id, command FROM control WHERE done = 0 ORDER BY id").fetchall()
            self.db.executemany("UPDATE control SET done = 1 WHERE id = ?", [(i,) for i, _ in rows])
        return [command for _, command in rows]

    def write_step(
        self,
        step: int,
        started: float,
        episodes: Iterable,
        kind: str,
        groups: list[GroupStats] | None = None,
        metrics: dict[str, float] | None = None,
    ) -> None:
        """Write one step's episodes (train or eval), group stats and metrics in one transaction.
        Episodes are plain records: their final state and success were recorded by the rollout."""
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?)", (step, started, time.time()))
            for episode in episodes:
                self._write_episode(step, kind, episode)
            self.db.executemany(
                f"INSERT INTO groups VALUES ({','.join('?' * (1 + len(dataclasses.fields(GroupStats))))})",
                [(step, *dataclasses.astuple(g)) for g in groups or []],
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO metrics VALUES (?, ?, ?)",
                [(step, k, float(v)) for k, v in (metrics or {}).items()],
            )
        self.checkpoint_wal()

    def _write_episode(self, step: int, kind: str, episode) -> None:
        cur = self.db.execute(
            "INSERT INTO episodes (step, kind, idx, problem_id, problem, success, final_state, turns) VALUES (?,?,?,?,?,?,?,?)",
            (
                step,
                kind,
                episode.index,
                episode.problem.id,
                json.dumps(episode.problem.data),
                int(episode.success),
                episode.final_state,
                len({t.turn for t in episode.turns}),
            ),
        )
        episode_id = cur.lastrowid
        for turn in episode.turns:
            cur = self.db.execute(
                "INSERT INTO turns (episode_id, turn, role, policy, observation, chosen, state_after, system)"
                " VALUES (?,?,?,?,?,?,?,?)",
                (
                    episode_id,
                    turn.turn,
                    turn.role,
                    turn.policy,
                    turn.observation,
                    turn.chosen,
                    turn.state_after,
                    turn.system,
                ),
            )
            turn_id = cur.lastrowid
            self.db.executemany(
                "INSERT INTO candidates (turn_id, idx, prompt_hash, response, prompt_tokens, response_tokens, reward, team,"
                " local, components, advantage, chosen, info, state_after, logprobs, policy_version)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                [
                    (
                        turn_id,
                        c.index,
                        c.prompt_hash,
                        c.response,
                        len(c.prompt_ids),
                        len(c.response_ids),
                        c.reward,
                        c.team,
                        c.local,
                        json.dumps(c.components),
                        c.advantage,
                        int(c.chosen),
                        c.info,
                        c.state_after,
                        array.array("f", c.logprobs).tobytes() if c.logprobs else None,
                        c.version,
                    )
                    for c in turn.candidates
                ],
            )

    def rollback(self, after_step: int) -> int:
        """Delete every row of steps after `after_step` (a step written after the checkpoint that
        a resume restarts from), so that no step appears twice or half. Returns rows deleted."""
        with self.db:
            ids = "SELECT id FROM episodes WHERE step > ?"
            turn_ids = f"SELECT id FROM turns WHERE episode_id IN ({ids})"
            deleted = 0
            for query in (
                f"DELETE FROM candidates WHERE turn_id IN ({turn_ids})",
                f"DELETE FROM turns WHERE episode_id IN ({ids})",
                "DELETE FROM episodes WHERE step > ?",
                "DELETE FROM groups WHERE step > ?",
                "DELETE FROM metrics WHERE step > ?",
                "DELETE FROM steps WHERE step > ?",
            ):
                deleted += self.db.execute(query, (after_step,)).rowcount
        return deleted

    # --- reading -------------------------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM meta")}

    def metrics(self, step: int | None = None) -> dict[int, dict[str, float]]:
        query, args = "SELECT step, key, value FROM metrics", cast(tuple, ())
        if step is not None:
            query, args = query + " WHERE step = ?", (step,)
        out: dict[int, dict[str, float]] = {}
        for s, key, value in self.db.execute(query + " ORDER BY step", args):
            out.setdefault(s, {})[key] = value
        return out

    def step_finish_times(self) -> dict[int, float]:
        return dict(self.db.execute("SELECT step, finished FROM steps"))

    def time_span(self) -> tuple[float | None, float | None]:
        """When the first step started and the last one finished."""
        first, last = self.db.execute("SELECT MIN(started), MAX(finished) FROM steps").fetchone()
        return first, last

    def first_step(self, kind: str = "train") -> int | None:
        (step,) = self.db.execute("SELECT MIN(step) FROM episodes WHERE kind = ?", (kind,)).fetchone()
        return step

    def rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        """Rows of a read query as dicts (tests and benchmarks inspect the store with it)."""
        cur = self.db.execute(query, args)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]

    def episode(self, step: int, index: int, kind: str = "train") -> dict[str, Any] | None:
        """One episode with its turns and their candidates, for replay."""
        found = self.rows("SELECT * FROM episodes WHERE step = ? AND idx = ? AND kind = ?", step, index, kind)
        if not found:
            return None
        episode = found[0]
        episode["turns"] = self.rows("SELECT * FROM turns WHERE episode_id = ? ORDER BY id", episode["id"])
        for turn in episode["turns"]:
            turn["candidates"] = self.rows("SELECT * FROM candidates WHERE turn_id = ? ORDER BY idx", turn["id"])
            for c in turn["candidates"]:
                c["components"] = json.loads(c["components"])
                c["logprobs"] = decode_logprobs(c.get("logprobs"))
        return episode

    # --- views for replay and the dashboard (each loads one step or one episode: lazy by design) --
    def steps(self) -> list[int]:
        return [s for (s,) in self.db.execute("SELECT step FROM steps ORDER BY step")]

    def eval_outcomes(self, step: int) -> dict[str, bool]:
        """Held-out success by problem id at one evaluation: the first sampled trajectory of each
        problem (the only one of a greedy evaluation), for paired comparisons."""
        out: dict[str, bool] = {}
        for problem_id, success in self.db.execute(
            "SELECT problem_id, success FROM episodes WHERE kind = 'eval' AND step = ? ORDER BY idx", (step,)
        ):
            out.setdefault(problem_id, bool(success))
        return out

    def episode_steps(self, kind: str = "train") -> list[int]:
        """Steps that have episodes of `kind` (train, or eval)."""
        return [
            s for (s,) in self.db.execute("SELECT DISTINCT step FROM episodes WHERE kind = ? ORDER BY step", (kind,))
        ]

    def step_replies(self, step: int, kind: str = "eval") -> list[tuple[int, int, str, int, str]]:
        """Every candidate's reply of one step's episodes of `kind`, as (episode, turn, role,
        candidate, response) in that order."""
        return list(
            self.db.execute(
                "SELECT e.idx, t.turn, t.role, c.idx, c.response FROM episodes e JOIN turns t ON t.episode_id = e.id"
                " JOIN candidates c ON c.turn_id = t.id WHERE e.step = ? AND e.kind = ?"
                " ORDER BY e.idx, t.turn, t.role, c.idx",
                (step, kind),
            )
        )

    def chosen_replies(self, step: int, kind: str = "eval") -> list[tuple[int, int, str, str]]:
        """The chosen candidate's reply of every turn of one step's episodes of `kind`, as (episode,
        turn, role, response), each episode's turns in the order they were played."""
        return list(
            self.db.execute(
                "SELECT e.idx, t.turn, t.role, c.response FROM episodes e JOIN turns t ON t.episode_id = e.id"
                " JOIN candidates c ON c.turn_id = t.id AND c.idx = t.chosen WHERE e.step = ? AND e.kind = ?"
                " ORDER BY e.idx, t.id",
                (step, kind),
            )
        )

    def trained_lengths(self) -> list[tuple[int, str, str, str, int, int]]:
        """Every candidate of a kept group of a training step (the samples the learner trained), as
        (step, policy, role, prompt hash, prompt tokens, response tokens)."""
        return list(
            self.db.execute(
                "SELECT e.step, t.policy, t.role, c.prompt_hash, c.prompt_tokens, c.response_tokens FROM candidates c"
                " JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id"
                " JOIN groups g ON g.step = e.step AND g.problem_id = e.problem_id AND g.role = t.role"
                " AND g.turn = t.turn WHERE e.kind = 'train' AND g.kept = 1"
            )
        )

    def series(self, key: str) -> list[tuple[int, float]]:
        return list(self.db.execute("SELECT step, value FROM metrics WHERE key = ? ORDER BY step", (key,)))

    def metric_keys(self) -> list[str]:
        return [k for (k,) in self.db.execute("SELECT DISTINCT key FROM metrics ORDER BY key")]

    def events(self, after_ts: float = 0.0) -> list[dict[str, Any]]:
        return self.rows("SELECT ts, step, kind, message FROM events WHERE ts > ? ORDER BY ts", after_ts)

    # --- whole tables, for the notebook API (mas_lab/notebook.py) ------------------------------
    def episode_table(self) -> list[dict[str, Any]]:
        """Every episode: step, kind, index, problem (parsed), success, turns, final state."""
        rows = self.rows(
            "SELECT step, kind, idx AS episode, problem_id, problem, success, turns, final_state FROM"
            " episodes ORDER BY step, kind, idx"
        )
        for row in rows:
            row["problem"], row["success"] = json.loads(row["problem"]), bool(row["success"])
        return rows

    def turn_table(self) -> list[dict[str, Any]]:
        """Every (turn, agent) of every episode: its observation, the chosen candidate, the state after."""
        return self.rows(
            "SELECT e.step, e.kind, e.idx AS episode, e.problem_id, t.turn, t.role, t.policy, t.system, t.observation,"
            " t.chosen, t.state_after FROM turns t JOIN episodes e ON t.episode_id = e.id ORDER BY e.step, e.kind,"
            " e.idx, t.id"
        )

    def group_table(self) -> list[dict[str, Any]]:
        """Every group's statistics, with its step."""
        rows = self.rows("SELECT * FROM groups ORDER BY step, problem_id, turn, role")
        for row in rows:
            row["zero_std"], row["kept"] = bool(row["zero_std"]), bool(row["kept"])
        return rows

    def groups(self, step: int) -> list[GroupStats]:
        names = ", ".join(f.name for f in dataclasses.fields(GroupStats))
        found = self.db.execute(f"SELECT {names} FROM groups WHERE step = ? ORDER BY problem_id, turn, role", (step,))
        fields = [f.name for f in dataclasses.fields(GroupStats)]
        return [
            GroupStats(**{**dict(zip(fields, row)), "zero_std": bool(row[-2]), "kept": bool(row[-1])}) for row in found
        ]

    def group_aggregate(self) -> list[dict[str, Any]]:
        """Per (agent, turn) over all steps: how many groups, their mean reward and zero-std share,
        first and last step, so one sees which role at which turn stops carrying signal."""
        return self.rows(
            "SELECT role, turn, COUNT(*) AS groups, AVG(reward_mean) AS reward_mean, AVG(reward_std) AS reward_std,"
            " AVG(zero_std) AS zero_std_frac, MIN(step) AS first_step, MAX(step) AS last_step"
            " FROM groups GROUP BY role, turn ORDER BY turn, role"
        )

    def group_candidates(self, step: int, problem_id: str, role: str, turn: int) -> list[dict[str, Any]]:
        """The candidates of one group (for a trajectory group, every action of its trajectories)."""
        query = (
            "SELECT e.idx AS episode, t.turn, t.role, c.* FROM candidates c JOIN turns t ON c.turn_id = t.id"
            " JOIN episodes e ON t.episode_id = e.id WHERE e.step = ? AND e.kind = 'train' AND e.problem_id = ?"
        )
        args: list[Any] = [step, problem_id]
        if role != ALL_AGENTS:
            query += " AND t.role = ? AND t.turn = ?"
            args += [role, turn]
        return self.rows(query + " ORDER BY e.idx, t.id, c.idx", *args)

    def episode_indices(self, step: int, kind: str = "train") -> list[int]:
        return [
            i
            for (i,) in self.db.execute(
                "SELECT idx FROM episodes WHERE step = ? AND kind = ? ORDER BY idx", (step, kind)
            )
        ]

    def turn_location(self, turn_id: int) -> tuple[int, int] | None:
        """(step, episode index) of a stored turn row."""
        return self.db.execute(
            "SELECT e.step, e.idx FROM turns t JOIN episodes e ON t.episode_id = e.id WHERE t.id = ?", (turn_id,)
        ).fetchone()

    def next_zero_std_turn(self, after_turn_id: int) -> int | None:
        """The first training turn row after `after_turn_id` that belongs to a zero-std group (as the
        groups table records it: a (problem, agent, turn) group, or a whole trajectory group)."""
        found = self.db.execute(
            "SELECT t.id FROM turns t JOIN episodes e ON t.episode_id = e.id JOIN groups g ON g.step = e.step"
            " AND g.problem_id = e.problem_id AND (g.role = ? OR (g.role = t.role AND g.turn = t.turn))"
            " WHERE e.kind = 'train' AND t.id > ? AND g.zero_std = 1 ORDER BY t.id LIMIT 1",
            (ALL_AGENTS, after_turn_id),
        ).fetchone()
        return found[0] if found else None

    def candidate_records(
        self,
        kind: str = "train",
        first_step: int | None = None,
        last_step: int | None = None,
        chosen_only: bool = False,
    ) -> Iterator[dict[str, Any]]:
        """Every stored candidate with its episode and turn, step by step (one query, streamed):
        for export. Columns of older stores (schema 2: logprobs, system; 3: policy_version) come back empty."""
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(turns)")}
        system_column = "t.system" if "system" in columns else "NULL"
        candidate_columns = {row[1] for row in self.db.execute("PRAGMA table_info(candidates)")}
        logprob_column = "c.logprobs" if "logprobs" in candidate_columns else "NULL"
        version_column = "c.policy_version" if "policy_version" in candidate_columns else "NULL"
        query = (
            f"SELECT e.step, e.kind, e.idx AS episode, e.problem_id, e.problem, e.success AS episode_success, t.turn,"
            f" t.role, t.policy, {system_column} AS system, t.observation, c.idx AS candidate, c.response, c.prompt_tokens,"
            f" c.response_tokens, c.reward, c.team, c.local, c.components, c.advantage, c.chosen, c.info,"
            f" {logprob_column} AS logprobs, {version_column} AS policy_version, g.kept AS group_kept"
            " FROM candidates c JOIN turns t ON c.turn_id = t.id JOIN episodes e ON t.episode_id = e.id"
            " LEFT JOIN groups g ON e.kind = 'train' AND g.step = e.step AND g.problem_id = e.problem_id"
            " AND ((g.role = t.role AND g.turn IN (t.turn, -1)) OR (g.role = '*' AND g.turn = -1))"
            " WHERE e.kind = ? AND e.step BETWEEN ? AND ?"
            + (" AND c.chosen = 1" if chosen_only else "")
            + " ORDER BY e.step, e.idx, t.id, c.idx"
        )
        cursor = self.db.execute(
            query, (kind, -1 if first_step is None else first_step, 2**62 if last_step is None else last_step)
        )
        names = [d[0] for d in cursor.description]
        for row in cursor:
            record = dict(zip(names, row))
            record["problem"] = json.loads(record["problem"])
            record["components"] = json.loads(record["components"])
            record["logprobs"] = decode_logprobs(record["logprobs"])
            record["chosen"], record["episode_success"] = bool(record["chosen"]), bool(record["episode_success"])
            record["system"] = record["system"] or ""
            record["group_kept"] = None if record["group_kept"] is None else bool(record["group_kept"])
            yield record

    def search(self, text: str, kind: str = "train") -> list[dict[str, Any]]:
        """(step, episode, turn row) of every turn whose observation or a candidate mentions `text`."""
        like = f"%{text}%"
        return self.rows(
            "SELECT DISTINCT e.step, e.idx AS episode, t.id AS turn_id FROM turns t JOIN episodes e ON t.episode_id = e.id"
            " LEFT JOIN candidates c ON c.turn_id = t.id WHERE e.kind = ? AND (t.observation LIKE ? OR c.response LIKE ?)"
            " ORDER BY e.step, e.idx, t.id",
            kind,
            like,
            like,
        )

    def close(self) -> None:
        self.db.close()
