"""Where a task's wall time went, stage by stage, from its file to its verdict; and how busy a
bench kept each GPU.

A task's stages, in the order they happen: ``compile_wait`` for a compile process (a bench compiles
its tasks in a pool of them), the offline Coder's ``capture`` (torch.export and the IR), ``lower`` (fusion and lowering) and ``emit`` (the program's source); the Planner's ``profile``
of the reference; ``build`` (nvcc, in the build worker and the verification's own import);
``checks`` (the static checks of the candidate's source and the judgement of its worker's result, in
the verifying process: over a second a verification for a program of megabytes); the ``gpu_wait`` at the GPU gate; each verification stage (``spawn``, ``cuda_init``, ``reference``,
``construct`` (ModelNew's random init on the CPU and its move to the GPU), ``correctness``,
``weights_trial``, ``fp64``, ``program_profile``, ``baselines``, ``timing``, ``ncu``); KernelBench's second opinion (``kb_start``, ``kb_build``, ``kb_correctness``,
``kb_timing``); and ``other``, the wall time none of these account for (threads waiting on each
other, the run store, the bench's own bookkeeping). The stages of several verifications of one task
add up; ``gpu_wait`` and the GPU stages can overlap another task's, never this task's own.

"GPU busy" is the share of the bench's wall time in which any stage used that GPU: the union of
the intervals the workers and harness processes held the gate, per GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stitchcuda.verify.gate import busy_seconds

STAGES = ("compile_wait", "capture", "lower", "emit", "profile", "build", "checks", "gpu_wait", "spawn", "cuda_init",
          "reference",
          "construct", "correctness", "weights_trial", "fp64", "program_profile", "baselines", "timing", "ncu",
          "kb_start", "kb_build", "kb_correctness", "kb_timing", "other")
LABELS = {"compile_wait": "waiting for a compile process", "capture": "capture", "lower": "lowering", "emit": "emit", "profile": "reference profile",
          "build": "build (nvcc)", "checks": "static checks and judgement", "gpu_wait": "waiting for the GPU", "spawn": "worker start",
          "cuda_init": "CUDA init", "reference": "reference", "construct": "ModelNew's construction",
          "correctness": "correctness trials",
          "weights_trial": "new-weights trial", "fp64": "fp64 re-judgement", "program_profile": "program profile",
          "baselines": "baselines", "timing": "timing", "ncu": "ncu", "kb_start": "KernelBench: start",
          "kb_build": "KernelBench: build", "kb_correctness": "KernelBench: correctness",
          "kb_timing": "KernelBench: timing", "other": "other"}
# verification phases (WallTimes.split) under their stage names
_PHASES = {"checks": "checks", "spawn": "spawn", "cuda_init": "cuda_init", "build": "build", "gpu_wait": "gpu_wait",
           "reference": "reference", "construct": "construct", "correctness": "correctness",
           "weights_trial": "weights_trial", "fp64": "fp64",
           "profile": "program_profile", "baselines": "baselines", "timing": "timing", "ncu": "ncu"}


def empty() -> dict[str, float]:
    return dict.fromkeys(STAGES, 0.0)


def add_phases(stages: dict[str, float], phases: dict[str, float], second_opinion: dict[str, float]) -> None:
    """Add one verification's phases (``WallTimes.split()``) and KernelBench's stages (``start``,
    ``build``, ``correctness``, ``timing``) to ``stages``."""
    for phase, seconds in phases.items():
        if phase in _PHASES:
            stages[_PHASES[phase]] = stages.get(_PHASES[phase], 0.0) + seconds
    for key in ("start", "build", "correctness", "timing"):
        stages[f"kb_{key}"] = stages.get(f"kb_{key}", 0.0) + second_opinion.get(key, 0.0)


def close(stages: dict[str, float], wall_s: float) -> dict[str, float]:
    """``stages`` in stage order, rounded, with ``other`` what is left of ``wall_s``."""
    out = empty() | {k: v for k, v in stages.items() if k != "other"}
    out["other"] = max(wall_s - sum(v for k, v in out.items() if k != "other"), 0.0)
    return {k: round(out[k], 3) for k in STAGES}


def task_stages(wall_s: float, compiling: dict[str, float], stats: Any) -> dict[str, float]:
    """One task's stages (see the module's docstring) from the Coder's compile times and a
    :class:`~stitchcuda.verify.pool.GateStats`; ``other`` is what is left of ``wall_s``."""
    out = empty()
    for key in ("compile_wait", "capture", "lower", "emit"):
        out[key] += compiling.get(key, 0.0)
    out["profile"] += stats.profile_s
    add_phases(out, stats.phases, stats.second_opinion)
    out["gpu_wait"] = stats.wait_s  # the phases' own waits, the profile's and the second opinion's
    return close(out, wall_s)


def total_stages(rows: Iterable[dict[str, float]]) -> dict[str, float]:
    """Stages summed over tasks, in stage order."""
    out = empty()
    for row in rows:
        for key, value in row.items():
            out[key] = out.get(key, 0.0) + value
    return {k: round(v, 2) for k, v in out.items()}


def gpu_busy(intervals_by_gpu: dict[str, list[tuple[float, float]]], wall_s: float) -> dict[str, float]:
    """Each GPU's busy share of ``wall_s``: the union of its intervals over the bench's wall time."""
    if wall_s <= 0:
        return {}
    return {gpu: round(min(busy_seconds(spans) / wall_s, 1.0), 4) for gpu, spans in intervals_by_gpu.items()}
