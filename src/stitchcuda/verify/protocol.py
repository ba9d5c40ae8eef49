"""What the orchestrator and a worker process pass each other, as JSON files.

Kept free of torch so that the orchestrating process stays light.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.gate import GateUse
from stitchcuda.verify.verdict import (
    BaselineTiming,
    BuildReport,
    CorrectnessReport,
    CrashReport,
    DeviceInfo,
    Finding,
    ProgramProfile,
    TimingReport,
)


class WorkerRequest(BaseModel):
    mode: Literal["build", "verify", "profile", "counters"]
    reference_path: str | None = None
    candidate_path: str
    config: VerifyConfig
    device: str = "cuda:0"  # as the worker sees it (CUDA_VISIBLE_DEVICES is set for it)
    cache_root: str
    cached_baselines: dict[str, BaselineTiming] = {}
    cached_reference_profile: ProgramProfile | None = None
    result_path: str
    phase_path: str
    gate_path: str | None = None  # the GPU gate the worker takes around its GPU work (verify/gate.py)
    gate_alone: bool = False  # every section exclusive: a second try after running out of memory beside others


class WorkerResult(BaseModel):
    started_at: float = 0.0  # time.time() when the worker's Python began running our code
    ready_at: float = 0.0  # torch imported and the device initialised
    cuda_init_s: float = 0.0  # of which the CUDA context (and the profiler's first session)
    baselines_s: float = 0.0  # setting up and checking the baselines, apart from their timed rounds
    device: DeviceInfo = DeviceInfo()
    build: BuildReport = BuildReport()
    import_error: str | None = None  # candidate import failed for a reason other than its build
    reference_error: str | None = None
    crash: CrashReport | None = None
    errors: list[str] = []
    correctness: CorrectnessReport = CorrectnessReport()
    timing: TimingReport | None = None
    measured_baselines: dict[str, BaselineTiming] = {}
    findings: list[Finding] = []
    profile: ProgramProfile | None = None
    reference_profile: ProgramProfile | None = None
    operator_coverage: float | None = None
    profile_s: float = 0.0
    output_dtypes: list[str] = []
    flags_changed: list[str] = []
    reference_s: float = 0.0
    construct_s: float = 0.0  # ModelNew's construction: its random init on the CPU, .to(device), its state
    correctness_s: float = 0.0
    timing_s: float = 0.0
    weights_trial_s: float = 0.0  # the trial with new weights (inside correctness_s)
    fp64_s: float = 0.0  # re-running the reference in fp64 to judge ill-conditioned trials (inside correctness_s)
    gate: GateUse = GateUse()
    retiring: bool = True  # the worker exits after this request (a warm worker serves another otherwise)
