"""From what the worker reported (or how it died) to a Verdict: the pass/fail rules live here."""

from __future__ import annotations

from stitchcuda.records import CostEstimate
from stitchcuda.task.record import Candidate, Task
from stitchcuda.verify import peaks, precision
from stitchcuda.verify.config import VerifyConfig
from stitchcuda.verify.feedback import WEIGHTS_DIFFER, feedback_for
from stitchcuda.verify.protocol import WorkerResult
from stitchcuda.verify.static_report import StaticReport
from stitchcuda.verify.verdict import (
    SEED_DEPENDENT,
    CrashReport,
    Finding,
    HackingReport,
    SourceRef,
    Verdict,
    WallTimes,
)
from stitchcuda.verify.weights_trial import weights_error

_LEVELS = ("none", "partial", "total")


def hacking_level(findings: list[Finding]) -> str:
    return max((f.level for f in findings), key=_LEVELS.index, default="none")


def merge_findings(static: list[Finding], dynamic: list[Finding]) -> list[Finding]:
    """Static findings first; a run-time finding that only repeats a static one is dropped."""
    seen = {f.check for f in static}
    return list(static) + [f for f in dynamic if f.check not in seen]


def judge_static(task: Task, candidate: Candidate, config: VerifyConfig, static: StaticReport,
                 static_error: str | None = None) -> Verdict:
    """The verdict of ``--static-only``: the hacking checks that need no GPU, nothing run."""
    verdict = Verdict(
        task=SourceRef(name=task.name, path=task.path, sha256=task.sha256),
        candidate=SourceRef(name=candidate.name, path=candidate.path, sha256=candidate.sha256),
        tolerance=config.tol, static_only=True,
    )
    if static_error:
        verdict.errors.append(static_error)
    verdict.hacking = HackingReport(level=hacking_level(static.findings), findings=static.findings)  # type: ignore[arg-type]
    verdict.errors.extend(f"hacking ({f.level}): {f.detail}" for f in static.findings if f.level == "total")
    verdict.precision = precision.assess(candidate.source, [], [], None)
    verdict.feedback = feedback_for(verdict)
    return verdict


def judge(
    task: Task,
    candidate: Candidate,
    config: VerifyConfig,
    result: WorkerResult | None,
    crash: CrashReport | None = None,
    wall: WallTimes | None = None,
    static_error: str | None = None,
    static: StaticReport | None = None,
) -> Verdict:
    verdict = Verdict(
        task=SourceRef(name=task.name, path=task.path, sha256=task.sha256),
        candidate=SourceRef(name=candidate.name, path=candidate.path, sha256=candidate.sha256),
        tolerance=config.tol,
        wall=wall or WallTimes(),
    )
    if static_error:
        verdict.errors.append(static_error)
        verdict.feedback = static_error
        return verdict
    result = result or WorkerResult()
    verdict.device = result.device
    verdict.build = result.build
    verdict.reference_error = result.reference_error
    verdict.crash = crash or result.crash
    verdict.correctness = result.correctness
    verdict.timing = result.timing
    verdict.profile = result.profile
    verdict.reference_profile = result.reference_profile
    findings = merge_findings(static.findings if static else [], result.findings)
    verdict.hacking = HackingReport(
        level=hacking_level(findings), findings=findings,  # type: ignore[arg-type]
        origin_share=result.profile.origin_share if result.profile else {},
        operator_coverage=result.operator_coverage,
    )

    build_failed = [e for e in result.build.extensions if not e.ok]
    crashed_before_import = verdict.crash is not None and verdict.crash.phase in ("start", "reference", "build")
    verdict.compiled = (
        result.reference_error is None and not build_failed and result.import_error is None
        and not crashed_before_import and result.ready_at > 0
    )
    trials = result.correctness.trials
    weights = result.correctness.weights_follow
    verdict.correct = (
        verdict.compiled and verdict.crash is None and len(trials) == config.trials and all(t.passed for t in trials)
        and (weights is None or not weights.ran or bool(weights.passed))
    )
    # A changed global flag is restored for our checks, but KernelBench's harness does not restore it:
    # its reference then runs under the candidate's setting (TF32, say) and fails the candidate. Never
    # pass what KernelBench fails: the hacking level stays as found, the program does not pass.
    flags = result.flags_changed
    verdict.passed = verdict.correct and verdict.hacking.level != "total" and not flags

    errors = verdict.errors
    if weights is not None and weights.ran and not weights.passed:
        errors.append(weights_error(weights))
    if flags and verdict.correct:
        errors.append(f"it changes torch's global flags ({', '.join(flags)}): restored for our checks, but "
                      "KernelBench's harness does not restore them and judges its reference under them; "
                      "leave global state alone")
    if result.reference_error:
        seeds = result.reference_error.startswith(SEED_DEPENDENT)  # it ran: its output is the problem
        errors.append(("" if seeds else "the reference failed to run: ") + _first_line(result.reference_error))
    for ext in build_failed:
        first = next((m for m in ext.messages if m.severity == "error"), None)
        in_py = f" (candidate line {first.candidate_line})" if first and first.candidate_line else ""
        where = f" at {first.file}:{first.line}{in_py}: {first.message}" if first and first.line else (
            f": {first.message}" if first else "")
        errors.append(f"build of {ext.requested_name!r} failed{where}")
    if result.import_error:
        errors.append("importing the candidate failed: " + _last_line(result.import_error))
    if verdict.crash:
        errors.append(f"{verdict.crash.kind} during {verdict.crash.phase}: {_last_line(verdict.crash.message)}")
    errors.extend(result.errors)
    failed_trials = [t for t in trials if not t.passed and t.error]
    if failed_trials and not verdict.crash:
        errors.append(f"incorrect in {len(failed_trials)} of {len(trials)} trials: {failed_trials[0].error}")
        if result.correctness.passes_with_copied_weights:
            errors.append(WEIGHTS_DIFFER)
    errors.extend(f"hacking ({f.level}): {f.detail}" for f in findings if f.level == "total")

    if result.timing and verdict.correct:
        cand = result.timing.candidate.median_ms
        for name, baseline in result.timing.baselines.items():
            if baseline.stats and cand > 0:
                verdict.speedup[name] = baseline.stats.median_ms / cand
        best = result.timing.best_baseline(config.tolerance)
        if best and best.stats and cand > 0:
            verdict.speedup["best"] = best.stats.median_ms / cand

    verdict.precision = precision.assess(
        candidate.source, result.output_dtypes, result.flags_changed, result.correctness.rel_l2_error,
    )
    verdict.estimate = _estimate_beside_measured(candidate.source, verdict)
    ref = verdict.reference_profile
    if ref is not None and ref.roofline is not None and verdict.precision.arithmetic:  # a copy: the reference's cached profile stays as measured
        roof = peaks.with_arithmetic(ref.roofline, verdict.precision.arithmetic, verdict.device.capability)
        verdict.reference_profile = ref.model_copy(update={"roofline": roof})
    verdict.feedback = feedback_for(verdict)
    return verdict


def _estimate_beside_measured(source: str, verdict: Verdict) -> CostEstimate | None:
    estimate = CostEstimate.from_source(source)
    if estimate is None:
        return None
    profile = verdict.profile
    if profile is not None and profile.gpu_time_us:
        estimate.measured_library_ms = profile.gpu_time_us * profile.origin_share.get("library", 0.0) / 1e3
    if verdict.timing is not None:
        estimate.measured_forward_ms = verdict.timing.candidate.median_ms
    return estimate


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0].strip()[:300] if lines else ""


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""
