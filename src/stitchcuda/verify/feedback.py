"""Feedback: a few lines a Coder can act on, the most decisive first."""

from __future__ import annotations

from stitchcuda.verify.verdict import SEED_DEPENDENT, Verdict

_MAX_LINES = 14

WEIGHTS_DIFFER = (
    "it computes the right function with the reference's parameters copied in, but ModelNew built under "
    "the reference's seed does not create the same parameters: KernelBench builds both models under one "
    "seed and copies nothing, so it rejects this program. Create every parameter as the reference does, in "
    "the same order (nn.Linear/nn.Conv2d/... or their init calls), or verify with --weights copy on purpose")


def feedback_for(verdict: Verdict) -> str:
    lines: list[str] = []
    if verdict.reference_error:
        if verdict.reference_error.startswith(SEED_DEPENDENT):  # it ran: no program can match its draws
            return "The task cannot be verified; no program can change that:\n" + verdict.reference_error[-800:]
        return "The reference program itself failed; nothing to compare against:\n" + verdict.reference_error[-800:]
    failed = [e for e in verdict.build.extensions if not e.ok]
    for ext in failed:
        lines.append(f"Build of extension {ext.requested_name!r} failed:")
        for msg in [m for m in ext.messages if m.severity == "error"][:5]:
            where = f"{msg.file}:{msg.line}" if msg.line else msg.file
            if msg.candidate_line:
                where += f" (candidate line {msg.candidate_line})"
            lines.append(f"  {where}: {msg.message}" + (f"   <- `{msg.source_line}`" if msg.source_line else ""))
    if verdict.crash:
        c = verdict.crash
        lines.append(f"The candidate crashed ({c.kind}) during {c.phase}: {_last_line(c.message)}")
        if c.kind == "illegal_address":
            lines.append("  Check index bounds and grid/block arithmetic of the kernels launched in forward.")
        elif c.kind == "timeout":
            lines.append("  It ran past the time limit: look for a kernel that never finishes or a loop with no exit.")
        elif c.kind == "oom":
            lines.append("  It ran out of GPU memory: allocate less or reuse buffers.")
    # errors said in more detail below (or above) are not repeated
    covered = ("build of", "incorrect in", "hacking (", WEIGHTS_DIFFER) + ((f"{verdict.crash.kind} during",) if verdict.crash else ())
    lines.extend(e for e in verdict.errors if not e.startswith(covered))
    bad = [t for t in verdict.correctness.trials if not t.passed]
    if bad and not verdict.crash:
        t = bad[0]
        lines.append(f"Wrong result in {len(bad)} of {len(verdict.correctness.trials)} trials "
                     f"(tolerance {verdict.tolerance.name}). First: trial {t.index} ({t.distribution}, {t.order}): {t.error}")
        if t.worst:
            lines.append(f"  Largest error at {t.worst}")
        coarse = (verdict.precision.arithmetic or "").startswith(("TF32", "bf16", "fp16", "fp8"))
        if coarse and verdict.tolerance.fp32_atol < 1e-3:
            lines.append(f"  It computes in {verdict.precision.arithmetic}, whose rounding alone often exceeds "
                         f"atol/rtol {verdict.tolerance.fp32_atol:g}: 3xTF32 keeps fp32 accuracy on tensor cores "
                         "(note cutlass-3xtf32), or stay in fp32.")
        if verdict.correctness.passes_with_copied_weights:
            lines.append("  With the reference's parameters copied in, it passes: " + WEIGHTS_DIFFER.split(": ", 1)[1])
    for f in verdict.hacking.findings:
        if f.level != "none":
            lines.append(f"Hacking ({f.level}): {f.check}: {f.detail}")
    if verdict.passed and verdict.timing:
        best = verdict.timing.best_baseline(verdict.tolerance.name)
        eager = verdict.speedup.get("eager")
        text = f"Correct. {verdict.timing.candidate.median_ms:.3f} ms"
        if eager:
            text += f", {eager:.2f}x vs eager"
        if best and "best" in verdict.speedup:
            text += f", {verdict.speedup['best']:.2f}x vs the best baseline ({best.name}, {best.stats.median_ms:.3f} ms)"  # type: ignore[union-attr]
        lines.append(text + ".")
        if best is not None and verdict.speedup.get("best", 0) < 1.0:
            lines.append(f"  Slower than a baseline anyone gets for free ({best.name}): fuse more operators, "  # type: ignore[union-attr]
                         "cut launches, or use the tensor cores where the tolerance allows.")
    if verdict.passed:
        lines.extend(bottleneck_lines(verdict))
    for ext in verdict.build.extensions:
        for k in ext.kernels:
            if k.spill_stores_bytes or k.spill_loads_bytes:
                lines.append(f"Kernel {k.kernel} spills registers ({k.spill_stores_bytes} B stores, "
                             f"{k.spill_loads_bytes} B loads, {k.registers} registers): shrink its per-thread state.")
    if verdict.precision.flags_changed:
        lines.append("Changed global precision flags (" + ", ".join(verdict.precision.flags_changed)
                     + "); they are restored before every run, so set precision inside your own kernels.")
    return "\n".join(lines[:_MAX_LINES])


def _last_line(text: str) -> str:
    stripped = [line for line in text.strip().splitlines() if line.strip()]
    return stripped[-1].strip()[:300] if stripped else ""


def bottleneck_lines(verdict: Verdict) -> list[str]:
    """The profile in a few lines, the dominant bottleneck first, with its numbers."""
    p = verdict.profile
    if p is None or not p.gpu_time_us:
        return []
    lines: list[tuple[float, str]] = []  # (weight, text): the heavier, the earlier
    if p.idle_share > 0.2 and p.launches > 3:
        lines.append((p.idle_share, f"Launch-bound: the GPU is idle {p.idle_share:.0%} of the forward's "
                                    f"{p.window_us:.0f} us across {p.launches} kernel launches; fuse kernels or "
                                    "capture the forward in a CUDA graph."))
    if p.kernels:
        k = p.kernels[0]
        lines.append((k.share, f"Top kernel: {k.name[:70]} ({k.origin}) takes {k.share:.0%} of GPU time "
                               f"({k.total_us:.0f} us over {k.calls} call(s))."))
    torch_share = p.origin_share.get("pytorch", 0.0)
    if torch_share > 0.05:
        ops = ", ".join(f"{o.name} {o.share:.0%}" for o in p.ops[:3])
        lines.append((torch_share, f"PyTorch still runs {torch_share:.0%} of the GPU time ({ops}): replace it."))
    if p.copies:
        lines.append((0.5, f"Host-device copies inside forward ({dict(p.copies)}, {p.copy_us:.0f} us): keep data "
                           "on the GPU."))
    if p.syncs:
        lines.append((0.4, f"{p.syncs} host synchronisation(s) inside forward: remove them."))
    counters = verdict.counters
    for k in [k for k in counters.kernels if k.origin != "pytorch"][:2]:
        share = k.duration_us / p.gpu_time_us if p.gpu_time_us else 0.0
        advice = {"memory-bound": "cut bytes moved (fuse, vectorise, keep data in shared memory or registers)",
                  "compute-bound": "use the tensor cores or cheaper math where the tolerance allows",
                  "latency-bound": "raise occupancy or the work per launch, or fuse it with its neighbours"}[k.label]
        lines.append((max(share, 0.35), f"ncu: {k.name[:60]} is {k.label} ({k.why.split(':')[0]}; "
                                        f"{k.duration_us:.0f} us): {advice}."))
    if counters.status in ("unavailable", "failed"):
        lines.append((0.05, f"No hardware counters ({counters.detail[:120]})."))
    roof = verdict.reference_profile.roofline if verdict.reference_profile else None
    if roof is not None and verdict.timing and roof.floor_for_candidate_ms > 0:
        floor = roof.floor_for_candidate_ms
        gap = verdict.timing.candidate.median_ms / floor
        compute = roof.arithmetic_compute_floor_ms or roof.compute_floor_ms
        bound = "compute" if compute >= roof.memory_floor_ms else "memory"
        at = f" at the {roof.arithmetic} peak of {roof.arithmetic_tflops:g} TFLOP/s" if roof.arithmetic_tflops else ""
        lines.append((0.3, f"{gap:.1f}x above the roofline floor of {floor:.3f} ms{at} ({bound}-bound: "
                           f"{roof.flops / 1e9:.1f} GFLOP, {roof.min_bytes / 2**20:.0f} MiB minimum traffic)."))
    return [text for _, text in sorted(lines, key=lambda item: -item[0])]
