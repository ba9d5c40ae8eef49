"""Nsight Compute: hardware counters for the candidate's top kernels, and a bound label each.

The orchestrator runs a "counters" worker under ``ncu`` (``--profile-from-start off``: the
worker opens the profiled range around one forward call, after warm-up), reads ncu's CSV log
and labels each kernel memory-, compute- or latency-bound from its throughput counters. Kept
free of torch: the orchestrating process parses, the worker measures.
"""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from pathlib import Path

from stitchcuda.verify.kernel_names import guess_origin
from stitchcuda.verify.verdict import CounterReport, KernelCounters, KernelOrigin, ProgramProfile, Roofline

METRICS = {
    "gpu__time_duration.sum": "duration_ns",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "launch__registers_per_thread": "registers",
}
# Nsight's own rule of thumb: a unit above ~60% of its peak is the one that limits the kernel;
# when neither SMs nor memory get there, the kernel waits on latency (too few warps, too little
# work per launch, dependent loads) rather than on a throughput ceiling.
BUSY_PCT = 60.0
# Messages ncu prints when the driver refuses access to the counters.
_REFUSED = re.compile(r"ERR_NVGPUCTRPERM|permission to access NVIDIA GPU Performance Counters|"
                      r"not supported on this (?:device|platform)|profiling is not supported", re.I)


def ncu_command(ncu: str, log_path: Path, max_launches: int = 400) -> list[str]:
    """The prefix that runs a worker under Nsight Compute, counters to ``log_path`` as CSV."""
    return [
        ncu, "--clock-control", "none", "--profile-from-start", "off", "--target-processes", "all",
        "--csv", "--page", "details", "--print-units", "base", "--print-kernel-base", "function", "--launch-count", str(max_launches),
        "--metrics", ",".join(METRICS), "--log-file", str(log_path),
    ]


def _number(text: str) -> float | None:
    cleaned = text.replace(",", "").strip()  # ncu's CSV carries thousands separators
    try:
        return float(cleaned)
    except ValueError:
        return None


def parse_csv(text: str) -> list[dict[str, object]]:
    """One dict per profiled launch: ``kernel`` plus the metrics of :data:`METRICS` by short name."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    if not lines:
        return []
    launches: dict[str, dict[str, object]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines))):
        launch_id = row.get("ID")
        metric = METRICS.get(row.get("Metric Name") or "")
        if launch_id is None or metric is None:
            continue
        entry = launches.setdefault(launch_id, {"kernel": row.get("Kernel Name", "?")})
        value = _number(row.get("Metric Value") or "")
        if value is not None:
            entry[metric] = value
    return list(launches.values())


def label(sm_pct: float, memory_pct: float, dram_pct: float, occupancy_pct: float | None) -> tuple[str, str]:
    """(bound label, the numbers behind it)."""
    numbers = f"SM {sm_pct:.0f}%, memory {memory_pct:.0f}%, DRAM {dram_pct:.0f}% of peak"
    if occupancy_pct is not None:
        numbers += f", occupancy {occupancy_pct:.0f}%"
    if max(sm_pct, memory_pct) >= BUSY_PCT:
        if memory_pct >= sm_pct:
            return "memory-bound", f"{numbers}: memory throughput is the ceiling it runs into"
        return "compute-bound", f"{numbers}: the SMs' arithmetic is the ceiling it runs into"
    return "latency-bound", (f"{numbers}: neither unit above {BUSY_PCT:.0f}% of peak, so it waits on latency "
                             "(too few warps or too little work per launch)")


def summarize(launches: list[dict[str, object]], origin_of: dict[str, KernelOrigin], top: int) -> list[KernelCounters]:
    """Launches of one kernel merged (durations summed, percentages weighted by duration), longest first.

    ``origin_of`` maps kernel names (as the candidate's profile saw them) to own/library/pytorch;
    the candidate's own and library kernels come first, PyTorch's only fill what is left.
    """
    groups: dict[str, list[dict[str, object]]] = defaultdict(list)
    for launch in launches:
        groups[str(launch["kernel"])].append(launch)
    kernels = []
    for name, items in groups.items():
        total_ns = sum(float(i.get("duration_ns", 0.0)) for i in items)  # type: ignore[arg-type]

        def weighted(metric: str, items=items, total_ns=total_ns) -> float | None:
            pairs = [(float(i[metric]), float(i.get("duration_ns", 0.0))) for i in items if metric in i]  # type: ignore[arg-type]
            if not pairs:
                return None
            weight = sum(w for _, w in pairs)
            return sum(v * w for v, w in pairs) / weight if weight else sum(v for v, _ in pairs) / len(pairs)

        sm, mem, dram = weighted("sm_pct") or 0.0, weighted("memory_pct") or 0.0, weighted("dram_pct") or 0.0
        occupancy = weighted("occupancy_pct")
        regs = weighted("registers")
        bound, why = label(sm, mem, dram, occupancy)
        kernels.append(KernelCounters(
            name=name, origin=_origin(name, origin_of), launches=len(items), duration_us=total_ns / 1e3,
            sm_pct=round(sm, 1), memory_pct=round(mem, 1), dram_pct=round(dram, 1),
            occupancy_pct=round(occupancy, 1) if occupancy is not None else None,
            registers=int(regs) if regs is not None else None, label=bound, why=why,  # type: ignore[arg-type]
        ))
    kernels.sort(key=lambda k: (k.origin == "pytorch", -k.duration_us))
    return kernels[:top]


def bare_name(name: str) -> str:
    """``linear_kernel`` for ``void (anonymous namespace)::linear_kernel<true>(float const*, int)``:
    torch.profiler and ncu spell signatures differently, the function's own name agrees."""
    name = name.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0].strip()
    return name.split()[-1].split("::")[-1] if name else ""


def _origin(name: str, origin_of: dict[str, KernelOrigin]) -> KernelOrigin:
    if name in origin_of:
        return origin_of[name]
    bare = bare_name(name)
    for known, origin in origin_of.items():
        if bare and bare_name(known) == bare:
            return origin
    return guess_origin(name)  # type: ignore[return-value]


def report_from_log(log: str, origin_of: dict[str, KernelOrigin], top: int) -> CounterReport:
    if _REFUSED.search(log):
        return CounterReport(status="unavailable", detail="ncu was refused access to the GPU's performance "
                             "counters (ERR_NVGPUCTRPERM): run as root or allow non-admin profiling "
                             "(NVreg_RestrictProfilingToAdminUsers=0)")
    launches = parse_csv(log)
    if not launches:
        tail = " ".join(line.strip() for line in log.strip().splitlines()[-3:])
        return CounterReport(status="failed", detail=f"ncu profiled no kernel: {tail[:300]}")
    kernels = summarize(launches, origin_of, top)
    return CounterReport(status="ok", detail=f"ncu read {len(launches)} kernel launches of one forward call",
                         kernels=kernels)


def timing_estimate(profile: ProgramProfile | None, roofline: Roofline | None, candidate_ms: float | None) -> str | None:
    """Without counters: where the program stands against the reference's roofline floors."""
    if profile is None:
        return None
    parts = []
    if profile.launches > 3 and profile.idle_share > 0.2:
        parts.append(f"launch-bound: the GPU idles {profile.idle_share:.0%} of the forward over "
                     f"{profile.launches} launches")
    if roofline is not None and candidate_ms:
        compute = roofline.arithmetic_compute_floor_ms or roofline.compute_floor_ms
        bound = "compute" if compute >= roofline.memory_floor_ms else "memory"
        at = (f"at the {roofline.arithmetic} peak ({roofline.arithmetic_tflops:g} TFLOP/s, {roofline.arithmetic_peak})"
              if roofline.arithmetic_tflops else "at this GPU's peaks")
        parts.append(f"the work is {bound}-bound {at} (compute floor {compute:.3f} ms, memory floor "
                     f"{roofline.memory_floor_ms:.3f} ms); the candidate runs at "
                     f"{roofline.floor_for_candidate_ms / candidate_ms:.0%} of the floor's speed")
    return "; ".join(parts) or None
