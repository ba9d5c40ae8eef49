"""Nsight Compute's CSV read into per-kernel counters and bound labels (no GPU needed)."""

from __future__ import annotations

from pathlib import Path

from stitchcuda.verify import nsight
from stitchcuda.verify.verdict import Peaks, ProgramProfile, Roofline

LOG = (Path(__file__).parent / "fixtures" / "ncu" / "details.csv").read_text()
ORIGINS = {"void (anonymous namespace)::linear_kernel<true, true>(float const*, float const*, int)": "own",
           "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)": "pytorch"}


def test_csv_with_thousands_separators_and_launches_merged():
    launches = nsight.parse_csv(LOG)
    assert len(launches) == 4 and launches[0]["duration_ns"] == 3_012_416.0 and launches[0]["registers"] == 127
    kernels = {k.name: k for k in nsight.summarize(launches, ORIGINS, top=5)}
    linear = kernels["linear_kernel"]
    assert linear.launches == 2 and abs(linear.duration_us - 4012.416) < 1e-6
    assert 70 < linear.sm_pct < 78.2 and linear.label == "compute-bound" and linear.origin == "own"
    assert kernels["vectorized_elementwise_kernel"].label == "memory-bound"
    assert kernels["vectorized_elementwise_kernel"].origin == "pytorch"
    assert kernels["row_softmax"].label == "latency-bound" and "occupancy 6%" in kernels["row_softmax"].why
    assert kernels["row_softmax"].origin == "own"  # not in the profile: guessed from its name


def test_own_kernels_first_and_top_limit():
    kernels = nsight.summarize(nsight.parse_csv(LOG), ORIGINS, top=2)
    assert [k.name for k in kernels] == ["linear_kernel", "row_softmax"]


def test_report_statuses():
    ok = nsight.report_from_log(LOG, ORIGINS, top=5)
    assert ok.status == "ok" and len(ok.kernels) == 3
    refused = nsight.report_from_log("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access "
                                     "NVIDIA GPU Performance Counters", {}, top=5)
    assert refused.status == "unavailable" and "NVreg_RestrictProfilingToAdminUsers" in refused.detail
    empty = nsight.report_from_log("==PROF== No kernels were profiled.", {}, top=5)
    assert empty.status == "failed" and "No kernels" in empty.detail


def test_bare_names_agree_between_profilers():
    assert nsight.bare_name("void (anonymous namespace)::linear_kernel<true, true>(float const*)") == "linear_kernel"
    assert nsight.bare_name("at::native::reduce_kernel<512, 1>") == "reduce_kernel"


def test_timing_estimate_without_counters():
    peaks = Peaks(gpu="H200", fp32_tflops=50, tf32_tflops=400, bf16_tflops=700, copy_gbps=3000)
    roof = Roofline(flops=4e11, min_bytes=2.7e8, floor_ms=0.57, compute_floor_ms=0.57, memory_floor_ms=0.09,
                    peaks=peaks)
    profile = ProgramProfile(gpu_time_us=5000, launches=40, idle_share=0.5)
    text = nsight.timing_estimate(profile, roof, candidate_ms=5.7)
    assert "launch-bound" in text and "compute-bound" in text and "10%" in text


def test_command_profiles_only_the_marked_range():
    cmd = nsight.ncu_command("/usr/local/cuda/bin/ncu", Path("/tmp/x.csv"))
    assert cmd[cmd.index("--profile-from-start") + 1] == "off" and "--clock-control" in cmd
    assert all(m in cmd[cmd.index("--metrics") + 1] for m in nsight.METRICS)
