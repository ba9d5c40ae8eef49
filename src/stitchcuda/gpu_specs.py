"""GPUs' data-sheet figures: dense peaks (no sparsity) and memory bandwidth, by name.

One table for the two readers: the Verifier's roofline (``verify/peaks.py``), where a measured
peak is missing, and the compiler's cost model (``compiler/lowering/cost.py``), which picks each
operator's arithmetic path before anything is measured.
"""

from __future__ import annotations

from typing import NamedTuple


class NominalPeaks(NamedTuple):
    """Dense TFLOP/s from the vendor's data sheet, and memory bandwidth in TB/s."""

    label: str
    fp32: float
    tf32: float
    bf16: float
    fp16: float
    fp8: float | None
    hbm_tbps: float
    sms: int = 132  # streaming multiprocessors: how many tiles of a GEMM run at once


# name fragment (matched in order, case-insensitive) -> figures; H200's compute equals H100 SXM's
NOMINAL: list[tuple[str, NominalPeaks]] = [
    ("H200 NVL", NominalPeaks("H200 NVL", 60.0, 418.0, 835.0, 835.0, 1671.0, 4.8)),
    ("H200", NominalPeaks("H200 SXM", 67.0, 495.0, 989.0, 989.0, 1979.0, 4.8)),
    ("H100 NVL", NominalPeaks("H100 NVL", 60.0, 418.0, 835.0, 835.0, 1671.0, 3.9)),
    ("H100 PCIe", NominalPeaks("H100 PCIe", 51.0, 378.0, 756.0, 756.0, 1513.0, 2.0, 114)),
    ("H100", NominalPeaks("H100 SXM", 67.0, 495.0, 989.0, 989.0, 1979.0, 3.35)),
    ("A100", NominalPeaks("A100", 19.5, 156.0, 312.0, 312.0, None, 2.04, 108)),
    ("L40S", NominalPeaks("L40S", 91.6, 183.0, 362.0, 362.0, 733.0, 0.864, 142)),
    ("RTX 4090", NominalPeaks("RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1.008, 128)),
]
# compute capability -> the table entry assumed for an unnamed GPU of that architecture
BY_CAPABILITY = {"9.0": "H100", "8.0": "A100"}
DEFAULT = "H100"


def nominal_peaks(gpu: str | None, capability: str | None = None) -> NominalPeaks | None:
    """The data-sheet figures of a GPU, by its name, else by its compute capability."""
    name = (gpu or "").lower()
    for fragment, peaks in NOMINAL:
        if fragment.lower() in name:
            return peaks
    key = BY_CAPABILITY.get(capability or "")
    if key is None:
        return None
    base = dict(NOMINAL)[key]
    return base._replace(label=f"{base.label} (assumed for compute capability {capability})")
