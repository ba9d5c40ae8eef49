"""The correctness phase in the worker: the trials, and what a failed candidate would do with the
reference's weights.

Each trial draws fresh inputs (its own seed and value distribution), runs the reference and the
candidate in alternating order with the allocator emptied and freed memory poisoned between them
(an output left in reused memory reads as NaN), checks that forward left its inputs alone, and
compares the outputs; every trial's outputs are fingerprinted, so a cache that returns an earlier
trial's result is seen (verify/caching.py). The same ``ModelNew`` instance serves every trial.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from stitchcuda.verify.caching import TrialPrint, fingerprint, repeated_output_finding
from stitchcuda.verify.conditioning import Fp64Reference, reconsider
from stitchcuda.verify.correctness import (
    changed_inputs,
    cloned,
    compare_outputs,
    detached,
    make_trial_inputs,
    on_device,
    trial_draw,
)
from stitchcuda.verify.crash import fail
from stitchcuda.verify.protocol import WorkerRequest, WorkerResult
from stitchcuda.verify.torch_state import set_tf32
from stitchcuda.verify.verdict import Finding, TrialResult


def same_state_layout(ref_model: Any, new_model: Any) -> bool:
    """Whether the two models' state_dicts have the same keys and shapes (so one loads into the other)."""
    ref_state, new_state = ref_model.state_dict(), new_model.state_dict()
    return bool(ref_state) and ref_state.keys() == new_state.keys() and all(
        ref_state[k].shape == new_state[k].shape for k in ref_state)


def passes_with_copied_weights(request: WorkerRequest, reference: ModuleType, ref_model: Any, new_model: Any,
                                device: torch.device, failed: TrialResult | None = None) -> bool | None:
    """Would the failed candidate pass with the reference's parameters? Tells a program that computes
    the right function from one that does not; None where the two state_dicts do not line up."""
    if not same_state_layout(ref_model, new_model):
        return None
    trials = [] if failed is None else [failed]
    seed, distribution = (trials[0].seed, trials[0].distribution) if trials else (request.config.seed + 1, "given")
    try:  # in place: the verification ends after this (the candidate already failed)
        new_model.load_state_dict(ref_model.state_dict())
        # the inputs of the trial that failed: on others an inaccurate program can pass, and the
        # verdict would blame the parameters
        inputs = make_trial_inputs(reference.get_inputs, seed, distribution, device)
        expected = detached(ref_model(*cloned(inputs)))
        got = detached(new_model(*cloned(inputs)))
        return compare_outputs(expected, on_device(got, device), request.config.tol).passed
    except Exception:
        return None


def poison_free_memory(device: Any, nbytes: int) -> None:
    """Return cached blocks to the driver, then fill fresh allocations with 0xFF (NaN as fp32).

    A candidate that returns uninitialised memory hoping it still holds the reference's
    output (or its own from a previous call) then reads NaNs instead.
    """
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    size = max(min(nbytes, int(free * 0.8)), 0)
    blocks = []
    if size:
        blocks.append(torch.empty(size, dtype=torch.uint8, device=device).fill_(0xFF))
    # the caching allocator serves allocations under 1 MB from a separate pool of small blocks
    blocks += [torch.empty(512 * 1024, dtype=torch.uint8, device=device).fill_(0xFF) for _ in range(8)]
    torch.cuda.synchronize(device)
    del blocks  # the poisoned blocks stay in the allocator's cache and serve the next allocations


def run_trials(request: WorkerRequest, result: WorkerResult, reference: ModuleType, ref_model: Any, new_model: Any,
               device: torch.device, audit_state: Callable[[str], None], checkpoint: Callable[[], None],
               fp64: Fp64Reference | None = None) -> None:
    """``config.trials`` trials into ``result.correctness``; a crash stops the run (:func:`fail`).
    ``audit_state`` checks torch's flags and the harness after each call of the candidate;
    ``checkpoint`` saves the result so far. ``fp64``: the reference in float64, for a trial whose
    fp32 reference is itself beyond the tolerance (verify/conditioning.py); None where the task's
    state or random draws make an fp64 re-run a different computation."""
    config = request.config
    tolerance = config.tol
    mutation_reported = False
    prints: list[TrialPrint] = []  # outputs fingerprinted per trial: a cache returns an earlier one
    for index in range(config.trials):
        seed, distribution = trial_draw(config.seed, index)
        order = "reference-first" if index % 2 == 0 else "candidate-first"
        trial = TrialResult(index=index, seed=seed, distribution=distribution, order=order, passed=False)
        result.correctness.trials.append(trial)
        pristine = make_trial_inputs(reference.get_inputs, seed, distribution, device)

        def run_reference(inputs=pristine):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            set_tf32(False)
            out = detached(ref_model(*cloned(inputs)))
            peak = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else 0
            return out, peak

        def run_candidate(inputs=pristine, trial=trial):
            nonlocal mutation_reported
            args = cloned(inputs)
            try:
                out = new_model(*args)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                out = detached(out)
            except BaseException as exc:
                trial.error = f"{type(exc).__name__}: {exc}"[:500]
                fail(result, exc, f"correctness trial {trial.index}")
            audit_state(f"in forward, trial {trial.index}")
            changed = changed_inputs(inputs, args)
            if changed and not mutation_reported:
                mutation_reported = True
                result.findings.append(Finding(
                    check="input_mutation", level="total",
                    detail=f"forward modified its input(s) {changed} in place",
                ))
            return out

        if order == "reference-first":
            ref_out, peak = run_reference()
            poison_free_memory(device, peak)
            cand_out = run_candidate()
        else:
            poison_free_memory(device, 1 << 30)
            cand_out = run_candidate()
            ref_out, peak = run_reference()
        poison_free_memory(device, peak)
        # both outputs stay on the device (a copy, apart from buffers the models reuse): moving a
        # level-1 task's 6 GB outputs to the CPU and back cost seconds per trial
        comparison = compare_outputs(ref_out, on_device(cand_out, device), tolerance)
        trial.conditioning = reconsider(comparison, ref_out, on_device(cand_out, device), pristine, fp64, tolerance)
        prints.append(TrialPrint(index=index, candidate=fingerprint(cand_out), reference=fingerprint(ref_out),
                                 passed=comparison.passed))
        del ref_out, cand_out, pristine, run_reference, run_candidate  # before the next trial draws
        trial.passed = comparison.passed
        trial.error = comparison.error
        trial.max_abs_error = comparison.max_abs_error
        trial.max_rel_error = comparison.max_rel_error
        trial.rel_l2_error = comparison.rel_l2_error
        trial.mismatched = comparison.mismatched
        trial.elements = comparison.elements
        trial.worst = comparison.worst
        result.output_dtypes = list(comparison.output_dtypes)
        for field in ("max_abs_error", "max_rel_error", "rel_l2_error"):
            value = getattr(comparison, field)
            current = getattr(result.correctness, field)
            if value is not None and (current is None or value > current):
                setattr(result.correctness, field, value)
        checkpoint()
        if not comparison.passed and comparison.max_abs_error is None:
            break  # shape/dtype/structure errors repeat identically; one is enough
    if (cached := repeated_output_finding(prints)) is not None:
        result.findings.append(cached)
