"""The pass/fail rules: from a worker's report (or its death) to a Verdict."""

from __future__ import annotations

from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.judge import judge
from stitchcuda.verify.protocol import WorkerResult
from stitchcuda.verify.timing import summarize
from stitchcuda.verify.verdict import (
    BaselineTiming,
    BuildReport,
    CompilerMessage,
    CorrectnessReport,
    CrashReport,
    ExtensionBuild,
    Finding,
    KernelResources,
    TimingReport,
    TrialResult,
)

TASK = Task(name="t", source="class Model: pass\ndef get_inputs(): pass\ndef get_init_inputs(): pass\n")
CAND = Candidate(name="c", source="class ModelNew: pass\n")
CONFIG = VerifyConfig(trials=2)


def _ext(ok=True, **kw) -> ExtensionBuild:
    return ExtensionBuild(requested_name="ext", name="ext_0123", build_dir="/tmp/x", ok=ok, cache_hit=False,
                          seconds=1.0, **kw)


def _trials(*passed: bool) -> CorrectnessReport:
    return CorrectnessReport(trials=[
        TrialResult(index=i, seed=i, distribution="given", order="reference-first", passed=p,
                    error=None if p else "output: 3 of 9 elements outside atol=0.0001")
        for i, p in enumerate(passed)
    ])


def _timing(cand_ms: float, **baselines: float) -> TimingReport:
    return TimingReport(method="test", candidate=summarize([cand_ms] * 5), baselines={
        name: BaselineTiming(name=name, stats=summarize([ms] * 5)) for name, ms in baselines.items()
    })


def good_result(**updates) -> WorkerResult:
    result = WorkerResult(ready_at=1.0, build=BuildReport(extensions=[_ext()]), correctness=_trials(True, True),
                          timing=_timing(2.0, eager=6.0, cuda_graph=4.0, torch_compile=3.0))
    return result.model_copy(update=updates)


def test_pass_and_speedups():
    v = judge(TASK, CAND, CONFIG, good_result())
    assert v.compiled and v.correct and v.passed and v.errors == []
    assert v.speedup == {"eager": 3.0, "cuda_graph": 2.0, "torch_compile": 1.5, "best": 1.5}
    assert "1.50x vs the best baseline (torch_compile" in v.feedback


def test_total_hack_fails_whatever_its_correctness():
    findings = [Finding(check="no_custom_kernels", detail="all PyTorch", level="total"),
                Finding(check="global_state", detail="changed a flag", level="none")]
    v = judge(TASK, CAND, CONFIG, good_result(findings=findings))
    assert v.correct and not v.passed and v.hacking.level == "total"
    assert any("all PyTorch" in e for e in v.errors)


def test_partial_hack_still_passes():
    v = judge(TASK, CAND, CONFIG, good_result(findings=[Finding(check="x", detail="y", level="partial")]))
    assert v.passed and v.hacking.level == "partial"


def test_build_failure_names_file_and_line():
    msg = CompilerMessage(file="cuda.cu", line=12, message='expected a ";"', source_line="x = 1")
    result = WorkerResult(ready_at=1.0, build=BuildReport(extensions=[_ext(ok=False, messages=[msg])]))
    v = judge(TASK, CAND, CONFIG, result)
    assert not v.compiled and not v.correct and not v.passed
    assert v.errors == ["build of 'ext' failed at cuda.cu:12: expected a \";\""]
    assert "cuda.cu:12" in v.feedback and "x = 1" in v.feedback


def test_missing_trials_are_not_correct():
    v = judge(TASK, CAND, CONFIG, good_result(correctness=_trials(True)))  # 1 of 2 ran
    assert v.compiled and not v.correct


def test_wrong_trial():
    v = judge(TASK, CAND, CONFIG, good_result(correctness=_trials(True, False), timing=None))
    assert not v.correct and v.errors[0].startswith("incorrect in 1 of 2 trials")
    assert v.speedup == {}


def test_crash_during_correctness_keeps_compiled():
    crash = CrashReport(kind="illegal_address", phase="correctness", message="CUDA error: an illegal memory access")
    v = judge(TASK, CAND, CONFIG, good_result(correctness=_trials(True), timing=None), crash=crash)
    assert v.compiled and not v.correct and v.crash.kind == "illegal_address"
    assert "illegal_address during correctness" in v.errors[0]
    assert "index bounds" in v.feedback


def test_crash_before_import_is_not_compiled():
    crash = CrashReport(kind="segfault", phase="build", message="died")
    v = judge(TASK, CAND, CONFIG, WorkerResult(ready_at=1.0), crash=crash)
    assert not v.compiled


def test_dead_worker_without_checkpoint():
    v = judge(TASK, CAND, CONFIG, None, crash=CrashReport(kind="killed", phase="start", message="gone"))
    assert not v.compiled and not v.passed and v.errors


def test_static_error():
    v = judge(TASK, CAND, CONFIG, None, static_error="the candidate defines no ModelNew")
    assert not v.compiled and v.feedback == "the candidate defines no ModelNew"


def test_reference_error_is_reported_as_such():
    v = judge(TASK, CAND, CONFIG, WorkerResult(ready_at=1.0, reference_error="boom"))
    assert not v.compiled and v.errors[0] == "the reference failed to run: boom"
    assert v.feedback.startswith("The reference program itself failed")


def test_spills_reach_the_feedback():
    kernel = KernelResources(kernel="gemm", registers=255, spill_stores_bytes=64, spill_loads_bytes=64)
    v = judge(TASK, CAND, CONFIG, good_result(build=BuildReport(extensions=[_ext(kernels=[kernel])])))
    assert "spills registers" in v.feedback


def test_timing_summary_spread():
    stats = summarize([1.0, 1.0, 1.1, 1.2, 2.0])
    assert stats.median_ms == 1.1 and stats.trials == 5 and stats.min_ms == 1.0
    assert stats.spread_pct == (stats.q75_ms - stats.q25_ms) / 1.1 * 100


def test_verdict_json_round_trip():
    from stitchcuda.verify import Verdict

    v = judge(TASK, CAND, CONFIG, good_result())
    assert Verdict.model_validate_json(v.model_dump_json()) == v


def test_best_baseline_must_meet_the_tolerance_in_force():
    timing = _timing(2.0, eager=6.0, eager_tf32=1.0, cuda_graph=4.0)
    timing.baselines["eager_tf32"].passes = {"strict": False, "paper": True}
    strict = judge(TASK, CAND, CONFIG, good_result(timing=timing))
    assert strict.speedup["best"] == 2.0  # cuda_graph: TF32 misses strict's bar
    paper = judge(TASK, CAND, CONFIG.model_copy(update={"tolerance": "paper"}), good_result(timing=timing))
    assert paper.speedup["best"] == 0.5 and "eager_tf32" in paper.feedback
