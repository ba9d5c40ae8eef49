"""The run store: one owner of runs.sqlite, whose schema migrates in place and keeps its rows."""

from __future__ import annotations

import sqlite3

import pytest

from stitchcuda import store
from stitchcuda.bench.records import BenchInfo, TaskResult
from stitchcuda.bench.store import BenchRow, BenchStore
from stitchcuda.records import RunState
from stitchcuda.store import MIGRATIONS, RunStore, StoreError, TrainLog, connect, db_path, schema_version

# The layout the three former owners of runs.sqlite wrote, each with its own script and no
# schema version (user_version 0): store.py (runs), bench/store.py (benches), rl/train.py (training).
OLD_RUNS = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, task TEXT NOT NULL, task_sha256 TEXT NOT NULL, status TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, config TEXT NOT NULL, state TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS plans (
    run_id TEXT NOT NULL, version INTEGER NOT NULL, plan TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (run_id, version)
);
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT NOT NULL, idx INTEGER NOT NULL, subtask INTEGER NOT NULL, skill TEXT NOT NULL,
    record TEXT NOT NULL, action TEXT, created REAL NOT NULL, PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS llm_calls (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, step INTEGER, role TEXT NOT NULL,
    sample INTEGER, model TEXT, messages TEXT NOT NULL, answer TEXT, error TEXT,
    prompt_tokens INTEGER DEFAULT 0, completion_tokens INTEGER DEFAULT 0, cost_usd REAL DEFAULT 0,
    seconds REAL DEFAULT 0, retries INTEGER DEFAULT 0, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS candidates (
    run_id TEXT NOT NULL, step INTEGER NOT NULL, sample INTEGER NOT NULL, sha256 TEXT, path TEXT,
    passed INTEGER, speedup_eager REAL, hacking TEXT, verdict_path TEXT, outcome TEXT NOT NULL,
    created REAL NOT NULL, PRIMARY KEY (run_id, step, sample)
);
CREATE INDEX IF NOT EXISTS candidates_by_sha ON candidates (sha256);
"""
OLD_BENCHES = """
CREATE TABLE IF NOT EXISTS benches (
    id TEXT PRIMARY KEY, info TEXT NOT NULL, config TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS bench_tasks (
    bench_id TEXT NOT NULL, idx INTEGER NOT NULL, task TEXT NOT NULL, level INTEGER, reference TEXT NOT NULL,
    candidate TEXT, run_id TEXT, status TEXT NOT NULL, result TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (bench_id, idx)
);
"""
OLD_TRAINING = """
CREATE TABLE IF NOT EXISTS train_runs (id TEXT PRIMARY KEY, config TEXT NOT NULL, created REAL NOT NULL,
                                       updated REAL NOT NULL, status TEXT NOT NULL, summary TEXT);
CREATE TABLE IF NOT EXISTS train_metrics (run_id TEXT NOT NULL, step INTEGER NOT NULL, metrics TEXT NOT NULL,
                                          created REAL NOT NULL, PRIMARY KEY (run_id, step));
"""


def old_store(workspace, *scripts: str) -> None:
    """A runs.sqlite as the old modules left it, with a row in each table they made."""
    workspace.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(db_path(workspace))
    for script in scripts:
        db.executescript(script)
    state = RunState(run_id="r1", task="mlp", task_sha256="s", steps_done=3)
    if OLD_RUNS in scripts:
        db.execute("INSERT INTO runs VALUES ('r1', 'mlp', 's', 'running', 1, 2, '{}', ?)", (state.model_dump_json(),))
        db.execute("INSERT INTO llm_calls (run_id, step, role, sample, model, messages, answer, created) "
                   "VALUES ('r1', 0, 'coder', 0, 'm', '[]', 'an answer', 1)")
    if OLD_BENCHES in scripts:
        info = BenchInfo(id="bench-1", suite="suite", coder="offline", tolerance="strict")
        db.execute("INSERT INTO benches VALUES ('bench-1', ?, '{}', 1, 1)", (info.model_dump_json(),))
        db.execute("INSERT INTO bench_tasks VALUES ('bench-1', 0, 'mlp', 1, 'ref.py', NULL, 'r1', 'done', ?, 1)",
                   (TaskResult(task="mlp", level=1, status="done", run_id="r1").model_dump_json(),))
    if OLD_TRAINING in scripts:
        db.execute("INSERT INTO train_runs VALUES ('train-1', '{}', 1, 1, 'done', NULL)")
        db.execute("INSERT INTO train_metrics VALUES ('train-1', 1, '{\"reward\": 0.5}', 1)")
    db.commit()
    assert db.execute("PRAGMA user_version").fetchone()[0] == 0
    db.close()


def test_an_old_store_migrates_in_place_and_keeps_its_rows(tmp_path):
    old_store(tmp_path, OLD_RUNS, OLD_BENCHES, OLD_TRAINING)
    runs = RunStore(tmp_path)
    assert schema_version(runs.db) == len(MIGRATIONS) >= 2
    indexes = {r[0] for r in runs.db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert {"candidates_by_sha", "llm_calls_by_step"} <= indexes  # the old one kept, step 2's added
    assert runs.load_state("r1").steps_done == 3 and runs.resolve("last") == "r1"
    assert runs.llm_answers("r1", 0) == {0: "an answer"}
    runs.add_llm_call("r1", 1, "coder", 0, "m", [], "another")  # and it takes new rows
    assert runs.llm_answers("r1", 1) == {0: "another"}
    benches = BenchStore(tmp_path)
    assert benches.resolve("bench") == "bench-1" and benches.info("bench-1").suite == "suite"
    [(row, run_id, status)] = benches.rows("bench-1")
    assert (row.result.task, row.reference, run_id, status) == ("mlp", "ref.py", "r1", "done")
    log = TrainLog(tmp_path)
    assert log.metrics() == [(1, {"reward": 0.5})] and log.status("train-1") == "done"
    for opened in (runs, benches, log):
        opened.close()


def test_a_store_of_one_old_owner_gets_the_other_tables(tmp_path):
    old_store(tmp_path, OLD_TRAINING)  # only `stitchcuda train` had used this workspace
    log = TrainLog(tmp_path)
    log.log("train-1", 1, {"loss": 1.0})  # merged into the old row
    assert log.metrics("train-1") == [(1, {"reward": 0.5, "loss": 1.0})]
    benches = BenchStore(tmp_path)
    benches.create(BenchInfo(id="bench-2", suite="s", coder="offline", tolerance="strict"), "{}",
                   [BenchRow(0, TaskResult(task="mlp"), "ref.py", None)])
    assert benches.rows("bench-2")[0][2] == "pending" and RunStore(tmp_path).runs() == []


def test_a_fresh_store_has_one_lock_policy(tmp_path):
    db = connect(tmp_path / "ws")
    assert db_path(tmp_path / "ws").is_file() and schema_version(db) == len(MIGRATIONS)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA busy_timeout").fetchone()[0] == int(store.BUSY_TIMEOUT_S * 1000)
    again = connect(tmp_path / "ws")  # a second opener finds nothing to do
    assert schema_version(again) == len(MIGRATIONS)


def test_a_failed_step_leaves_the_version_and_tables_as_they_were(tmp_path, monkeypatch):
    connect(tmp_path).close()
    broken = ("CREATE TABLE half_done (x INTEGER)", "CREATE TABLE nonsense (")
    monkeypatch.setattr("stitchcuda.store.MIGRATIONS", (*MIGRATIONS, broken))
    with pytest.raises(sqlite3.OperationalError):
        connect(tmp_path)
    db = sqlite3.connect(db_path(tmp_path))
    assert db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half_done'").fetchone() is None


def test_a_store_newer_than_this_stitchcuda_is_refused(tmp_path):
    connect(tmp_path).execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(StoreError, match="upgrade stitchcuda"):
        RunStore(tmp_path)
