"""The timing phase in the worker: the candidate against eager and the free-lunch baselines.

Candidate, eager reference and each baseline (eager with TF32, the reference replayed from a CUDA
graph, torch.compile) are timed in interleaved rounds by one :class:`~stitchcuda.verify.timing.Timer`,
so drift cancels. Only torch.compile's time is reused from an earlier verification of this task on
this GPU (its compile takes tens of seconds); the cheap baselines are timed again beside every
candidate, as a cached figure would compare a candidate timed under one load (a bench's builds
beside it) with a baseline timed under another: hf_bert read 0.88x its CUDA graph in a bench
with the graph's time cached, 1.06x with both timed in one run. Each baseline's
output is compared with the fp32 reference under every tolerance policy, so that a baseline
that would fail the policy is never the bar an honest candidate is held to.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import torch

from stitchcuda.verify.config import TOLERANCES
from stitchcuda.verify.correctness import compare_outputs, detached, make_trial_inputs
from stitchcuda.verify.crash import fail
from stitchcuda.verify.model_state import ModelState
from stitchcuda.verify.protocol import WorkerRequest, WorkerResult
from stitchcuda.verify.timing import Contender, Timer, cuda_graph_call, pinned, summarize
from stitchcuda.verify.torch_state import set_tf32
from stitchcuda.verify.verdict import BaselineTiming, TimingReport

# baselines too slow to set up to time again beside every candidate: their cached time is reused
REUSED = frozenset({"torch_compile"})


def time_candidate(request: WorkerRequest, result: WorkerResult, reference: ModuleType, ref_model: Any,
                   new_model: Any, device: torch.device) -> None:
    """``result.timing``: the candidate, eager and the baselines, timed in interleaved rounds."""
    config = request.config
    inputs = make_trial_inputs(reference.get_inputs, config.seed, "given", device)
    timer = Timer(device)
    contenders = [
        Contender("candidate", lambda: new_model(*inputs)),
        Contender("eager", lambda: ref_model(*inputs)),
    ]
    baselines: dict[str, BaselineTiming] = {}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    wanted = ["eager_tf32", "cuda_graph"] + (["torch_compile"] if config.compile_baseline else [])
    setup_started = time.perf_counter()
    reusable = {name: b for name, b in request.cached_baselines.items() if name in REUSED}
    if device.type == "cuda":
        for name in wanted:
            cached = reusable.get(name)
            if cached is not None and cached.stats is not None:
                baselines[name] = cached.model_copy(update={"cached": True})
                continue
            try:
                contenders.append(baseline_contender(name, ref_model, inputs))
            except Exception as exc:
                baselines[name] = BaselineTiming(name=name, error=f"{type(exc).__name__}: {exc}"[:300], measured_at=now)
                set_tf32(False)
    result.baselines_s = time.perf_counter() - setup_started
    named = os.environ.get("STITCHCUDA_TIMING_CPU", "")
    core = int(named) if named.isdigit() and int(named) in os.sched_getaffinity(0) else None
    quiet = pinned(core)
    try:
        rounds = timer.run(contenders, config.warmup, config.min_timing_trials, config.max_timing_trials,
                           config.timing_budget_s, measuring=quiet)
    except BaseException as exc:
        fail(result, exc, "timing")
    checked = time.perf_counter()
    accuracy = baseline_accuracy(ref_model, inputs, contenders[2:])
    result.baselines_s += time.perf_counter() - checked
    for c in contenders[1:]:
        baselines[c.name] = BaselineTiming(name=c.name, stats=summarize(c.samples), measured_at=now,
                                           **accuracy.get(c.name, {}))
        if c.name != "eager":
            result.measured_baselines[c.name] = baselines[c.name]
    result.timing = TimingReport(
        method=("cuda events + device synchronize, L2 flushed, interleaved rounds" if timer.cuda
                else "wall clock (CPU device): not comparable to GPU timings")
        + (f"; timed from CPU core {core}, kept free of builds" if core is not None else ""),
        candidate=summarize(contenders[0].samples),
        baselines=dict(sorted(baselines.items())),
        l2_flush_bytes=timer.flush_bytes,
        rounds=rounds,
    )


def baseline_accuracy(ref_model: Any, inputs: list[Any], contenders: list[Contender]) -> dict[str, dict]:
    """Each baseline's output against the fp32 reference, under every tolerance policy: a
    faster baseline that would fail the policy is no bar for an honest candidate."""
    set_tf32(False)
    start = ModelState.capture(ref_model)  # each call from one state, under one seed

    def fresh() -> None:
        start.restore(ref_model)
        torch.manual_seed(0)

    # compared where they were computed: on the CPU, float64 comparisons of a level-1 task's 6 GB
    # outputs took minutes and ran the worker past its time limit
    fresh()
    reference = detached(ref_model(*inputs))
    found = {}
    for c in contenders:
        fresh()
        c.before()
        try:
            out = detached(c.call())
        except Exception:
            continue
        finally:
            c.after()
        checks = {name: compare_outputs(reference, out, tol) for name, tol in TOLERANCES.items()}
        found[c.name] = {"passes": {name: r.passed for name, r in checks.items()},
                         "max_abs_error": checks["strict"].max_abs_error}
    return found


def baseline_contender(name: str, ref_model: Any, inputs: list[Any]) -> Contender:

    if name == "eager_tf32":
        return Contender(name, lambda: ref_model(*inputs), before=lambda: set_tf32(True), after=lambda: set_tf32(False))
    if name == "cuda_graph":
        return Contender(name, cuda_graph_call(ref_model, inputs))
    if name == "torch_compile":
        compiled = torch.compile(ref_model)
        compiled(*inputs)  # compile now, outside the timed rounds
        torch.cuda.synchronize()
        return Contender(name, lambda: compiled(*inputs))
    raise ValueError(name)
