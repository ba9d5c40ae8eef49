"""Skill datasets for training the Coder, from the run store's trajectories (and task lists).

Every Coder call of a run is one sample of its skill: ``scratch`` (skill 1: task + plan +
subtask -> program) or ``feedback`` (skill 2: program + the Verifier's feedback -> a better
program), with the prompt exactly as the agent sent it, the answer it got, the reference and
the verdict of what the answer built (for offline reward computation and filtering). Tasks from
the bundled suite or a user folder add skill-1 prompts with no answer yet (GRPO needs only a
prompt and the reference: the reward comes from verifying what the model writes).

Samples are de-duplicated on (prompt, answer) and split by task, so that no evaluation task is
ever seen in training; the split is a stable hash of the task's source unless tasks are named.
Written as Parquet (one file per split, loadable with ``datasets.load_dataset("parquet", ...)``)
with a manifest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from stitchcuda.agents.coder import feedback_in_prompt, scratch_prompt
from stitchcuda.agents.planner import PlanContext, default_plan
from stitchcuda.files import write_atomic
from stitchcuda.store import RunStore
from stitchcuda.task import resolve_tasks
from stitchcuda.task.record import Task

Split = Literal["train", "eval"]


class SkillSample(BaseModel):
    id: str = Field(description="sha256 of the prompt and the answer: the de-duplication key")
    task: str
    task_sha256: str
    split: Split = "train"
    skill: int = Field(description="1: from scratch; 2: from feedback")
    prompt: list[dict[str, str]] = Field(description="the chat messages exactly as sent to the Coder")
    completion: str | None = Field(None, description="the answer the Coder gave, if any")
    reference: str = Field(description="the PyTorch reference program, for verifying new answers")
    feedback: str = Field("", description="for skill 2: the Verifier feedback the prompt carries")
    verdict: str | None = Field(None, description="the verdict JSON of what the answer built, if it was verified")
    passed: bool | None = None
    speedup_eager: float | None = None
    hacking: str | None = None
    source: str = Field(description="run:<id>/step:<n>/sample:<k>, or tasks:<spec>")
    model: str | None = None


class DatasetManifest(BaseModel):
    samples: dict[str, int]
    by_skill: dict[str, dict[str, int]]
    tasks: dict[str, list[str]]
    duplicates_dropped: int
    runs: list[str]
    task_sources: list[str]
    files: dict[str, str]


def sample_id(prompt: list[dict[str, str]], completion: str | None) -> str:
    return hashlib.sha256(json.dumps([prompt, completion], sort_keys=True).encode()).hexdigest()


def run_samples(store: RunStore, run_id: str) -> list[SkillSample]:
    """One sample per Coder call of a run that got an answer."""
    run_dir = store.run_dir(run_id)
    task = Task(name=store.load_state(run_id).task, source=(run_dir / "task.py").read_text())
    steps = {s.index: s for s in store.steps(run_id)}
    out = []
    for step_index, sample, model, prompt, answer in store.coder_calls(run_id):
        step = steps.get(step_index)  # type: ignore[arg-type]
        if step is None:
            continue  # the call of a step that never finished: no verdict, and a resume asks again
        outcome = next((o for o in step.samples if o.sample == (sample or 0)), None)
        verdict = None
        if outcome is not None and outcome.verdict_path and Path(outcome.verdict_path).exists():
            verdict = Path(outcome.verdict_path).read_text()
        out.append(SkillSample(
            id=sample_id(prompt, answer), task=task.name, task_sha256=task.sha256,
            skill=1 if step.skill == "scratch" else 2, prompt=prompt, completion=answer, reference=task.source,
            feedback=feedback_in_prompt(prompt[-1]["content"]) if step.skill == "feedback" and prompt else "",
            verdict=verdict,
            passed=outcome.passed if outcome else None, speedup_eager=outcome.speedup_eager if outcome else None,
            hacking=outcome.hacking if outcome else None,
            source=f"run:{run_id}/step:{step_index}/sample:{sample or 0}", model=model))
    return out


def task_samples(tasks: Iterable[Task], spec: str, tolerance: str = "strict") -> list[SkillSample]:
    """Skill-1 prompts for tasks without trajectories: the whole forward as one subtask, as the
    Coder's first step under the default plan sees it."""
    out = []
    for task in tasks:
        plan = default_plan(PlanContext(task, "", None, "", None, "", tolerance))
        messages = scratch_prompt(task, plan, plan.subtasks[0], None, "", "", tolerance)
        prompt = [m.model_dump() for m in messages]
        out.append(SkillSample(id=sample_id(prompt, None), task=task.name, task_sha256=task.sha256, skill=1,
                               prompt=prompt, reference=task.source, source=f"tasks:{spec}"))
    return out


def assign_splits(samples: list[SkillSample], eval_fraction: float = 0.2,
                  eval_tasks: set[str] | None = None) -> None:
    """Whole tasks go to eval: the named ones, else those whose source hash falls under the fraction."""
    for s in samples:
        if eval_tasks is not None:
            s.split = "eval" if s.task in eval_tasks else "train"
        else:
            bucket = int(s.task_sha256[:8], 16) / 0xFFFFFFFF
            s.split = "eval" if bucket < eval_fraction else "train"


def dedupe(samples: list[SkillSample]) -> tuple[list[SkillSample], int]:
    seen: set[str] = set()
    kept = []
    for s in samples:
        if s.id not in seen:
            seen.add(s.id)
            kept.append(s)
    return kept, len(samples) - len(kept)


def write_dataset(samples: list[SkillSample], out_dir: Path, runs: list[str], task_sources: list[str],
                  dropped: int) -> DatasetManifest:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for split in ("train", "eval"):
        rows = [s.model_dump() for s in samples if s.split == split]
        for r in rows:
            r["prompt"] = [{"role": m["role"], "content": m["content"]} for m in r["prompt"]]
        table = pa.Table.from_pylist(rows, schema=_schema())
        path = out_dir / f"{split}.parquet"
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        write_atomic(path, buffer.getvalue().to_pybytes())
        files[split] = str(path)
    manifest = DatasetManifest(
        samples={sp: sum(s.split == sp for s in samples) for sp in ("train", "eval")},
        by_skill={sp: {f"skill{k}": sum(s.split == sp and s.skill == k for s in samples) for k in (1, 2)}
                  for sp in ("train", "eval")},
        tasks={sp: sorted({s.task for s in samples if s.split == sp}) for sp in ("train", "eval")},
        duplicates_dropped=dropped, runs=runs, task_sources=task_sources, files=files)
    write_atomic(out_dir / "manifest.json", manifest.model_dump_json(indent=1))
    return manifest


def _schema():
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema([("id", pa.string()), ("task", pa.string()), ("task_sha256", pa.string()),
                      ("split", pa.string()), ("skill", pa.int32()), ("prompt", pa.list_(message)),
                      ("completion", pa.string()), ("reference", pa.string()), ("feedback", pa.string()),
                      ("verdict", pa.string()), ("passed", pa.bool_()), ("speedup_eager", pa.float64()),
                      ("hacking", pa.string()), ("source", pa.string()), ("model", pa.string())])


def build_dataset(workspace: Path, runs: list[str], out_dir: Path, task_specs: list[str] | None = None,
                  eval_fraction: float = 0.2, eval_tasks: set[str] | None = None,
                  tolerance: str = "strict") -> DatasetManifest:
    samples: list[SkillSample] = []
    run_ids: list[str] = []
    if runs:
        store = RunStore(workspace)
        wanted = [r.id for r in store.runs(limit=100000)] if runs == ["all"] else [store.resolve(r) for r in runs]
        for run_id in wanted:
            run_ids.append(run_id)
            samples += run_samples(store, run_id)
    for spec in task_specs or []:
        samples += task_samples(resolve_tasks(spec), spec, tolerance)
    samples, dropped = dedupe(samples)
    assign_splits(samples, eval_fraction, eval_tasks)
    return write_dataset(samples, out_dir, run_ids, task_specs or [], dropped)
