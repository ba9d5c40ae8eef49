"""The compute peak that belongs to a candidate's arithmetic, for its roofline; torch-free.

The worker measures three matmul ceilings once per GPU (fp32 SGEMM, TF32, bf16: ``Peaks``). A
candidate's arithmetic (``Precision.arithmetic``) picks which one its roofline floor uses:

- fp32: the measured fp32 (CUDA-core) peak;
- TF32 (fp32 accumulate): the measured TF32 tensor-core peak;
- 3xTF32 (fp32 accumulate): a third of the measured TF32 peak. 3xTF32 splits each fp32 operand into
  big = tf32(x) and small = tf32(x - big) and issues three TF32 products per multiply-add
  (big*big + big*small + small*big), so the useful fp32 FLOP rate is at most a third of TF32's;
- bf16: the measured bf16 peak;
- fp16, fp8 (not measured): the nominal dense peak of the GPU from ``gpu_specs.NOMINAL`` (vendor data sheets,
  no sparsity), labelled "nominal". A measured figure that is missing (0) is replaced the same way.

A mixture ("3xTF32 (fp32 accumulate) + fp16") takes the fastest of its peaks: the floor stays a
lower bound on the time, whichever part of the work ran in which arithmetic.
"""

from __future__ import annotations

from stitchcuda.gpu_specs import NominalPeaks, nominal_peaks
from stitchcuda.verify.verdict import Peaks, Roofline


def _one(arithmetic: str, peaks: Peaks, nominal: NominalPeaks | None) -> tuple[float, str] | None:
    """(TFLOP/s, where it comes from) for one arithmetic name."""
    def measured(value: float, what: str, nominal_value: float | None, divide: int = 1) -> tuple[float, str] | None:
        if value > 0:
            return value / divide, f"measured {what}" + (f" / {divide}" if divide > 1 else "")
        if nominal is not None and nominal_value:
            return nominal_value / divide, f"nominal dense {nominal.label} {what}" + (f" / {divide}" if divide > 1 else "")
        return None

    def listed(value: float | None, what: str) -> tuple[float, str] | None:
        if nominal is None or not value:
            return None
        return value, f"nominal dense {nominal.label} {what}"

    if arithmetic.startswith("3xTF32"):
        return measured(peaks.tf32_tflops, "TF32", nominal.tf32 if nominal else None, divide=3)
    if arithmetic.startswith("TF32"):
        return measured(peaks.tf32_tflops, "TF32", nominal.tf32 if nominal else None)
    if arithmetic.startswith("bf16"):
        return measured(peaks.bf16_tflops, "bf16", nominal.bf16 if nominal else None)
    if arithmetic.startswith("fp16"):
        return listed(nominal.fp16 if nominal else None, "fp16") or measured(peaks.bf16_tflops, "bf16 (fp16 rate)", None)
    if arithmetic.startswith("fp8"):
        return listed(nominal.fp8 if nominal else None, "fp8")
    if arithmetic == "fp32":
        return measured(peaks.fp32_tflops, "fp32", nominal.fp32 if nominal else None)
    return None


def arithmetic_peak(arithmetic: str, peaks: Peaks, capability: str | None = None) -> tuple[float, str] | None:
    """The peak (TFLOP/s) of ``arithmetic`` (one name or several joined with " + ") on this GPU, and
    where it comes from; the fastest for a mixture. None when no figure is known."""
    nominal = nominal_peaks(peaks.gpu, capability)
    found = [p for name in arithmetic.split(" + ") if (p := _one(name.strip(), peaks, nominal)) is not None]
    return max(found, key=lambda p: p[0]) if found else None


def with_arithmetic(roof: Roofline, arithmetic: str, capability: str | None = None) -> Roofline:
    """``roof`` with the floor at the peak of the candidate's arithmetic (a copy; unchanged when no
    peak is known). ``floor_ms`` keeps the best peak of the GPU: the impossible-speedup check uses it."""
    peak = arithmetic_peak(arithmetic, roof.peaks, capability)
    if peak is None:
        return roof.model_copy(update={"arithmetic": arithmetic})
    tflops, source = peak
    compute_ms = roof.flops / (tflops * 1e12) * 1e3
    return roof.model_copy(update={
        "arithmetic": arithmetic, "arithmetic_tflops": round(tflops, 1), "arithmetic_peak": source,
        "arithmetic_compute_floor_ms": compute_ms,
        "arithmetic_floor_ms": max(compute_ms, roof.memory_floor_ms),
    })
