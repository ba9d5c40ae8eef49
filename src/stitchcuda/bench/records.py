"""Typed records of a bench: what each task's run produced, and the bench they belong to.

A bench row is the best verified program of one task's optimize run (or the verdict of one
existing solution under ``--evaluate``), reduced to what metrics and reports read. Speedup keys
are the Verifier's baseline names: ``eager``, ``eager_tf32``, ``cuda_graph``,
``torch_compile``, ``torch_compile_max_autotune`` (with ``--max-autotune``), and ``best`` (the fastest
baseline the tolerance policy accepts).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from stitchcuda.verify.failure import Failure
from stitchcuda.verify.verdict import HackLevel, SecondOpinion

TaskStatus = Literal["pending", "done", "failed", "unsupported"]
# "kernelbench": KernelBench's own speedup, its reference (torch's default flags) over the program,
# both timed by its harness (--kernelbench-harness); the others are our Verifier's timings
BASELINES = ("eager", "torch_compile", "torch_compile_max_autotune", "eager_tf32", "cuda_graph", "best", "kernelbench")


class Attempt(BaseModel):
    """One verified candidate of an agent run, for the run's timeline."""

    step: int
    seconds: float = Field(description="since the run started")
    passed: bool
    speedup_eager: float | None = None
    best_so_far: float | None = Field(None, description="best passing speedup over eager up to this attempt")
    outcome: str = Field("", description="short: passed / incorrect / build failed / hack (total) ...")


class TaskResult(BaseModel):
    task: str
    level: int | None = Field(None, description="KernelBench level, where the task came from one")
    run_id: str | None = None
    status: TaskStatus = "pending"
    error: str | None = Field(None, description="why the run failed or the task was skipped")
    failure: Failure | None = Field(None, description="why nothing passed: the reason of the task's last verdict, "
                                                      "or why it never had one; None when it passed (and in "
                                                      "benches stored before this field)")
    compiled: bool = False
    correct: bool = False
    passed: bool = Field(False, description="compiled, correct and not a total hack")
    hacking: HackLevel | None = None
    speedup: dict[str, float] = Field({}, description="per baseline name (see BASELINES)")
    milliseconds: float | None = None
    origin_share: dict[str, float] = Field({}, description="GPU time share own / library / pytorch")
    program: str | None = Field(None, description="path of the best program")
    verdict: str | None = Field(None, description="path of its verdict JSON")
    precision: str | None = None
    arithmetic: str | None = Field(None, description="what the best program computes in (Precision.arithmetic): "
                                                     "fp32, 3xTF32 (fp32 accumulate), TF32 (fp32 accumulate), ...")
    steps: int = 0
    llm_calls: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    wall_s: float = 0.0
    verifications: int = 0
    build_s: float = Field(0.0, description="building candidates, GPU hidden")
    gpu_s: float = Field(0.0, description="holding the GPU (verifying)")
    gpu_wait_s: float = Field(0.0, description="built, waiting for the GPU")
    verify_phases_s: dict[str, float] = Field({}, description="its verifications' wall time by phase (spawn, "
                                                              "cuda_init, build, reference, correctness, profile, "
                                                              "baselines, timing, ncu), summed")
    stages: dict[str, float] = Field({}, description="its wall time by stage, from the file to the verdict "
                                                     "(bench/stages.py: capture, lower, emit, profile, build, "
                                                     "gpu_wait, the verification's and KernelBench's stages, other)")
    builds: int = Field(0, description="extensions its verifications loaded or built")
    builds_cached: int = Field(0, description="of which the build cache already held")
    device: str | None = Field(None, description="the GPU it ran on (its physical index: gpu0, gpu1, ...)")
    gpu_intervals: list[tuple[float, float]] = Field([], description="(start, end) unix times its work used the GPU")
    attempts: list[Attempt] = []
    second_opinion: SecondOpinion | None = Field(None, description="KernelBench's own harness on the best program "
                                                                   "(--kernelbench-harness)")

    @property
    def why(self) -> str | None:
        """Why this judged task has no passing program, in one line; None when it passed or is
        pending. A bench stored before failures were recorded has only its error text to give."""
        if self.passed or self.status == "pending":
            return None
        return self.failure.text if self.failure is not None else self.error


class BenchInfo(BaseModel):
    """What the bench ran, on what, under which policy."""

    id: str
    suite: str
    coder: str = Field(description="offline, or the LLM model name")
    tolerance: str
    weights: str = Field("seeded", description="seeded (KernelBench's convention: same seed, nothing copied) "
                                               "or copy (the reference's state_dict loaded into ModelNew)")
    gpu: str = "unknown"
    gpus: list[str] = Field([], description="the devices the pool used")
    executor: str = Field("local", description="local or ray (with its address)")
    samples: int = 1
    created: float = 0.0
    updated: float = 0.0
    status: Literal["running", "done", "interrupted"] = "running"
    wall_s: float = 0.0


class BenchResult(BaseModel):
    info: BenchInfo
    tasks: list[TaskResult] = []
