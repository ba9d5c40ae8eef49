"""Typed records the agents pass each other: a Coder step as data, and the run's records.

The run's records (plan, steps, samples, state) live in ``stitchcuda.records``, below the run
store that keeps them; they are named here too so the agents read all their records from one
place. ``CoderRequest`` stays here: it carries a Verifier verdict, and the store never sees it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from stitchcuda.records import Action, Best, Decision, Plan, RunState, SampleOutcome, StepRecord, Subtask
from stitchcuda.verify.verdict import Verdict

__all__ = ["Action", "Best", "CoderRequest", "Decision", "Plan", "RunState", "SampleOutcome", "StepRecord", "Subtask"]


class CoderRequest(BaseModel):
    """One Coder step as data. An LLM reads it rendered into a prompt; a Coder that is a program
    (the offline compiler) reads these fields, so rewording the prompt never changes its search."""

    skill: Literal["scratch", "fix", "optimize"]
    program: str | None = Field(None, description="source of the program the step starts from")
    verdict: Verdict | None = Field(None, description="the Verifier's verdict on that program")
    sample: int = Field(0, ge=0, description="which of the step's samples this answer is (0: the first)")
