"""The records of an optimize run: plan, steps, samples, best program and resumable state; and
the cost model's estimate, which the compiler writes into a program and the Verifier reads back.

The agents pass them to each other and the run store (``stitchcuda.store``) keeps them as JSON.
They sit at the bottom of the package (pydantic only, nothing from stitchcuda) so that the store
can keep them typed without importing the agents that make them.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field

Action = Literal["fix", "optimize", "next", "replan", "done"]
Skill = Literal["scratch", "feedback"]
# unverified: the offline Coder wrote (and compile-checked) a program on a machine without a GPU
# interrupted is never stored: it is how a run stored as running shows once its process is gone
RunStatus = Literal["running", "done", "stopped", "failed", "unverified", "interrupted"]


class Subtask(BaseModel):
    id: int = Field(description="1-based position in the plan")
    title: str
    operators: list[str] = Field(description="the reference's operators (or modules) this subtask replaces")
    fusion: str = Field("", description="what is fused into one kernel and where the boundary lies")
    layout: str = Field("", description="data-layout and dtype contracts with the neighbouring subtasks")
    host: str = Field("", description="host orchestration: preallocated buffers, CUDA graph capture, streams")
    time_share: float = Field(0.0, ge=0.0, le=1.0, description="its share of the reference's GPU time")
    target_speedup: float = Field(1.0, gt=0.0, description="speedup over eager at which the subtask is done")


class Plan(BaseModel):
    version: int = 1
    rationale: str = ""
    subtasks: list[Subtask] = Field(min_length=1)
    source: Literal["llm", "default", "offline"] = "llm"


class Decision(BaseModel):
    action: Action
    reason: str


class SampleOutcome(BaseModel):
    """One Coder sample of a step and what the Verifier made of it."""

    sample: int
    sha256: str | None = None
    path: str | None = None
    extract_error: str | None = Field(None, description="no program could be taken from the answer")
    llm_error: str | None = None
    passed: bool = False
    correct: bool = False
    compiled: bool = False
    hacking: str | None = None
    speedup_eager: float | None = None
    speedup_best: float | None = None
    milliseconds: float | None = None
    feedback: str = ""
    verdict_path: str | None = None


class StepRecord(BaseModel):
    index: int
    subtask: int
    skill: Skill
    samples: list[SampleOutcome] = []
    chosen: int | None = Field(None, description="the sample the step keeps")
    decision: Decision | None = None


class Best(BaseModel):
    step: int
    subtask: int
    sha256: str
    path: str
    speedup_eager: float
    speedup_best: float | None = None
    milliseconds: float
    hacking: str


class RunState(BaseModel):
    """Everything needed to resume a run after the last finished step."""

    run_id: str
    task: str
    task_sha256: str
    task_path: str | None = Field(None, description="the file the task was read from (the run keeps its own copy, "
                                                    "task.py, for a resume)")
    status: RunStatus = "running"
    stop_reason: str | None = None
    plan: Plan | None = None
    subtask_index: int = 0
    attempts_on_subtask: int = 0
    failures_in_row: int = 0
    no_improvement: int = 0
    replans: int = 0
    steps_done: int = 0
    program: str | None = Field(None, description="path of the accepted program the next step builds on")
    program_feedback: str = ""
    program_verdict: str | None = Field(None, description="path of the verdict on ``program``")
    fix_program: str | None = Field(None, description="path of the failed program the next fix starts from")
    fix_feedback: str = ""
    fix_verdict: str | None = Field(None, description="path of the verdict on ``fix_program``")
    note: str = Field("", description="a remark for the next Coder prompt (an unusable last answer)")
    last_action: Action | None = None
    subtask_best: float | None = Field(None, description="best speedup over eager within the current subtask")
    best: Best | None = None
    failures: list[str] = Field([], description="short history of what failed, for replanning")
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    stages: dict[str, float] = Field({}, description="where the run's wall time went, by stage (verify/stages.py)")


class CostEstimate(BaseModel):
    """The compiler's cost model's estimate, from the ``Estimate {...}`` line of a generated
    program's docstring, and what the Verifier measured beside it."""

    table: str = Field(description="the GPU table it assumed")
    assumed: bool = Field(False, description="written where no GPU was: the default table")
    device: str = ""
    operators: int = Field(0, description="products and convolutions estimated")
    ms: float = Field(0.0, description="their estimated time, summed")
    paths: dict[str, int] = Field({}, description="how many took each path (cublas, split, cutlass, simt)")
    measured_library_ms: float | None = Field(None, description="the profiled forward's library kernels (cuBLAS, "
                                                                "cuDNN): most of what the estimate covers")
    measured_forward_ms: float | None = Field(None, description="the timed forward, median")

    @classmethod
    def from_source(cls, source: str) -> CostEstimate | None:
        found = re.search(r"^\s*Estimate (\{[^\n]*\})\s*$", source, re.M)
        if not found:
            return None
        try:
            return cls.model_validate_json(found[1])
        except ValueError:
            return None
