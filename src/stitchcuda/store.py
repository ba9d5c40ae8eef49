"""The run store: one SQLite file per workspace, artifacts on disk beside it.

Tables: ``runs`` (config and the latest resumable state), ``plans``, ``steps`` (with the
routing decision), ``llm_calls`` (prompt, answer, usage) and ``candidates`` (program path and
verdict summary). Programs, verdicts and profiles are files under ``runs/<id>/``; the database
holds their paths. Every write commits at once: a killed run loses at most the step in flight.
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from stitchcuda.agents.records import Plan, RunState, SampleOutcome, StepRecord

SCHEMA = """
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


class RunSummary(BaseModel):
    id: str
    task: str
    status: str
    created: float
    updated: float
    steps: int
    best_speedup: float | None
    llm_calls: int
    cost_usd: float
    stop_reason: str | None


class RunStore:
    def __init__(self, workspace: str | Path):
        self.root = Path(workspace)
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = self.root / "runs.sqlite"
        self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(SCHEMA)

    def close(self) -> None:
        self.db.close()

    # -- runs ---------------------------------------------------------------------------------

    def new_run_id(self, task: str) -> str:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        return f"{stamp}-{task[:24]}-{uuid.uuid4().hex[:4]}"

    def run_dir(self, run_id: str) -> Path:
        path = self.root / "runs" / run_id
        path.mkdir(parents=True, exist_ok=True)
        return path

    def create_run(self, state: RunState, config: BaseModel) -> None:
        now = time.time()
        self.db.execute("INSERT INTO runs VALUES (?,?,?,?,?,?,?,?)", (
            state.run_id, state.task, state.task_sha256, state.status, now, now, config.model_dump_json(),
            state.model_dump_json()))

    def save_state(self, state: RunState) -> None:
        self.db.execute("UPDATE runs SET state=?, status=?, updated=? WHERE id=?",
                        (state.model_dump_json(), state.status, time.time(), state.run_id))

    def load_state(self, run_id: str) -> RunState:
        row = self.db.execute("SELECT state FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(run_id)
        return RunState.model_validate_json(row[0])

    def load_config(self, run_id: str) -> dict[str, Any]:
        row = self.db.execute("SELECT config FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(run_id)
        return json.loads(row[0])

    def resolve(self, prefix: str) -> str:
        """A run id from a unique prefix (or 'last')."""
        if prefix == "last":
            row = self.db.execute("SELECT id FROM runs ORDER BY created DESC LIMIT 1").fetchone()
            if row is None:
                raise KeyError("no runs in this workspace")
            return row[0]
        rows = self.db.execute("SELECT id FROM runs WHERE id LIKE ?", (prefix + "%",)).fetchall()
        if len(rows) != 1:
            raise KeyError(f"{len(rows)} runs match {prefix!r}")
        return rows[0][0]

    def runs(self, limit: int = 50) -> list[RunSummary]:
        rows = self.db.execute("SELECT id, state, created, updated FROM runs ORDER BY created DESC LIMIT ?",
                               (limit,)).fetchall()
        out = []
        for run_id, state_json, created, updated in rows:
            s = RunState.model_validate_json(state_json)
            out.append(RunSummary(id=run_id, task=s.task, status=s.status, created=created, updated=updated,
                                  steps=s.steps_done, best_speedup=s.best.speedup_eager if s.best else None,
                                  llm_calls=s.llm_calls, cost_usd=s.cost_usd, stop_reason=s.stop_reason))
        return out

    # -- plans, steps, calls, candidates ---------------------------------------------------------

    def add_plan(self, run_id: str, plan: Plan) -> None:
        self.db.execute("INSERT OR REPLACE INTO plans VALUES (?,?,?,?)",
                        (run_id, plan.version, plan.model_dump_json(), time.time()))

    def plans(self, run_id: str) -> list[Plan]:
        rows = self.db.execute("SELECT plan FROM plans WHERE run_id=? ORDER BY version", (run_id,)).fetchall()
        return [Plan.model_validate_json(r[0]) for r in rows]

    def save_step(self, run_id: str, step: StepRecord) -> None:
        self.db.execute("INSERT OR REPLACE INTO steps VALUES (?,?,?,?,?,?,?)", (
            run_id, step.index, step.subtask, step.skill, step.model_dump_json(),
            step.decision.action if step.decision else None, time.time()))

    def steps(self, run_id: str) -> list[StepRecord]:
        rows = self.db.execute("SELECT record FROM steps WHERE run_id=? ORDER BY idx", (run_id,)).fetchall()
        return [StepRecord.model_validate_json(r[0]) for r in rows]

    def step(self, run_id: str, index: int) -> StepRecord | None:
        row = self.db.execute("SELECT record FROM steps WHERE run_id=? AND idx=?", (run_id, index)).fetchone()
        return StepRecord.model_validate_json(row[0]) if row else None

    def add_llm_call(self, run_id: str, step: int | None, role: str, sample: int | None, model: str,
                     messages: list[dict[str, str]], answer: str | None, error: str | None = None,
                     prompt_tokens: int = 0, completion_tokens: int = 0, cost_usd: float = 0.0,
                     seconds: float = 0.0, retries: int = 0) -> None:
        self.db.execute(
            "INSERT INTO llm_calls (run_id, step, role, sample, model, messages, answer, error, prompt_tokens, "
            "completion_tokens, cost_usd, seconds, retries, created) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (run_id, step, role, sample, model, json.dumps(messages), answer, error, prompt_tokens,
             completion_tokens, cost_usd, seconds, retries, time.time()))

    def llm_answers(self, run_id: str, step: int, role: str = "coder") -> dict[int, str]:
        """Answers already received for a step (a resumed step does not ask again)."""
        rows = self.db.execute("SELECT sample, answer FROM llm_calls WHERE run_id=? AND step=? AND role=? "
                               "AND answer IS NOT NULL ORDER BY id", (run_id, step, role)).fetchall()
        return {int(s): a for s, a in rows if s is not None}

    def llm_calls(self, run_id: str) -> list[dict[str, Any]]:
        cur = self.db.execute("SELECT id, step, role, sample, model, answer, error, prompt_tokens, "
                              "completion_tokens, cost_usd, seconds, retries FROM llm_calls WHERE run_id=? "
                              "ORDER BY id", (run_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def coder_calls(self, run_id: str) -> list[tuple[int | None, int | None, str, list[dict[str, str]], str]]:
        """(step, sample, model, messages as sent, answer) of every Coder call that got an answer."""
        rows = self.db.execute("SELECT step, sample, model, messages, answer FROM llm_calls WHERE run_id = ? AND "
                               "role = 'coder' AND answer IS NOT NULL ORDER BY id", (run_id,)).fetchall()
        return [(step, sample, model, json.loads(messages), answer) for step, sample, model, messages, answer in rows]

    def step_times(self, run_id: str) -> dict[int, float]:
        """Seconds from the run's creation to each step's record."""
        start = self.db.execute("SELECT created FROM runs WHERE id = ?", (run_id,)).fetchone()
        if start is None:
            return {}
        rows = self.db.execute("SELECT idx, created FROM steps WHERE run_id = ?", (run_id,)).fetchall()
        return {idx: created - start[0] for idx, created in rows}

    def save_candidate(self, run_id: str, step: int, outcome: SampleOutcome) -> None:
        self.db.execute("INSERT OR REPLACE INTO candidates VALUES (?,?,?,?,?,?,?,?,?,?,?)", (
            run_id, step, outcome.sample, outcome.sha256, outcome.path, int(outcome.passed),
            outcome.speedup_eager, outcome.hacking, outcome.verdict_path, outcome.model_dump_json(), time.time()))

    def verified(self, run_id: str, sha256: str) -> SampleOutcome | None:
        """A verdict this run already reached for this exact program (same task, same settings)."""
        row = self.db.execute("SELECT outcome FROM candidates WHERE run_id=? AND sha256=? AND verdict_path IS NOT "
                              "NULL ORDER BY created DESC LIMIT 1", (run_id, sha256)).fetchone()
        return SampleOutcome.model_validate_json(row[0]) if row else None
