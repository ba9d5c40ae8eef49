"""Benches in the run store: one row per bench, one per (bench, task), each written at once.

A task row moves pending -> running (with the optimize run's id as soon as it has one) ->
done / failed / unsupported. A bench killed mid-way resumes from these rows: finished tasks
are kept, a running one resumes its optimize run (whose answers and verdicts are stored), and
pending ones start.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from pathlib import Path

from stitchcuda.bench.records import BenchInfo, BenchResult, TaskResult

SCHEMA = """
CREATE TABLE IF NOT EXISTS benches (
    id TEXT PRIMARY KEY, info TEXT NOT NULL, config TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS bench_tasks (
    bench_id TEXT NOT NULL, idx INTEGER NOT NULL, task TEXT NOT NULL, level INTEGER, reference TEXT NOT NULL,
    candidate TEXT, run_id TEXT, status TEXT NOT NULL, result TEXT NOT NULL, updated REAL NOT NULL,
    PRIMARY KEY (bench_id, idx)
);
"""


class BenchRow:
    """One task of a bench as stored: where its reference and (for --evaluate) candidate live."""

    def __init__(self, idx: int, result: TaskResult, reference: str, candidate: str | None):
        self.idx, self.result, self.reference, self.candidate = idx, result, reference, candidate


class BenchStore:
    def __init__(self, workspace: str | Path):
        self.root = Path(workspace)
        self.root.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(self.root / "runs.sqlite", check_same_thread=False, isolation_level=None,
                                  timeout=60)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)
        self._lock = threading.Lock()  # one connection, shared by the pool's threads

    def close(self) -> None:
        self.db.close()

    def bench_dir(self, bench_id: str) -> Path:
        path = self.root / "benches" / bench_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def new_id(self, suite: str) -> str:
        label = "".join(c if c.isalnum() or c in "-_" else "-" for c in Path(suite).name)[:24] or "suite"
        return f"bench-{time.strftime('%Y%m%d-%H%M%S')}-{label}-{uuid.uuid4().hex[:4]}"

    def create(self, info: BenchInfo, config_json: str, rows: list[BenchRow]) -> None:
        now = time.time()
        info.created = info.updated = now
        with self._lock:
            self.db.execute("INSERT INTO benches VALUES (?, ?, ?, ?, ?)",
                            (info.id, info.model_dump_json(), config_json, now, now))
            self.db.executemany(
                "INSERT INTO bench_tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(info.id, r.idx, r.result.task, r.result.level, r.reference, r.candidate, None, "pending",
                  r.result.model_dump_json(), now) for r in rows])

    def save_info(self, info: BenchInfo) -> None:
        info.updated = time.time()
        with self._lock:
            self.db.execute("UPDATE benches SET info = ?, updated = ? WHERE id = ?",
                            (info.model_dump_json(), info.updated, info.id))

    def set_run(self, bench_id: str, idx: int, run_id: str) -> None:
        with self._lock:
            self.db.execute("UPDATE bench_tasks SET run_id = ?, status = 'running', updated = ? "
                            "WHERE bench_id = ? AND idx = ?", (run_id, time.time(), bench_id, idx))

    def save_result(self, bench_id: str, idx: int, result: TaskResult) -> None:
        with self._lock:
            self.db.execute("UPDATE bench_tasks SET status = ?, run_id = COALESCE(?, run_id), result = ?, "
                            "updated = ? WHERE bench_id = ? AND idx = ?",
                            (result.status, result.run_id, result.model_dump_json(), time.time(), bench_id, idx))

    def resolve(self, prefix: str) -> str:
        with self._lock:
            if prefix == "last":
                row = self.db.execute("SELECT id FROM benches ORDER BY created DESC LIMIT 1").fetchone()
                if row is None:
                    raise KeyError("no bench yet")
                return row[0]
            found = [r[0] for r in self.db.execute("SELECT id FROM benches WHERE id LIKE ?", (prefix + "%",))]
        if len(found) != 1:
            raise KeyError(f"{len(found)} benches match {prefix!r}")
        return found[0]

    def config_json(self, bench_id: str) -> str:
        with self._lock:
            return self.db.execute("SELECT config FROM benches WHERE id = ?", (bench_id,)).fetchone()[0]

    def info(self, bench_id: str) -> BenchInfo:
        with self._lock:
            row = self.db.execute("SELECT info FROM benches WHERE id = ?", (bench_id,)).fetchone()
        if row is None:
            raise KeyError(f"no bench {bench_id}")
        return BenchInfo.model_validate_json(row[0])

    def rows(self, bench_id: str) -> list[tuple[BenchRow, str | None, str]]:
        """(row, the optimize run id, the stored status) per task, in suite order."""
        with self._lock:
            found = self.db.execute("SELECT idx, reference, candidate, run_id, status, result FROM bench_tasks "
                                    "WHERE bench_id = ? ORDER BY idx", (bench_id,)).fetchall()
        return [(BenchRow(i, TaskResult.model_validate_json(res), ref, cand), run, status)
                for i, ref, cand, run, status, res in found]

    def result(self, bench_id: str) -> BenchResult:
        return BenchResult(info=self.info(bench_id), tasks=[r.result for r, _, _ in self.rows(bench_id)])

    def benches(self, limit: int = 50) -> list[BenchInfo]:
        with self._lock:
            found = self.db.execute("SELECT info FROM benches ORDER BY created DESC LIMIT ?", (limit,)).fetchall()
        return [BenchInfo.model_validate_json(r[0]) for r in found]
