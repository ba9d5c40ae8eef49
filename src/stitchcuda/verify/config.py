"""How a verification is run: tolerance policy, trials, timing budget, limits.

One typed record with named presets, so the CLI, tests and benchmarks share defaults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

ToleranceName = Literal["strict", "paper"]
# seeded: KernelBench's convention. ModelNew is built under the reference's seed and nothing is
# copied, so a program must create its parameters as the reference does. copy: the reference's
# state_dict is loaded into ModelNew, for users who verify against given weights on purpose.
WeightsConvention = Literal["seeded", "copy"]


class Tolerance(BaseModel):
    """atol/rtol per output dtype class; an element passes when |c - r| <= atol + rtol * |r|."""

    name: ToleranceName
    fp32_atol: float
    fp32_rtol: float
    half_atol: float
    half_rtol: float

    def for_dtype(self, dtype_name: str) -> tuple[float, float]:
        """(atol, rtol) for an output dtype given by name ("float32", "bfloat16", ...)."""
        if dtype_name in ("float16", "bfloat16"):
            return self.half_atol, self.half_rtol
        if dtype_name.startswith(("float", "complex")):
            return self.fp32_atol, self.fp32_rtol
        return 0.0, 0.0  # integer and bool outputs must match exactly


TOLERANCES: dict[str, Tolerance] = {
    # Today's KernelBench.
    "strict": Tolerance(name="strict", fp32_atol=1e-4, fp32_rtol=1e-4, half_atol=1e-2, half_rtol=1e-2),
    # KernelBench v0.1 and the StitchCUDA / CUDA Agent papers.
    "paper": Tolerance(name="paper", fp32_atol=1e-2, fp32_rtol=1e-2, half_atol=1e-2, half_rtol=1e-2),
}


# the baselines that compile first (torch.compile's modes): their set-up is allowed compile_limit_s each
COMPILED_BASELINES = {"torch_compile": "default", "torch_compile_max_autotune": "max-autotune"}


class VerifyConfig(BaseModel):
    """Everything that decides how one candidate is checked and timed."""

    tolerance: ToleranceName = "strict"
    trials: int = Field(5, ge=1, description="correctness trials, each with a fresh seed and input distribution")
    seed: int = 42
    weights: WeightsConvention = Field(
        "seeded", description="seeded: ModelNew built under the reference's seed, nothing copied (KernelBench's "
                              "convention); copy: the reference's state_dict loaded into ModelNew")
    device: str = Field("cuda:0", description="cuda:N, or cpu (for tests: wall-clock timing, no baselines but eager)")
    timing: bool = True
    profile: bool = Field(True, description="profile the candidate and the reference once (torch.profiler, roofline)")
    ncu: bool = Field(False, description="read the top kernels' hardware counters with Nsight Compute (opt-in: "
                                         "a replayed forward costs seconds to minutes)")
    ncu_kernels: int = Field(5, ge=1, description="how many of the candidate's kernels ncu reports, longest first")
    ncu_timeout_s: float = Field(300.0, gt=0)
    compile_baseline: bool = Field(True, description="measure torch.compile (slow the first time; cached)")
    compile_max_autotune: bool = Field(False, description="also measure torch.compile(mode='max-autotune'): "
                                                          "minutes to compile, so cached per task and GPU as well")
    compile_limit_s: float = Field(300.0, gt=0, description="a torch.compile baseline still compiling after this "
                                                            "is recorded as over the limit, not timed (and not tried again)")
    baseline_cache: bool = True
    warmup: int = Field(3, ge=1)
    min_timing_trials: int = Field(30, ge=3)
    max_timing_trials: int = Field(300, ge=3)
    timing_budget_s: float = Field(5.0, gt=0, description="target seconds of timed rounds")
    timeout_s: float = Field(300.0, gt=0, description="wall-clock limit of a worker, build time excluded")
    build_timeout_s: float = Field(900.0, gt=0)
    build_jobs: int = Field(0, ge=0, description="parallel candidate builds; 0 = half the CPU cores")
    kernelbench_harness: str | None = Field(
        None, description="a KernelBench checkout: its eval_kernel_against_ref also judges each candidate, in a "
                          "process of its own, as a second opinion shown beside our verdict")

    @property
    def tol(self) -> Tolerance:
        return TOLERANCES[self.tolerance]

    @property
    def baselines(self) -> list[str]:
        """The baselines timed beside a candidate on a GPU (eager itself always is)."""
        compiled = (["torch_compile"] if self.compile_baseline else []) + \
            (["torch_compile_max_autotune"] if self.compile_max_autotune else [])
        return ["eager_tf32", "cuda_graph", *compiled]

    def worker_limit_s(self, cached: dict) -> float:
        """``timeout_s``, plus ``compile_limit_s`` for each torch.compile baseline not settled in ``cached``
        (a name -> BaselineTiming dict of this task's stored baselines)."""
        uncached = [n for n in self.baselines if n in COMPILED_BASELINES and not (n in cached and cached[n].settled)]
        return self.timeout_s + self.compile_limit_s * len(uncached)


PRESETS: dict[str, VerifyConfig] = {
    "default": VerifyConfig(),
    # CPU tests: tiny, no GPU-only baselines.
    "tiny-debug": VerifyConfig(
        device="cpu", trials=2, compile_baseline=False, baseline_cache=False,
        min_timing_trials=3, max_timing_trials=5, timing_budget_s=0.5, timeout_s=120,
    ),
    # Quick look while iterating: fewer trials, no torch.compile.
    "quick": VerifyConfig(trials=3, compile_baseline=False, timing_budget_s=3.0, min_timing_trials=20),
    # Sweeps over many tasks (a benchmark of a whole level): the quick checks, fewer timed rounds.
    "survey": VerifyConfig(trials=3, compile_baseline=False, timing_budget_s=1.0, min_timing_trials=5,
                           max_timing_trials=100),
}
