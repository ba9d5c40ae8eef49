"""Benches in the run store: one row per bench, one per (bench, task), each written at once.

A task row moves pending -> running (with the optimize run's id as soon as it has one) ->
done / failed / unsupported. A bench killed mid-way resumes from these rows: finished tasks
are kept, a running one resumes its optimize run (whose answers and verdicts are stored), and
pending ones start. The tables, the connection and its locking are ``stitchcuda.store``'s; this
module only reads and writes the bench records.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from stitchcuda.bench.records import BenchInfo, BenchResult, TaskResult
from stitchcuda.store import Database


class BenchRow:
    """One task of a bench as stored: where its reference and (for --evaluate) candidate live."""

    def __init__(self, idx: int, result: TaskResult, reference: str, candidate: str | None):
        self.idx, self.result, self.reference, self.candidate = idx, result, reference, candidate


class BenchStore(Database):
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
        self._write_many([
            ("INSERT INTO benches VALUES (?, ?, ?, ?, ?)", [(info.id, info.model_dump_json(), config_json, now, now)]),
            ("INSERT INTO bench_tasks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
             [(info.id, r.idx, r.result.task, r.result.level, r.reference, r.candidate, None, "pending",
               r.result.model_dump_json(), now) for r in rows])])

    def save_info(self, info: BenchInfo) -> None:
        info.updated = time.time()
        self._write("UPDATE benches SET info = ?, updated = ? WHERE id = ?",
                    (info.model_dump_json(), info.updated, info.id))

    def set_run(self, bench_id: str, idx: int, run_id: str) -> None:
        self._write("UPDATE bench_tasks SET run_id = ?, status = 'running', updated = ? "
                    "WHERE bench_id = ? AND idx = ?", (run_id, time.time(), bench_id, idx))

    def save_result(self, bench_id: str, idx: int, result: TaskResult) -> None:
        self._write("UPDATE bench_tasks SET status = ?, run_id = COALESCE(?, run_id), result = ?, "
                    "updated = ? WHERE bench_id = ? AND idx = ?",
                    (result.status, result.run_id, result.model_dump_json(), time.time(), bench_id, idx))

    def resolve(self, prefix: str) -> str:
        """A bench id from a unique prefix (or 'last')."""
        return self._resolve("benches", prefix, "benches")

    def config_json(self, bench_id: str) -> str:
        row = self._one("SELECT config FROM benches WHERE id = ?", (bench_id,))
        if row is None:
            raise KeyError(f"no bench {bench_id}")
        return row[0]

    def info(self, bench_id: str) -> BenchInfo:
        row = self._one("SELECT info FROM benches WHERE id = ?", (bench_id,))
        if row is None:
            raise KeyError(f"no bench {bench_id}")
        return BenchInfo.model_validate_json(row[0])

    def rows(self, bench_id: str) -> list[tuple[BenchRow, str | None, str]]:
        """(row, the optimize run id, the stored status) per task, in suite order."""
        found = self._all("SELECT idx, reference, candidate, run_id, status, result FROM bench_tasks "
                          "WHERE bench_id = ? ORDER BY idx", (bench_id,))
        return [(BenchRow(i, TaskResult.model_validate_json(res), ref, cand), run, status)
                for i, ref, cand, run, status, res in found]

    def result(self, bench_id: str) -> BenchResult:
        return BenchResult(info=self.info(bench_id), tasks=[r.result for r, _, _ in self.rows(bench_id)])

    def benches(self, limit: int = 50) -> list[BenchInfo]:
        found = self._all("SELECT info FROM benches ORDER BY created DESC LIMIT ?", (limit,))
        return [BenchInfo.model_validate_json(r[0]) for r in found]
