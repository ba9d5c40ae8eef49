"""The timing phase in the worker: the candidate against eager and the free-lunch baselines.

Candidate, eager reference and each baseline (eager with TF32, the reference replayed from a CUDA
graph, torch.compile, and with ``compile_max_autotune`` torch.compile's max-autotune mode) are timed
in interleaved rounds by one :class:`~stitchcuda.verify.timing.Timer`, so drift cancels. Only
torch.compile's times are reused from an earlier verification of this task on this GPU (its compile
takes tens of seconds, max-autotune's minutes; one still compiling after ``compile_limit_s`` is
recorded as over the limit and not tried again); the cheap baselines are timed again beside every
candidate, as a cached figure would compare a candidate timed under one load (a bench's builds
beside it) with a baseline timed under another: hf_bert read 0.88x its CUDA graph in a bench
with the graph's time cached, 1.06x with both timed in one run. Each baseline's
output is compared with the fp32 reference under every tolerance policy, so that a baseline
that would fail the policy is never the bar an honest candidate is held to.
"""

from __future__ import annotations

import contextlib
import copy
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import torch

from stitchcuda.verify.config import COMPILED_BASELINES, TOLERANCES
from stitchcuda.verify.correctness import compare_outputs, detached, make_trial_inputs, trial_draw
from stitchcuda.verify.crash import fail
from stitchcuda.verify.model_state import ModelState
from stitchcuda.verify.protocol import WorkerRequest, WorkerResult
from stitchcuda.verify.timing import Contender, Pinned, Timer, cuda_graph_call, summarize
from stitchcuda.verify.torch_state import set_tf32
from stitchcuda.verify.verdict import BaselineTiming, TimingReport

# baselines too slow to set up to time again beside every candidate: their cached time is reused
REUSED = frozenset(COMPILED_BASELINES)
# The GPU gate's section a baseline is set up in. max-autotune times its kernel choices on the GPU,
# so beside other tasks' trials but never in their timing; the default mode's compile is CPU work
# (Dynamo, Inductor, Triton's builds) ending in one forward, and holds no section: in a bench, a
# DenseNet's 70-130 s compile in the shared section kept every other task's timing waiting.
SETUP_SECTION: dict[str, str | None] = {"torch_compile": None, "torch_compile_max_autotune": "shared"}


class OverLimit(Exception):
    """A baseline's set-up (torch.compile's first call) ran past its limit."""


def over_limit(exc: BaseException) -> bool:
    """Whether ``exc`` is :class:`OverLimit` or wraps it: Inductor raises what stops its compile
    again as its own ``InductorError`` (``inner_exception``, and the exception it was raised in)."""
    pending, seen = [exc], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        if isinstance(e, OverLimit):
            return True
        seen.add(id(e))
        pending += [e.__cause__, e.__context__, getattr(e, "inner_exception", None)]
    return False


def time_candidate(request: WorkerRequest, result: WorkerResult, reference: ModuleType, ref_model: Any,
                   new_model: Any, device: torch.device, gate: Any = None) -> None:
    """``result.timing``: the candidate, eager and the baselines, timed in interleaved rounds. Called
    inside ``gate``'s exclusive section (a GateClient); a torch.compile baseline compiles outside it
    (:data:`SETUP_SECTION`), as a compile does not need a quiet GPU and takes minutes."""
    config = request.config
    inputs = make_trial_inputs(reference.get_inputs, config.seed, "given", device)
    timer = Timer(device)
    contenders = [
        Contender("candidate", lambda: new_model(*inputs)),
        Contender("eager", lambda: ref_model(*inputs)),
    ]
    baselines: dict[str, BaselineTiming] = {}
    now = datetime.now(UTC).isoformat(timespec="seconds")
    setup_started = time.perf_counter()
    reusable = {name: b for name, b in request.cached_baselines.items() if name in REUSED}
    compile_s: dict[str, float] = {}
    if device.type == "cuda":
        contenders += set_up_baselines(config, reusable, ref_model, inputs, gate, baselines, result, compile_s, now)
    result.baselines_s = time.perf_counter() - setup_started
    named = os.environ.get("STITCHCUDA_TIMING_CPU", "")
    # a core outside the worker's own (worker.serve keeps it off the timing cores): the timing
    # thread moves there for its rounds
    quiet = Pinned(int(named) if named.isdigit() else None)
    try:
        rounds = timer.run(contenders, config.warmup, config.min_timing_trials, config.max_timing_trials,
                           config.timing_budget_s, measuring=quiet)
    except BaseException as exc:
        fail(result, exc, "timing")
    checked = time.perf_counter()
    # whether a baseline passes does not depend on the candidate: judged once per task, then cached
    known = {name: {"passes": b.passes, "max_abs_error": b.max_abs_error}
             for name, b in request.cached_baselines.items() if b.passes}
    trials = [lambda i=i: make_trial_inputs(reference.get_inputs, *trial_draw(config.seed, i), device)
              for i in range(config.trials)]
    accuracy = known | baseline_accuracy(ref_model, inputs, [c for c in contenders[2:]
                                                             if c.name not in known and c.error is None], trials)
    result.baselines_s += time.perf_counter() - checked
    for c in contenders[1:]:
        if c.error is not None:  # raised while timed: no figure, and nothing kept for the next candidate
            baselines[c.name] = BaselineTiming(name=c.name, error=c.error, measured_at=now,
                                               compile_s=compile_s.get(c.name), mode=c.mode)
            continue
        baselines[c.name] = BaselineTiming(name=c.name, stats=summarize(c.samples), measured_at=now,
                                           compile_s=compile_s.get(c.name), mode=c.mode, **accuracy.get(c.name, {}))
        if c.name != "eager":
            result.measured_baselines[c.name] = baselines[c.name]
    result.timing = TimingReport(
        method=("cuda events + device synchronize, L2 flushed, interleaved rounds" if timer.cuda
                else "wall clock (CPU device): not comparable to GPU timings")
        + (f"; timed from CPU core {quiet.core}, kept free of other work" if quiet.core is not None else ""),
        candidate=summarize(contenders[0].samples),
        baselines=dict(sorted(baselines.items())),
        l2_flush_bytes=timer.flush_bytes,
        rounds=rounds,
    )


def set_up_baselines(config: Any, reusable: dict[str, BaselineTiming], ref_model: Any, inputs: list[Any], gate: Any,
                     baselines: dict[str, BaselineTiming], result: WorkerResult, compile_s: dict[str, float],
                     now: str) -> list[Contender]:
    """The baselines to time beside the candidate, each set up in its section of ``gate``
    (:data:`SETUP_SECTION`), the gate left in the exclusive section for the timing. A reusable
    figure goes straight to ``baselines``, and so does a baseline that could not be set up (a
    compile over its limit also to ``result.measured_baselines``, not to be waited for again)."""
    contenders = []
    for name in config.baselines:
        cached = reusable.get(name)
        if cached is not None and cached.settled:
            baselines[name] = cached.model_copy(update={"cached": True})
            continue
        if gate is not None:
            gate.switch(SETUP_SECTION.get(name, "exclusive"))
        try:
            contenders.append(replace(baseline_contender(name, ref_model, inputs, config.compile_limit_s, compile_s),
                                      optional=True))
        except Exception as exc:
            over = over_limit(exc)
            said = f"over its limit: still compiling after {config.compile_limit_s:g} s" if over else \
                f"{type(exc).__name__}: {exc}"[:300]  # Inductor's wrapping adds a page of advice
            baselines[name] = BaselineTiming(name=name, error=said, measured_at=now,
                                             compile_s=compile_s.get(name) if over else None)
            if over:  # remembered, so the next candidate of this task does not wait for it again
                result.measured_baselines[name] = baselines[name]
            set_tf32(False)
    if gate is not None:
        gate.switch("exclusive")
    return contenders


# inputs larger than this are not drawn again for the baselines' trials (a level-1 task's 6 GB input):
# there the baselines are compared on the timing inputs alone
TRIAL_INPUT_BYTES = 1 << 30


def baseline_accuracy(ref_model: Any, inputs: list[Any], contenders: list[Contender],
                      trials: list[Callable[[], list[Any]]] = ()) -> dict[str, dict]:
    """Each baseline's output against the fp32 reference, under every tolerance policy: a
    faster baseline that would fail the policy is no bar for an honest candidate. A baseline
    passes a policy only where it passes on every input a candidate's correctness trials use
    (``trials``: their seeds and distributions), as a candidate must: eager TF32 passed 1e-4 on
    small_cnn's timing inputs and missed it on the scaled and uniform trials our TF32 program failed.
    The contenders' calls are bound to ``inputs``, so each trial's values are copied into them
    (their originals restored after). Unlike a candidate's, a baseline's trial is not re-judged
    against a float64 reference where the fp32 reference itself is ill-conditioned."""
    if not contenders:
        return {}
    set_tf32(False)
    start = ModelState.capture(ref_model)  # each call from one state, under one seed

    def fresh() -> None:
        start.restore(ref_model)
        torch.manual_seed(0)

    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if sum(t.numel() * t.element_size() for t in tensors) > TRIAL_INPUT_BYTES:
        trials = ()
    saved = [t.clone() for t in tensors] if trials else []
    found: dict[str, dict] = {}
    try:
        for draw in [None, *trials]:
            if draw is not None and not _load(tensors, draw()):
                continue  # a trial's inputs of another shape: compared on the others
            # compared where they were computed: on the CPU, float64 comparisons of a level-1 task's
            # 6 GB outputs took minutes and ran the worker past its time limit
            fresh()
            reference = detached(ref_model(*inputs))
            for c in contenders:
                fresh()
                if c.model is not None:  # a compiled baseline's own copy starts from the same state
                    start.restore(c.model)
                c.before()
                try:
                    out = detached(c.call())
                except Exception:
                    continue
                finally:
                    c.after()
                checks = {name: compare_outputs(reference, out, tol) for name, tol in TOLERANCES.items()}
                seen = found.setdefault(c.name, {"passes": {name: True for name in checks}, "max_abs_error": 0.0})
                seen["passes"] = {name: seen["passes"][name] and r.passed for name, r in checks.items()}
                error = checks["strict"].max_abs_error
                seen["max_abs_error"] = None if error is None or seen["max_abs_error"] is None \
                    else max(seen["max_abs_error"], error)
    finally:
        _load(tensors, saved)
    return found


def _load(tensors: list[torch.Tensor], values: list[Any]) -> bool:
    """Copy one trial's tensors into the inputs the contenders' calls are bound to."""
    drawn = [v for v in values if isinstance(v, torch.Tensor)]
    if len(drawn) != len(tensors) or any(d.shape != t.shape or d.dtype != t.dtype for d, t in zip(drawn, tensors, strict=True)):
        return False
    with torch.no_grad():
        for t, d in zip(tensors, drawn, strict=True):
            t.copy_(d)
    return True


def baseline_contender(name: str, ref_model: Any, inputs: list[Any], limit_s: float = 300.0,
                       compile_s: dict[str, float] | None = None) -> Contender:
    """A baseline ready to time. A torch.compile baseline compiles here, on its first call, within
    ``limit_s`` (:class:`OverLimit` past it); its compile time goes to ``compile_s``."""
    if name == "eager_tf32":
        return Contender(name, lambda: ref_model(*inputs), before=lambda: set_tf32(True), after=lambda: set_tf32(False))
    if name == "cuda_graph":
        return Contender(name, cuda_graph_call(ref_model, inputs))
    if name in COMPILED_BASELINES:
        mode = COMPILED_BASELINES[name]
        started = time.perf_counter()
        try:
            model, compiled = _compiled(ref_model, mode, inputs, limit_s)
            if mode == "max-autotune" and not _replays(compiled, inputs):
                mode = "max-autotune-no-cudagraphs"
                model, compiled = _compiled(ref_model, mode, inputs, limit_s - (time.perf_counter() - started))
        finally:
            if compile_s is not None:
                compile_s[name] = round(time.perf_counter() - started, 2)
        return Contender(name, lambda: compiled(*inputs), model=model,
                         mode=None if mode == COMPILED_BASELINES[name] else mode)
    raise ValueError(name)


def _compiled(ref_model: Any, mode: str, inputs: list[Any], limit_s: float) -> tuple[Any, Any]:
    """``ref_model``'s own-state copy and its compiled form, compiled by a first call within ``limit_s``."""
    model = own_state_copy(ref_model)
    compiled = torch.compile(model, mode=None if mode == "default" else mode)
    with time_limit(max(limit_s, 1e-3)):  # the second compile of max-autotune gets what is left
        compiled(*inputs)  # compile now, outside the timed rounds
        torch.cuda.synchronize()
    return model, compiled


def _replays(compiled: Any, inputs: list[Any]) -> bool:
    """Whether max-autotune's CUDA graphs can serve the model call after call: CUDA-graph trees warm up
    on a graph's first call, record on its second and replay from its third, each replay overwriting
    the last one's outputs, so a model that keeps an output as its state (a stateful cell's
    ``self.hidden``) reads overwritten memory and torch raises (a RuntimeError naming CUDAGraphs, or
    an assertion inside CUDA-graph trees, depending on where the state was made). Such a model is
    compiled again without CUDA graphs, as a user would; were the failure not theirs, that compile
    fails too and its error is the baseline's. Six calls: a state that starts on the CPU recompiles
    once on its second call (its device changed), and that graph replays from the fifth."""
    try:
        for _ in range(6):
            compiled(*inputs)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - any failure of the replays: tried again without CUDA graphs
        return False
    return True


def own_state_copy(model: Any) -> Any:
    """``model`` with state of its own (the plain tensors a forward reassigns, ``self.hidden``) and the
    same parameters and buffers: a compiled baseline's CUDA graphs keep its outputs in their pool and
    overwrite them on the next replay, so eager must never read a state the compiled model wrote.
    The model itself where it cannot be copied."""
    if not isinstance(model, torch.nn.Module):
        return model
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    try:
        return copy.deepcopy(model, memo=shared)
    except Exception:
        return model


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise :class:`OverLimit` in the main thread once ``seconds`` have passed (Inductor's compile is
    Python between its subprocesses, so the signal lands); elsewhere the worker's own limit holds."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise OverLimit(f"still compiling after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
