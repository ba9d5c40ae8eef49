"""The run store: the one owner of a workspace's ``runs.sqlite``, artifacts on disk beside it.

Every table lives in one schema, built by ``MIGRATIONS``:

- optimize runs: ``runs`` (config and the latest resumable state), ``plans``, ``steps`` (with the
  routing decision), ``llm_calls`` (prompt, answer, usage) and ``candidates`` (program path and
  verdict summary); programs, verdicts and profiles are files under ``runs/<id>/``;
- benches: ``benches`` and ``bench_tasks`` (read and written by ``bench.store.BenchStore``);
- training: ``train_runs`` and ``train_metrics`` (``TrainLog``).

Migrations: ``PRAGMA user_version`` holds how many steps of ``MIGRATIONS`` a database has had.
Opening one applies the missing steps in order, each in its own write transaction that also
bumps the version, so a database written by an older stitchcuda is upgraded in place with its
rows kept, and two processes opening it at once apply each step once. Step 1 is the layout the
three former owners of this file wrote (``CREATE ... IF NOT EXISTS``, so their databases, at
version 0, are adopted as they are). A change of schema is a new step at the end, never an edit
of an old one.

Locking: every connection comes from ``connect``. WAL lets readers (``stitchcuda runs``, a
report) read while a bench or a training run writes; a writer waits up to ``BUSY_TIMEOUT_S`` for
another process's commit instead of failing; within a process one connection is shared by
threads under one lock. Every write commits at once: a killed run loses at most the step in flight.

The store imports nothing above ``stitchcuda.records``: it keeps records it is handed as JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from stitchcuda.records import Plan, RunState, SampleOutcome, StepRecord

DB_NAME = "runs.sqlite"
# a bench's parallel tasks, a training run's metrics and a reader may all touch the file at once;
# a commit takes milliseconds, so a minute only runs out when another process hangs mid-write
BUSY_TIMEOUT_S = 60.0

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 1: the layout of the three modules that each used to open this file (runs, benches, training)
    (
        """CREATE TABLE IF NOT EXISTS runs (
            id TEXT PRIMARY KEY, task TEXT NOT NULL, task_sha256 TEXT NOT NULL, status TEXT NOT NULL,
            created REAL NOT NULL, updated REAL NOT NULL, config TEXT NOT NULL, state TEXT NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS plans (
            run_id TEXT NOT NULL, version INTEGER NOT NULL, plan TEXT NOT NULL, created REAL NOT NULL,
            PRIMARY KEY (run_id, version))""",
        """CREATE TABLE IF NOT EXISTS steps (
            run_id TEXT NOT NULL, idx INTEGER NOT NULL, subtask INTEGER NOT NULL, skill TEXT NOT NULL,
            record TEXT NOT NULL, action TEXT, created REAL NOT NULL, PRIMARY KEY (run_id, idx))""",
        """CREATE TABLE IF NOT EXISTS llm_calls (
            id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, step INTEGER, role TEXT NOT NULL,
            sample INTEGER, model TEXT, messages TEXT NOT NULL, answer TEXT, error TEXT,
            prompt_tokens INTEGER DEFAULT 0, completion_tokens INTEGER DEFAULT 0, cost_usd REAL DEFAULT 0,
            seconds REAL DEFAULT 0, retries INTEGER DEFAULT 0, created REAL NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS candidates (
            run_id TEXT NOT NULL, step INTEGER NOT NULL, sample INTEGER NOT NULL, sha256 TEXT, path TEXT,
            passed INTEGER, speedup_eager REAL, hacking TEXT, verdict_path TEXT, outcome TEXT NOT NULL,
            created REAL NOT NULL, PRIMARY KEY (run_id, step, sample))""",
        "CREATE INDEX IF NOT EXISTS candidates_by_sha ON candidates (sha256)",
        """CREATE TABLE IF NOT EXISTS benches (
            id TEXT PRIMARY KEY, info TEXT NOT NULL, config TEXT NOT NULL, created REAL NOT NULL,
            updated REAL NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS bench_tasks (
            bench_id TEXT NOT NULL, idx INTEGER NOT NULL, task TEXT NOT NULL, level INTEGER, reference TEXT NOT NULL,
            candidate TEXT, run_id TEXT, status TEXT NOT NULL, result TEXT NOT NULL, updated REAL NOT NULL,
            PRIMARY KEY (bench_id, idx))""",
        """CREATE TABLE IF NOT EXISTS train_runs (
            id TEXT PRIMARY KEY, config TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
            status TEXT NOT NULL, summary TEXT)""",
        """CREATE TABLE IF NOT EXISTS train_metrics (
            run_id TEXT NOT NULL, step INTEGER NOT NULL, metrics TEXT NOT NULL, created REAL NOT NULL,
            PRIMARY KEY (run_id, step))""",
    ),
    # 2: a resumed step looks up the answers it already has by (run, step, role); without an
    # index that scans every prompt ever stored
    ("CREATE INDEX IF NOT EXISTS llm_calls_by_step ON llm_calls (run_id, step, role)",),
    # 3: who is running a run (host, PID, the process's start) and when it last said so: a run whose
    # process is gone shows as interrupted instead of running forever
    ("ALTER TABLE runs ADD COLUMN owner TEXT", "ALTER TABLE runs ADD COLUMN heartbeat REAL"),
)

# a run's owner on another host is taken for gone when it has not written for this long (its
# process beats every HEARTBEAT_S while it runs)
HEARTBEAT_S = 15.0
STALE_AFTER_S = 8 * HEARTBEAT_S


class StoreError(RuntimeError):
    """A run store this stitchcuda cannot use; the message says why."""


def db_path(workspace: str | Path) -> Path:
    return Path(workspace) / DB_NAME


def schema_version(db: sqlite3.Connection) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def migrate(db: sqlite3.Connection) -> int:
    """Apply the steps of ``MIGRATIONS`` the database has not had; returns its version."""
    known = len(MIGRATIONS)
    if schema_version(db) > known:
        raise StoreError(f"the run store is at schema version {schema_version(db)}, this stitchcuda knows "
                         f"{known}: upgrade stitchcuda, or use another --workspace")
    for number, statements in enumerate(MIGRATIONS, start=1):
        if schema_version(db) >= number:
            continue
        db.execute("BEGIN IMMEDIATE")  # the write lock first: another process may be migrating too
        try:
            if schema_version(db) < number:  # it may have applied this step while we waited
                for statement in statements:
                    db.execute(statement)
                db.execute(f"PRAGMA user_version = {number}")  # in the same transaction as the step
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    return schema_version(db)


def damaged(path: Path, exc: BaseException) -> StoreError:
    """The error for a store SQLite cannot read: the user's to fix, with the commands that do."""
    workspace = shlex.quote(str(path.parent))
    return StoreError(f"the run store {path} is damaged ({exc}): `stitchcuda runs --check --workspace {workspace}` "
                      f"says what is wrong, and `stitchcuda runs --repair --workspace {workspace}` recovers every "
                      "readable run into a new store, keeping the damaged file beside it")


def read_only(path: Path) -> StoreError:
    return StoreError(f"the run store {path} is read-only: this command records runs; make it writable, or pass "
                      "--workspace with a folder you can write")


def _is_damage(exc: sqlite3.DatabaseError) -> bool:
    text = str(exc)
    return "malformed" in text or "not a database" in text or "file is encrypted" in text


def _is_read_only(exc: sqlite3.DatabaseError) -> bool:
    return "readonly" in str(exc) or "read-only" in str(exc)


def connect(workspace: str | Path) -> sqlite3.Connection:
    """The workspace's run store, created or migrated to the current schema; autocommit. A store
    this process may not write is opened to read (listing works; a write raises StoreError)."""
    root = Path(workspace)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create the workspace {root}: {exc.strerror or exc}; pass --workspace with a "
                         "folder you can write") from None
    path = db_path(root)
    if not os.access(root, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return _connect_to_read(path)
    try:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    except sqlite3.DatabaseError as exc:
        raise damaged(path, exc) from None
    try:
        db.execute("PRAGMA journal_mode=WAL")
        migrate(db)
    except sqlite3.DatabaseError as exc:
        db.close()
        if _is_damage(exc):
            raise damaged(path, exc) from None
        if _is_read_only(exc):
            raise read_only(path) from None
        raise
    except BaseException:
        db.close()
        raise
    return db


def _connect_to_read(path: Path) -> sqlite3.Connection:
    """A store in a folder (or a file) this process cannot write: read only. SQLite opens a WAL
    database read-only where it may create its shared-memory file; else it reads the file as it is
    (``immutable``: changes still only in the write-ahead log are not seen)."""
    if not path.exists():
        raise StoreError(f"no run store in {path.parent}, and that folder is read-only: pass --workspace with a "
                         "folder you can write")
    for query in ("mode=ro", "immutable=1"):
        try:
            db = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, timeout=BUSY_TIMEOUT_S,
                                 isolation_level=None, check_same_thread=False)
            version = schema_version(db)
        except sqlite3.DatabaseError as exc:
            if _is_damage(exc):
                raise damaged(path, exc) from None
            continue
        if version < len(MIGRATIONS):
            db.close()
            raise StoreError(f"the run store {path} was written by an older stitchcuda and is read-only here: make "
                             "it writable once so that it can be upgraded")
        return db
    raise StoreError(f"the run store {path} cannot be opened, not even to read: check its permissions")


class Database:
    """One connection to a workspace's run store, shared by the threads that hold this object."""

    def __init__(self, workspace: str | Path):
        self.root = Path(workspace)
        self.path = db_path(self.root)
        self.db = connect(self.root)
        self._lock = threading.Lock()  # sqlite3 connections are not safe across threads on their own

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def _faults(self) -> Iterator[None]:
        """SQLite's errors for a damaged or read-only file, as the StoreError that says what to do."""
        try:
            yield
        except sqlite3.DatabaseError as exc:
            if _is_damage(exc):
                raise damaged(self.path, exc) from None
            if _is_read_only(exc):
                raise read_only(self.path) from None
            raise

    def _all(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock, self._faults():
            return self.db.execute(sql, params).fetchall()

    def _one(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        with self._lock, self._faults():
            return self.db.execute(sql, params).fetchone()

    def _write(self, sql: str, params: tuple[Any, ...] = ()) -> None:
        with self._lock, self._faults():
            self.db.execute(sql, params)

    def _write_many(self, statements: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """Several writes in one transaction: all of them land or none."""
        with self._lock, self._faults():
            self.db.execute("BEGIN IMMEDIATE")
            try:
                for sql, rows in statements:
                    self.db.executemany(sql, rows)
                self.db.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    self.db.execute("ROLLBACK")
                raise

    def _resolve(self, table: str, prefix: str, what: str) -> str:
        """An id of ``table`` from a unique prefix, or 'last' (the newest)."""
        if prefix == "last":
            row = self._one(f"SELECT id FROM {table} ORDER BY created DESC LIMIT 1")
            if row is None:
                raise KeyError(f"no {what} in this workspace")
            return row[0]
        rows = self._all(f"SELECT id FROM {table} WHERE id LIKE ?", (prefix + "%",))
        if len(rows) != 1:
            raise KeyError(f"{len(rows)} {what} match {prefix!r}")
        return rows[0][0]


class Owner(BaseModel):
    """The process running a run: on this host, alive when its PID is and was started when it was
    (a PID is reused); elsewhere, while its heartbeat is recent."""

    host: str
    pid: int
    started: float | None = Field(None, description="the process's start, from /proc (None where unknown)")

    @classmethod
    def this_process(cls) -> Owner:
        return cls(host=socket.gethostname(), pid=os.getpid(), started=_process_start(os.getpid()))

    def alive(self, heartbeat: float | None) -> bool:
        if self.host != socket.gethostname():
            return heartbeat is not None and time.time() - heartbeat < STALE_AFTER_S
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except OSError:  # another user's process: alive
            return True
        started = _process_start(self.pid)
        return self.started is None or started is None or abs(started - self.started) < 1.0


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since boot (Linux); None elsewhere or for a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    if fields[0] == "Z":
        return None
    return int(fields[19]) / os.sysconf("SC_CLK_TCK")


class RunSummary(BaseModel):
    id: str
    task: str
    status: str = Field(description="as stored, or interrupted: stored as running by a process that is gone")
    created: float
    updated: float
    steps: int
    best_speedup: float | None
    llm_calls: int
    cost_usd: float
    stop_reason: str | None


def _shown_status(status: str, owner: str | None, heartbeat: float | None) -> str:
    if status == "running" and (owner is None or not Owner.model_validate_json(owner).alive(heartbeat)):
        return "interrupted"  # a run stored before owners were recorded has none: its process is long gone
    return status


class RunStore(Database):
    """Optimize runs: their state, plans, steps, LLM calls and candidates."""

    # -- runs ---------------------------------------------------------------------------------

    def new_run_id(self, task: str) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return f"{stamp}-{task[:24]}-{uuid.uuid4().hex[:4]}"

    def run_dir(self, run_id: str) -> Path:
        path = self.root / "runs" / run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def create_run(self, state: RunState, config: BaseModel) -> None:
        """A new run, owned by this process."""
        now = time.time()
        self._write("INSERT INTO runs (id, task, task_sha256, status, created, updated, config, state, owner, "
                    "heartbeat) VALUES (?,?,?,?,?,?,?,?,?,?)", (
                        state.run_id, state.task, state.task_sha256, state.status, now, now,
                        config.model_dump_json(), state.model_dump_json(), Owner.this_process().model_dump_json(),
                        now))

    def save_state(self, state: RunState) -> None:
        self._write("UPDATE runs SET state=?, status=?, updated=?, heartbeat=? WHERE id=?",
                    (state.model_dump_json(), state.status, time.time(), time.time(), state.run_id))

    def claim(self, run_id: str) -> None:
        """Make this process the run's owner (a resume). Raises StoreError while another live
        process runs it."""
        found = self.owner(run_id)
        if found is not None and found[0].pid != os.getpid() and self.status(run_id) == "running":
            raise StoreError(f"run {run_id} is still running (PID {found[0].pid} on {found[0].host}): wait for it "
                             "or stop it first")
        self._write("UPDATE runs SET owner=?, heartbeat=? WHERE id=?",
                    (Owner.this_process().model_dump_json(), time.time(), run_id))

    def beat(self, run_id: str) -> None:
        """This run's process is alive (its heartbeat thread calls this every HEARTBEAT_S)."""
        self._write("UPDATE runs SET heartbeat=? WHERE id=?", (time.time(), run_id))

    def owner(self, run_id: str) -> tuple[Owner, float | None] | None:
        row = self._one("SELECT owner, heartbeat FROM runs WHERE id=?", (run_id,))
        if row is None or row[0] is None:
            return None
        return Owner.model_validate_json(row[0]), row[1]

    def status(self, run_id: str) -> str:
        """The run's status, with ``interrupted`` for one stored as running by a process that is gone."""
        row = self._one("SELECT status, owner, heartbeat FROM runs WHERE id=?", (run_id,))
        if row is None:
            raise KeyError(run_id)
        return _shown_status(*row)

    def load_state(self, run_id: str) -> RunState:
        row = self._one("SELECT state FROM runs WHERE id=?", (run_id,))
        if row is None:
            raise KeyError(run_id)
        return RunState.model_validate_json(row[0])

    def load_config(self, run_id: str) -> dict[str, Any]:
        row = self._one("SELECT config FROM runs WHERE id=?", (run_id,))
        if row is None:
            raise KeyError(run_id)
        return json.loads(row[0])

    def resolve(self, prefix: str) -> str:
        """A run id from a unique prefix (or 'last')."""
        return self._resolve("runs", prefix, "runs")

    def runs(self, limit: int = 50) -> list[RunSummary]:
        rows = self._all("SELECT id, state, created, updated, status, owner, heartbeat FROM runs "
                         "ORDER BY created DESC LIMIT ?", (limit,))
        out = []
        for run_id, state_json, created, updated, status, owner, heartbeat in rows:
            s = RunState.model_validate_json(state_json)
            out.append(RunSummary(id=run_id, task=s.task, status=_shown_status(status, owner, heartbeat),
                                  created=created, updated=updated,
                                  steps=s.steps_done, best_speedup=s.best.speedup_eager if s.best else None,
                                  llm_calls=s.llm_calls, cost_usd=s.cost_usd, stop_reason=s.stop_reason))
        return out

    # -- plans, steps, calls, candidates ---------------------------------------------------------

    def add_plan(self, run_id: str, plan: Plan) -> None:
        self._write("INSERT OR REPLACE INTO plans VALUES (?,?,?,?)",
                    (run_id, plan.version, plan.model_dump_json(), time.time()))

    def plans(self, run_id: str) -> list[Plan]:
        rows = self._all("SELECT plan FROM plans WHERE run_id=? ORDER BY version", (run_id,))
        return [Plan.model_validate_json(r[0]) for r in rows]

    def save_step(self, run_id: str, step: StepRecord) -> None:
        self._write("INSERT OR REPLACE INTO steps VALUES (?,?,?,?,?,?,?)", (
            run_id, step.index, step.subtask, step.skill, step.model_dump_json(),
            step.decision.action if step.decision else None, time.time()))

    def steps(self, run_id: str) -> list[StepRecord]:
        rows = self._all("SELECT record FROM steps WHERE run_id=? ORDER BY idx", (run_id,))
        return [StepRecord.model_validate_json(r[0]) for r in rows]

    def step(self, run_id: str, index: int) -> StepRecord | None:
        row = self._one("SELECT record FROM steps WHERE run_id=? AND idx=?", (run_id, index))
        return StepRecord.model_validate_json(row[0]) if row else None

    def add_llm_call(self, run_id: str, step: int | None, role: str, sample: int | None, model: str,
                     messages: list[dict[str, str]], answer: str | None, error: str | None = None,
                     prompt_tokens: int = 0, completion_tokens: int = 0, cost_usd: float = 0.0,
                     seconds: float = 0.0, retries: int = 0) -> None:
        self._write(
            "INSERT INTO llm_calls (run_id, step, role, sample, model, messages, answer, error, prompt_tokens, "
            "completion_tokens, cost_usd, seconds, retries, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, step, role, sample, model, json.dumps(messages), answer, error, prompt_tokens,
             completion_tokens, cost_usd, seconds, retries, time.time()))

    def llm_answers(self, run_id: str, step: int, role: str = "coder") -> dict[int, str]:
        """Answers already received for a step (a resumed step does not ask again)."""
        rows = self._all("SELECT sample, answer FROM llm_calls WHERE run_id=? AND step=? AND role=? "
                         "AND answer IS NOT NULL ORDER BY id", (run_id, step, role))
        return {int(s): a for s, a in rows if s is not None}

    def llm_calls(self, run_id: str) -> list[dict[str, Any]]:
        names = ["id", "step", "role", "sample", "model", "answer", "error", "prompt_tokens", "completion_tokens",
                 "cost_usd", "seconds", "retries"]
        rows = self._all(f"SELECT {', '.join(names)} FROM llm_calls WHERE run_id=? ORDER BY id", (run_id,))
        return [dict(zip(names, row, strict=True)) for row in rows]

    def coder_calls(self, run_id: str) -> list[tuple[int | None, int | None, str, list[dict[str, str]], str]]:
        """(step, sample, model, messages as sent, answer) of every Coder call that got an answer."""
        rows = self._all("SELECT step, sample, model, messages, answer FROM llm_calls WHERE run_id = ? AND "
                         "role = 'coder' AND answer IS NOT NULL ORDER BY id", (run_id,))
        return [(step, sample, model, json.loads(messages), answer) for step, sample, model, messages, answer in rows]

    def step_times(self, run_id: str) -> dict[int, float]:
        """Seconds from the run's creation to each step's record."""
        start = self._one("SELECT created FROM runs WHERE id = ?", (run_id,))
        if start is None:
            return {}
        rows = self._all("SELECT idx, created FROM steps WHERE run_id = ?", (run_id,))
        return {idx: created - start[0] for idx, created in rows}

    def save_candidate(self, run_id: str, step: int, outcome: SampleOutcome) -> None:
        self._write("INSERT OR REPLACE INTO candidates VALUES (?,?,?,?,?,?,?,?,?,?,?)", (
            run_id, step, outcome.sample, outcome.sha256, outcome.path, int(outcome.passed),
            outcome.speedup_eager, outcome.hacking, outcome.verdict_path, outcome.model_dump_json(), time.time()))

    def verified(self, run_id: str, sha256: str) -> SampleOutcome | None:
        """A verdict this run already reached for this exact program (same task, same settings)."""
        row = self._one("SELECT outcome FROM candidates WHERE run_id=? AND sha256=? AND verdict_path IS NOT "
                        "NULL ORDER BY created DESC LIMIT 1", (run_id, sha256))
        return SampleOutcome.model_validate_json(row[0]) if row else None


class TrainLog(Database):
    """Training runs and their per-step metrics (what the trainer logs, as it logs it)."""

    def start(self, config_json: str) -> str:
        """A new training run, status running; returns its id."""
        run_id = f"train-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
        now = time.time()
        self._write("INSERT INTO train_runs VALUES (?, ?, ?, ?, 'running', NULL)", (run_id, config_json, now, now))
        return run_id

    def log(self, run_id: str, step: int, metrics: dict[str, Any]) -> None:
        """A step's metrics, merged into what that step already logged: the trainer's closing
        summary comes at the last step too, and must not replace that step's rewards."""
        with self._lock:
            row = self.db.execute("SELECT metrics FROM train_metrics WHERE run_id = ? AND step = ?",
                                  (run_id, step)).fetchone()
            merged = {**json.loads(row[0]), **metrics} if row else metrics
            self.db.execute("INSERT OR REPLACE INTO train_metrics VALUES (?, ?, ?, ?)",
                            (run_id, step, json.dumps(merged, default=float), time.time()))

    def finish(self, run_id: str, status: str, summary: dict[str, Any]) -> None:
        self._write("UPDATE train_runs SET status = ?, summary = ?, updated = ? WHERE id = ?",
                    (status, json.dumps(summary, default=str), time.time(), run_id))

    def status(self, run_id: str) -> str | None:
        row = self._one("SELECT status FROM train_runs WHERE id = ?", (run_id,))
        return row[0] if row else None

    def metrics(self, run_id: str | None = None) -> list[tuple[int, dict[str, Any]]]:
        """The logged metrics of a training run (the latest when ``run_id`` is None), step by step."""
        if run_id is None:
            row = self._one("SELECT id FROM train_runs ORDER BY created DESC LIMIT 1")
            if row is None:
                return []
            run_id = row[0]
        rows = self._all("SELECT step, metrics FROM train_metrics WHERE run_id = ? ORDER BY step", (run_id,))
        return [(step, json.loads(metrics)) for step, metrics in rows]
