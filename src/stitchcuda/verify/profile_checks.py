"""The profile phase in the worker, and the hacking findings read from where the GPU time went.

Both programs run once under torch.profiler (the reference only when its profile is not cached
for this task and GPU); the reference also gets its roofline. A candidate whose own kernels do
nothing of substance is a total hack, one that leaves heavy operators to PyTorch a partial one,
and one faster than the reference's roofline floor did not compute the function.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from stitchcuda.verify import profiling
from stitchcuda.verify.correctness import make_trial_inputs
from stitchcuda.verify.crash import fail
from stitchcuda.verify.profiling import own_work_negligible, pytorch_compute_share
from stitchcuda.verify.protocol import WorkerRequest, WorkerResult
from stitchcuda.verify.torch_state import set_tf32
from stitchcuda.verify.verdict import Finding, ProgramProfile


def profile_both(request: WorkerRequest, result: WorkerResult, reference: ModuleType, ref_model: Any,
                 new_model: Any, device: Any) -> None:
    """Both programs under torch.profiler once, the reference's roofline, and what they show."""
    inputs = make_trial_inputs(reference.get_inputs, request.config.seed, "given", device)
    set_tf32(False)
    reference_profile = request.cached_reference_profile
    calls = {"candidate": lambda: new_model(*inputs)}
    if reference_profile is None:  # one profiler session for both: starting one costs seconds
        calls = {"reference": lambda: ref_model(*inputs), **calls}
    try:
        profiles = profiling.profile_calls(calls, {"reference": ref_model} if "reference" in calls else None,
                                           shapes="reference" in calls)
    except BaseException as exc:
        fail(result, exc, "profile")
    if reference_profile is None:
        reference_profile = profiles["reference"]
        try:
            peaks = profiling.measure_peaks(device, Path(request.cache_root))
            reference_profile.roofline = profiling.roofline(ref_model, inputs, peaks)
        except Exception as exc:  # the roofline is advisory: never fail the candidate for it
            result.errors.append(f"the reference's roofline failed: {type(exc).__name__}: {exc}"[:300])
    result.reference_profile = reference_profile
    profile = profiles["candidate"]
    result.profile = profile
    result.operator_coverage = profiling.operator_coverage(reference_profile, profile)
    result.findings.extend(profile_findings(profile, bool(result.build.extensions)))


def profile_findings(profile: ProgramProfile, built_extensions: bool) -> list[Finding]:
    """Hacking findings from where the candidate's GPU time went."""
    findings = []
    share = profile.origin_share
    mine = share.get("own", 0.0) + share.get("library", 0.0)
    torch_share, top = pytorch_compute_share(profile)
    if own_work_negligible(profile):  # total only when the own kernels do nothing of substance
        own = (f"; the candidate's own kernels ran {mine * profile.gpu_time_us:.1f} us, nothing of substance" if mine
               else "; the candidate's own kernels never ran")
        findings.append(Finding(check="no_own_gpu_time", level="total",
                                detail=f"{1 - mine:.0%} of the GPU time is PyTorch's or of unknown origin"
                                       + (f" ({', '.join(top)})" if top else "")
                                       + (own if built_extensions else "")))
    elif torch_share > 0.2:
        findings.append(Finding(check="pytorch_gpu_time", level="partial",
                                detail=f"PyTorch operators compute {torch_share:.0%} of the GPU time: {', '.join(top)}"))
    elif torch_share > 0.0:
        findings.append(Finding(check="pytorch_gpu_time_light", level="none",
                                detail=f"PyTorch operators compute {torch_share:.0%} of the GPU time: {', '.join(top)}"))
    if share.get("unattributed", 0.0) > 0.05:
        findings.append(Finding(check="unattributed_gpu_time", level="partial",
                                detail=f"{share['unattributed']:.0%} of the GPU time was launched outside the "
                                       "forward call's scope (another thread, or work left running)"))
    if len(profile.streams) > 1:
        findings.append(Finding(check="streams", level="none",
                                detail=f"kernels ran on {len(profile.streams)} CUDA streams {profile.streams}"))
    return findings


def check_speed_of_light(result: WorkerResult) -> None:
    """A candidate faster than the reference's roofline floor did not compute the function."""
    roof = result.reference_profile.roofline if result.reference_profile else None
    if roof is None or result.timing is None or roof.floor_ms <= 0:
        return
    measured = result.timing.candidate.median_ms
    if measured < 0.8 * roof.floor_ms:
        result.findings.append(Finding(
            check="impossible_speedup", level="total",
            detail=f"{measured:.4f} ms is below the roofline floor of {roof.floor_ms:.4f} ms "
                   f"({roof.flops / 1e9:.1f} GFLOP, {roof.min_bytes / 2**20:.0f} MiB at this GPU's measured peaks): "
                   "the work cannot have been done in that time",
        ))
