"""Checking and recovering a damaged run store (``stitchcuda runs --check`` and ``--repair``).

A store cut short, with a page overwritten, or replaced by another file is the user's to fix, not
our bug. ``check`` runs SQLite's integrity check. ``repair`` moves the damaged file aside (kept,
with its write-ahead log), makes a new store with the current schema and copies into it every row
SQLite can still read, table by table: where a whole-table read fails, by halves of rowid ranges
down to single rows, so one bad page loses only the rows on it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from pydantic import BaseModel, Field

from stitchcuda.store import StoreError, connect, db_path

TABLES = ("runs", "plans", "steps", "llm_calls", "candidates", "benches", "bench_tasks", "train_runs",
          "train_metrics")
_SIDE_FILES = ("-wal", "-shm")


class StoreCheck(BaseModel):
    path: str
    ok: bool
    problems: list[str] = Field([], description="what SQLite's integrity check found (or why it could not run)")


class StoreRepair(BaseModel):
    path: str
    damaged_copy: str = Field(description="the damaged file, kept as it was")
    rows: dict[str, int] = Field(description="rows recovered, by table")

    @property
    def runs(self) -> int:
        return self.rows.get("runs", 0)


def check(workspace: str | Path) -> StoreCheck:
    path = db_path(workspace)
    if not path.exists():
        raise StoreError(f"no run store in {workspace}")
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            found = [row[0] for row in db.execute("PRAGMA integrity_check").fetchall()]
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return StoreCheck(path=str(path), ok=False, problems=[str(exc)])
    return StoreCheck(path=str(path), ok=found == ["ok"], problems=[] if found == ["ok"] else found)


def repair(workspace: str | Path) -> StoreRepair:
    """Move the damaged store aside and recover what it holds into a new one."""
    path = db_path(workspace)
    if not path.exists():
        raise StoreError(f"no run store in {workspace}")
    kept = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        for suffix in _SIDE_FILES:  # the log goes with its file: SQLite reads <file>-wal beside it
            if Path(f"{path}{suffix}").exists():
                os.replace(f"{path}{suffix}", f"{kept}{suffix}")
        os.replace(path, kept)
    except OSError as exc:
        raise StoreError(f"cannot move the damaged store {path} aside: {exc.strerror or exc}") from None
    rows: dict[str, int] = {}
    source = sqlite3.connect(f"{kept.resolve().as_uri()}?mode=ro", uri=True)
    target = connect(workspace)
    try:
        for table in TABLES:
            columns, found = _readable_rows(source, table)
            if found:
                marks = ", ".join("?" * len(columns))
                target.execute("BEGIN IMMEDIATE")
                target.executemany(f"INSERT OR IGNORE INTO {table} ({', '.join(columns)}) VALUES ({marks})", found)
                target.execute("COMMIT")
            rows[table] = len(found)
    finally:
        source.close()
        target.close()
    return StoreRepair(path=str(path), damaged_copy=str(kept), rows=rows)


def _readable_rows(db: sqlite3.Connection, table: str) -> tuple[list[str], list[tuple]]:
    try:
        cursor = db.execute(f"SELECT * FROM {table}")
        columns = [d[0] for d in cursor.description]
    except sqlite3.DatabaseError:  # no such table, or its schema unreadable: nothing to recover from it
        return [], []
    try:
        return columns, cursor.fetchall()
    except sqlite3.DatabaseError:
        pass
    try:
        top = db.execute(f"SELECT max(rowid) FROM {table}").fetchone()[0] or 0
    except sqlite3.DatabaseError:
        top = 1 << 20
    found: list[tuple] = []
    pending = [(1, top)]
    while pending:
        low, high = pending.pop()
        try:
            found += db.execute(f"SELECT * FROM {table} WHERE rowid BETWEEN ? AND ?", (low, high)).fetchall()
        except sqlite3.DatabaseError:
            if low < high:
                middle = (low + high) // 2
                pending += [(middle + 1, high), (low, middle)]
    return columns, found
