"""The Verdict: the typed, JSON-serialisable record of one verification.

Everything downstream (agents, rewards, reports) reads these records and nothing else,
so every field says what it is measured in.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from stitchcuda.records import CostEstimate
from stitchcuda.verify.config import Tolerance

HackLevel = Literal["none", "partial", "total"]
CrashKind = Literal[
    "timeout", "segfault", "illegal_address", "cuda_error", "oom", "exception", "killed", "worker_error",
]

SCHEMA_VERSION = 1


class CompilerMessage(BaseModel):
    file: str
    line: int | None = None
    severity: Literal["error", "warning"] = "error"
    message: str
    source_line: str | None = Field(None, description="the offending line of the candidate's source, if known")
    candidate_line: int | None = Field(None, description="the same line in the candidate's .py file, if found there")


class KernelResources(BaseModel):
    """What ptxas reported for one kernel (``-Xptxas -v``)."""

    kernel: str
    arch: str | None = None
    registers: int | None = None
    spill_stores_bytes: int = 0
    spill_loads_bytes: int = 0
    stack_frame_bytes: int = 0
    shared_bytes: int = 0
    constant_bytes: int = 0
    barriers: int | None = None


class ExtensionBuild(BaseModel):
    """One ``load_inline`` call of the candidate."""

    requested_name: str
    name: str = Field(description="the unique name actually built: requested name + source hash")
    build_dir: str
    ok: bool
    cache_hit: bool
    seconds: float
    messages: list[CompilerMessage] = []
    kernels: list[KernelResources] = []
    log_tail: str = ""


class BuildReport(BaseModel):
    seconds: float = 0.0
    cache_hit: bool = Field(False, description="every extension came from the cache")
    extensions: list[ExtensionBuild] = []

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.extensions)


class ConditioningCheck(BaseModel):
    """A trial the tolerance cannot judge: the fp32 reference itself misses the fp64 value of the
    same model on the same inputs by more than the tolerance. The candidate is then judged against
    fp64, within ``factor`` times the fp32 reference's own error (largest and relative L2)."""

    reference_max_abs: float  # |fp32 reference - fp64 reference|, largest
    reference_rel_l2: float
    candidate_max_abs: float  # |candidate - fp64 reference|, largest
    candidate_rel_l2: float
    factor: float
    passed: bool


class TrialResult(BaseModel):
    """One correctness trial: fresh seed and input distribution, one order of runs."""

    index: int
    seed: int
    distribution: str
    order: Literal["reference-first", "candidate-first"]
    passed: bool
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    rel_l2_error: float | None = None
    mismatched: int = 0
    elements: int = 0
    worst: str | None = Field(None, description="where the largest error is, with both values")
    error: str | None = None
    conditioning: ConditioningCheck | None = Field(
        None, description="the fp32 reference missed fp64 beyond the tolerance: the candidate judged against fp64")


# how the Verifier's refusal of a task whose output depends on its random draws begins
SEED_DEPENDENT = "the reference draws random numbers and its output depends on them"


class SeedCheck(BaseModel):
    """A reference that draws random numbers, run on the same inputs under two seeds: its task is
    verifiable only where the two outputs agree within the tolerance."""

    seeds: tuple[int, int]
    agree: bool
    max_abs_difference: float | None = None
    error: str | None = None  # what the comparison found where they do not agree


class WeightsTrial(BaseModel):
    """Whether the candidate computes with the weights it holds now: both models run once, get the
    same perturbed state_dict (parameters and floating buffers) through ``load_state_dict``, and run
    again on the same inputs. A program that keeps what it made from its weights at construction
    or at its first call (prepacked, transposed, converted) without noticing the change fails."""

    ran: bool = False
    skipped: str = Field("", description="why it did not run (the candidate's state_dict differs from the reference's)")
    passed: bool | None = None
    max_abs_error: float | None = Field(None, description="candidate vs reference after the load")
    output_moved: float | None = Field(None, description="how far the new weights moved the reference's output "
                                                         "(max abs over up to 2^20 sampled elements an output): the "
                                                         "trial only tells where this is large")
    stale: bool = Field(False, description="the candidate's output stayed where it was before the load")
    conditioning: ConditioningCheck | None = Field(None, description="judged against the reference in fp64: the "
                                                                     "new weights left its fp32 output uncertain "
                                                                     "beyond the tolerance")


class CorrectnessReport(BaseModel):
    trials: list[TrialResult] = []
    weights_follow: WeightsTrial | None = Field(None, description="the trial with new weights loaded between two calls")
    state: list[str] = Field(
        [], description="tensors the reference's forward changes (reassigned attributes, buffers): the trials are "
                        "one sequence of calls from one starting state, and both models' state is saved and restored "
                        "around every other call (profiling, timing, baselines, the post-timing trial)")
    random_draws: SeedCheck | None = Field(
        None, description="the reference draws random numbers: the two-seed check that made it verifiable")
    weights: Literal["copied", "seeded", "none"] = Field(
        "none", description="copied: the reference's state_dict was loaded into ModelNew; seeded: same seed only",
    )
    passes_with_copied_weights: bool | None = Field(
        None, description="seeded and incorrect: whether one trial passed once the reference's state_dict was "
                          "loaded (True: right function, parameters not initialised as the reference's)")
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    rel_l2_error: float | None = None

    @property
    def passed_trials(self) -> int:
        return sum(t.passed for t in self.trials)


class TimingStats(BaseModel):
    """Per-call GPU time in milliseconds over timed trials."""

    median_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    q25_ms: float
    q75_ms: float
    std_ms: float
    spread_pct: float = Field(description="interquartile range over the median, in percent")
    trials: int


class BaselineTiming(BaseModel):
    name: str
    stats: TimingStats | None = None
    error: str | None = Field(None, description="why this baseline could not be measured")
    cached: bool = False
    measured_at: str | None = None
    passes: dict[str, bool] = Field(
        {}, description="per tolerance policy: does this baseline's own output match the fp32 reference? "
                        "A baseline that fails the policy in force (e.g. TF32 under strict) is not 'best'")
    max_abs_error: float | None = Field(None, description="of this baseline's output against the fp32 reference")
    compile_s: float | None = Field(None, description="a torch.compile baseline's first call (its compile); "
                                                      "with an error, how long it ran before its limit stopped it")
    mode: str | None = Field(None, description="the torch.compile mode it ran in, where not the one its name says: "
                                               "max-autotune-no-cudagraphs where max-autotune's CUDA graphs overwrite "
                                               "a state the model feeds back to itself")

    @property
    def settled(self) -> bool:
        """Worth keeping for the next candidate: timed, or a compile that ran past its limit."""
        return self.stats is not None or self.compile_s is not None


class TimingReport(BaseModel):
    method: str
    candidate: TimingStats
    baselines: dict[str, BaselineTiming]
    l2_flush_bytes: int = 0
    rounds: int = 0

    def best_baseline(self, tolerance: str | None = None) -> BaselineTiming | None:
        """The fastest baseline whose own output meets ``tolerance`` (any, when None)."""
        usable = [b for b in self.baselines.values()
                  if b.stats is not None and (tolerance is None or b.passes.get(tolerance, True))]
        return min(usable, key=lambda b: b.stats.median_ms) if usable else None  # type: ignore[union-attr]


class Precision(BaseModel):
    """What the candidate computes in, as far as can be seen from outside."""

    output_dtypes: list[str] = []
    source_hints: list[str] = Field([], description="reduced-precision constructs found in the candidate's source")
    flags_changed: list[str] = Field([], description="global precision flags the candidate changed")
    error_suggests: str | None = Field(None, description="what the measured error is consistent with")
    arithmetic: str | None = Field(None, description=(
        "what the candidate's math runs in, read from its own CUDA (CUTLASS math operators, mma/wmma types, "
        "cuBLAS/cuDNN compute and math modes) and torch flags: fp32, 3xTF32 (fp32 accumulate), TF32 (fp32 "
        "accumulate), bf16 (fp32 accumulate), fp16 (fp32 accumulate), bf16, fp16, fp8; several joined with "
        "' + ', most accurate first; fp32 CUDA-core kernels beside them are not listed. None: not assessed"))
    summary: str = "unknown"


KernelOrigin = Literal["own", "library", "pytorch", "unattributed"]


class KernelStat(BaseModel):
    name: str
    origin: KernelOrigin
    calls: int
    total_us: float
    share: float = Field(description="of the program's GPU time")
    streams: list[int] = []


class OpStat(BaseModel):
    """GPU time of one PyTorch operator (or module), as the Planner sees the reference."""

    name: str
    calls: int
    gpu_us: float
    share: float
    shapes: list[str] = []
    kernels: int = 0


class Peaks(BaseModel):
    """Measured ceilings of this GPU, the most generous of what the candidate might use."""

    gpu: str
    fp32_tflops: float
    tf32_tflops: float
    bf16_tflops: float
    copy_gbps: float = Field(description="device-to-device copy, bytes read + written per second / 1e9")


class Roofline(BaseModel):
    """The reference's work (FLOPs, minimum bytes) against this GPU's ceilings. ``floor_ms`` uses the
    best peak of any arithmetic (what no program can beat: the impossible-speedup check); the
    ``arithmetic_*`` fields use the peak of the candidate's own arithmetic (see verify.peaks)."""

    flops: float
    min_bytes: float = Field(description="inputs + parameters read once, outputs written once")
    floor_ms: float = Field(description="max(flops / best peak, min bytes / copy bandwidth)")
    compute_floor_ms: float
    memory_floor_ms: float
    peaks: Peaks
    arithmetic: str | None = Field(None, description="the candidate's arithmetic (Precision.arithmetic) that "
                                                     "the fields below use; None in a reference-only profile")
    arithmetic_tflops: float | None = Field(None, description="the peak of that arithmetic here (the fastest of "
                                                              "a mixture); 3xTF32: a third of TF32's")
    arithmetic_peak: str | None = Field(None, description="where that peak comes from: measured, or nominal dense "
                                                          "(data-sheet) figures of this GPU")
    arithmetic_compute_floor_ms: float | None = Field(None, description="flops / arithmetic peak")
    arithmetic_floor_ms: float | None = Field(None, description="max(flops / arithmetic peak, memory floor)")

    @property
    def floor_for_candidate_ms(self) -> float:
        """The floor at the candidate's arithmetic when known, else at the best peak."""
        return self.arithmetic_floor_ms if self.arithmetic_floor_ms else self.floor_ms


class ProgramProfile(BaseModel):
    """One forward pass seen by torch.profiler: where the GPU time goes and how busy the GPU is."""

    gpu_time_us: float = 0.0
    window_us: float = Field(0.0, description="first kernel start to last kernel end")
    idle_share: float = Field(0.0, description="of the window with no kernel running (launch gaps)")
    launches: int = 0
    origin_share: dict[str, float] = Field({}, description="GPU time share per origin: own / library / pytorch")
    kernels: list[KernelStat] = []
    ops: list[OpStat] = Field([], description="PyTorch operators with their GPU time (reference profiles)")
    modules: list[OpStat] = Field([], description="submodules with their GPU time (reference profiles)")
    copies: dict[str, int] = Field({}, description="memcpy count per direction (HtoD, DtoH, DtoD)")
    copy_us: float = 0.0
    syncs: int = Field(0, description="host-side synchronisations (device, stream, event, blocking memcpy)")
    streams: list[int] = []
    roofline: Roofline | None = None


BoundLabel = Literal["memory-bound", "compute-bound", "latency-bound"]


class KernelCounters(BaseModel):
    """One kernel's hardware counters from Nsight Compute, summed or averaged over its launches."""

    name: str
    origin: KernelOrigin
    launches: int
    duration_us: float
    sm_pct: float = Field(description="SM throughput, % of peak sustained")
    memory_pct: float = Field(description="compute-memory throughput (L1/L2/DRAM), % of peak sustained")
    dram_pct: float = Field(description="DRAM throughput, % of peak sustained")
    occupancy_pct: float | None = Field(None, description="achieved occupancy: active warps, % of peak")
    registers: int | None = None
    label: BoundLabel
    why: str = Field(description="the numbers behind the label")


class CounterReport(BaseModel):
    """Nsight Compute's view of the candidate's top kernels (``--ncu``), or why there is none."""

    status: Literal["not_requested", "ok", "unavailable", "failed"] = "not_requested"
    detail: str = ""
    kernels: list[KernelCounters] = []
    estimate: str | None = Field(None, description="timing-based roofline estimate, when counters are missing")
    seconds: float = 0.0


class Finding(BaseModel):
    check: str
    detail: str
    level: HackLevel = Field("none", description="the hacking level this finding implies on its own")
    source: Literal["static", "dynamic"] = Field("dynamic", description="read from the source, or seen at run time")


class HackingReport(BaseModel):
    level: HackLevel = "none"
    findings: list[Finding] = []
    origin_share: dict[str, float] = Field({}, description="share of the candidate's GPU time per kernel origin")
    operator_coverage: float | None = Field(
        None, description="share of the reference's GPU time spent in operators the candidate no longer calls")


class CrashReport(BaseModel):
    kind: CrashKind
    phase: str = Field(description="where the worker was: build, import, construct, correctness, timing, ...")
    message: str
    exit_code: int | None = None
    signal: str | None = None
    output_tail: str = ""


class DeviceInfo(BaseModel):
    name: str = "unknown"
    capability: str | None = None
    torch: str | None = None
    cuda: str | None = None
    l2_bytes: int | None = None


class WallTimes(BaseModel):
    """Where a verification's wall time went, in seconds."""

    build_s: float = 0.0
    worker_start_s: float = Field(0.0, description="spawn_s + cuda_init_s")
    spawn_s: float = Field(0.0, description="from starting (or handing the request to) the worker to its code "
                                            "running: the Python interpreter and imports")
    cuda_init_s: float = Field(0.0, description="the CUDA context and the profiler's first session")
    warm_start: bool = Field(False, description="the worker was started ahead, in standby, and was ready")
    reference_s: float = 0.0
    construct_s: float = Field(0.0, description="ModelNew's construction: its random init on the CPU (the "
                                                "reference's seed), moving it to the device, its state")
    correctness_s: float = Field(0.0, description="the trials, the new-weights trial and the one after the timing")
    baselines_s: float = Field(0.0, description="setting up the baselines (CUDA graph capture, torch.compile) and "
                                                "checking their accuracy; their timed rounds are in timing_s")
    timing_s: float = Field(0.0, description="the interleaved timed rounds of the candidate and the baselines, "
                                             "and the probe for work escaping them before")
    profile_s: float = 0.0
    ncu_s: float = 0.0
    weights_trial_s: float = Field(0.0, description="the trial with new weights (part of correctness_s)")
    fp64_s: float = Field(0.0, description="the fp64 re-judgement of ill-conditioned trials (part of correctness_s)")
    checks_s: float = Field(0.0, description="in the verifying process: the static checks of the candidate's "
                                             "source and the judgement of the worker's result")
    gpu_wait_s: float = Field(0.0, description="waiting at the GPU gate, the second opinion's waits included")
    gpu_shared_s: float = Field(0.0, description="inside shared sections of the gate (trials beside others)")
    gpu_exclusive_s: float = Field(0.0, description="inside the exclusive section (timing alone)")
    gpu_intervals: list[tuple[float, float]] = Field([], description="(start, end) unix times the GPU was in use")
    second_opinion: dict[str, float] = Field({}, description="KernelBench's harness by stage: start, build, "
                                                             "correctness, timing, its GPU wait")
    total_s: float = 0.0

    def split(self) -> dict[str, float]:
        """The phases that add up to (most of) total_s, for machinery figures (the weights trial
        and the fp64 re-judgement apart from the other correctness trials)."""
        own_trials = max(self.correctness_s - self.weights_trial_s - self.fp64_s, 0.0)
        kb = sum(v for k, v in self.second_opinion.items() if k != "gpu_wait")
        return {"checks": self.checks_s, "spawn": self.spawn_s, "cuda_init": self.cuda_init_s, "build": self.build_s,
                "gpu_wait": self.gpu_wait_s, "reference": self.reference_s, "construct": self.construct_s,
                "correctness": own_trials,
                "weights_trial": self.weights_trial_s, "fp64": self.fp64_s, "profile": self.profile_s,
                "baselines": self.baselines_s, "timing": self.timing_s, "ncu": self.ncu_s, "second_opinion": kb}


class SecondOpinion(BaseModel):
    """Another harness's judgement of the same reference and candidate (``--kernelbench-harness``),
    run in its own process after ours. It never changes our verdict; it is shown beside it."""

    source: Literal["kernelbench"] = "kernelbench"
    checkout: str | None = Field(None, description="the harness's checkout")
    compiled: bool | None = Field(None, description="None: the harness could not judge (see error)")
    correct: bool | None = None
    runtime_ms: float | None = Field(None, description="the harness's own mean time of the candidate")
    ref_runtime_ms: float | None = Field(None, description="the harness's mean time of its reference, under torch's "
                                                           "default flags (cuDNN convolutions in TF32)")
    timed_apart: bool = Field(False, description="it judged the program wrong (through its TF32 reference, or at its "
                                                 "fp32 1e-4 while within its v0.1 1e-2, or on a task it cannot "
                                                 "judge: a control failed too) and timed nothing: both "
                                                 "were timed by its own timing function afterwards, in the same "
                                                 "process, under torch's default flags")
    detail: str = Field("", description="what the harness reported beside its verdict")
    correct_true_fp32: bool | None = Field(None, description="where it said incorrect: its verdict again against a "
                                                             "reference run in true fp32 (its own runs cuDNN "
                                                             "convolutions in TF32, torch's default)")
    correct_v01: bool | None = Field(None, description="where it said incorrect against both references: its verdict "
                                                       "again at the fp32 tolerance of its v0/v0.1 (atol = rtol = "
                                                       "1e-2), which published results used; its harness now takes "
                                                       "1e-4, which TF32 and bf16 arithmetic miss by design")
    reordered_correct: bool | None = Field(None, description="where it said incorrect against a true-fp32 "
                                                             "reference too: its verdict on the reference itself run "
                                                             "channels-last in fp32 (another order of the same sums)")
    exact_correct: bool | None = Field(None, description="likewise, on the exact answer (the reference run in float64, "
                                                         "rounded to float32)")
    control_detail: str = Field("", description="what it reported of the controls (verify/harness_controls.py) "
                                                 "and how far each missed beside the program")
    judgeable: bool = Field(True, description="False where a control failed by at least a quarter of the "
                                              "program's miss: its tolerance is below its fp32 reference's own "
                                              "rounding spread on this task, and its incorrect says nothing of "
                                              "the program")
    error: str | None = Field(None, description="why the harness could not judge: not found, did not load, "
                                                "timed out, crashed, no CUDA GPU")
    seconds: float = 0.0
    stages: dict[str, float] = Field({}, description="where its seconds went: start (its process, torch and its "
                                                     "package), build (loading the program's extensions), "
                                                     "correctness, timing, gpu_wait (at the GPU gate)")
    builds_cached: bool | None = Field(None, description="it loaded the extensions our build made (no nvcc of its own)")
    gpu_intervals: list[tuple[float, float]] = Field([], description="(start, end) unix times it used the GPU")
    agrees: bool | None = Field(None, description="its correctness equals ours; None when it could not judge")

    @property
    def failed_control(self) -> str | None:
        """The control it found incorrect too (the first: the exact one is asked only where the
        reordered one passed), or None."""
        if self.reordered_correct is False:
            return "the reference run channels-last in fp32"
        if self.exact_correct is False:
            return "the exact answer (the reference in float64)"
        return None

    @property
    def speedup(self) -> float | None:
        """KernelBench's own speedup: its reference's time over the candidate's, both by its harness."""
        if self.ref_runtime_ms and self.runtime_ms:
            return self.ref_runtime_ms / self.runtime_ms
        return None


class SourceRef(BaseModel):
    name: str
    path: str | None = None
    sha256: str


class Verdict(BaseModel):
    schema_version: int = SCHEMA_VERSION
    task: SourceRef
    candidate: SourceRef
    tolerance: Tolerance
    device: DeviceInfo = DeviceInfo()
    compiled: bool = False
    correct: bool = False
    passed: bool = Field(False, description="compiled, correct and not a total hack")
    errors: list[str] = []
    crash: CrashReport | None = None
    reference_error: str | None = Field(None, description="the reference itself could not run: the task is unusable")
    build: BuildReport = BuildReport()
    correctness: CorrectnessReport = CorrectnessReport()
    timing: TimingReport | None = None
    speedup: dict[str, float] = Field({}, description="baseline median / candidate median, per baseline and 'best'")
    precision: Precision = Precision()
    hacking: HackingReport = HackingReport()
    profile: ProgramProfile | None = Field(None, description="the candidate's forward pass under torch.profiler")
    estimate: CostEstimate | None = Field(None, description="a generated program's cost-model estimate, with the "
                                                           "measured times beside it")
    reference_profile: ProgramProfile | None = None
    counters: CounterReport = CounterReport()
    feedback: str = ""
    static_only: bool = Field(False, description="only the static checks ran (--static-only): nothing was built or run")
    wall: WallTimes = WallTimes()
    second_opinion: SecondOpinion | None = Field(None, description="KernelBench's own harness on the same "
                                                                   "pair (--kernelbench-harness)")
