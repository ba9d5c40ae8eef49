"""Output caching seen at run time, whatever the cache is keyed on (shape, data pointer, id(),
call count): the static checks recognise only the cache checks they can read.

Two probes, both cheap:

- Across the correctness trials (fresh inputs each): each trial keeps a small fingerprint of the
  candidate's and the reference's outputs. A trial whose output is wrong and identical to an
  earlier trial's output that was right, while the two references differ, got a stored result.
- After timing (hundreds of calls on one input): a post-timing trial draws fresh inputs and
  checks the output, then refills the same input tensors in place with other values (same
  objects, addresses and shapes, new contents) and checks again. A program that went stale
  after N calls fails the first; one keyed on anything but the values fails the second.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from pydantic import BaseModel

from stitchcuda.verify.conditioning import reconsider
from stitchcuda.verify.correctness import compare_outputs, make_trial_inputs
from stitchcuda.verify.torch_state import set_tf32
from stitchcuda.verify.verdict import Finding

SAMPLES = 16  # elements read per output tensor, spread evenly over it


class TensorPrint(BaseModel, frozen=True):
    """A cheap summary of one output tensor: equal prints mean (almost surely) equal tensors."""

    shape: tuple[int, ...]
    dtype: str
    total: float
    samples: tuple[float, ...]


class TrialPrint(BaseModel):
    """One correctness trial's outputs, fingerprinted, and whether the candidate's passed."""

    index: int
    candidate: tuple[TensorPrint, ...]
    reference: tuple[TensorPrint, ...]
    passed: bool


def _tensors(value: Any) -> Iterator[Any]:
    from torch.utils._pytree import tree_leaves

    yield from (v for v in tree_leaves(value) if isinstance(v, torch.Tensor))


def fingerprint(value: Any) -> tuple[TensorPrint, ...]:
    """Prints of every tensor in an output (a tensor, or nested tuples, lists and dicts of them),
    computed where the tensor lives: one small copy to the host per tensor."""
    prints = []
    for t in _tensors(value):
        flat = t.detach().reshape(-1)
        if t.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        if flat.dtype.is_floating_point:
            # float32 accumulation: no float64 copy of a multi-GB output; equality is all we need
            total = flat.sum(dtype=torch.float64 if flat.dtype == torch.float64 else torch.float32)
        else:
            total = flat.sum(dtype=torch.int64)
        n, k = flat.numel(), min(SAMPLES, flat.numel())
        # integer positions (a float linspace rounds past the end of a multi-GB tensor)
        index = torch.arange(k, device=flat.device, dtype=torch.int64) * (n - 1) // max(k - 1, 1)
        summary = torch.cat([total.double().reshape(1), flat[index].double()]).cpu().tolist()
        prints.append(TensorPrint(shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""),
                                  total=summary[0], samples=tuple(summary[1:])))
    return tuple(prints)


def _same_value(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def same_output(a: tuple[TensorPrint, ...], b: tuple[TensorPrint, ...]) -> bool:
    """Bitwise-equal prints (NaN equal to NaN): the same output, not a close one."""
    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and _same_value(x.total, y.total)
        and len(x.samples) == len(y.samples) and all(_same_value(p, q) for p, q in zip(x.samples, y.samples, strict=True))
        for x, y in zip(a, b, strict=True)
    )


def repeated_output(trials: list[TrialPrint]) -> tuple[int, int] | None:
    """(earlier, later) trial indices where the later trial failed with exactly the output the
    earlier one computed correctly, although their references differ. A program whose output
    never depends on its input (zero weights, say) is wrong in every trial, so never "earlier"."""
    for j, later in enumerate(trials):
        if later.passed:
            continue
        for earlier in trials[:j]:
            if earlier.passed and same_output(earlier.candidate, later.candidate) \
                    and not same_output(earlier.reference, later.reference):
                return earlier.index, later.index
    return None


def repeated_output_finding(trials: list[TrialPrint]) -> Finding | None:
    pair = repeated_output(trials)
    if pair is None:
        return None
    return Finding(check="output_caching", level="total",
                   detail=f"correctness trial {pair[1]} (fresh inputs) returned exactly the output of trial {pair[0]}, "
                          "whose inputs and reference differ: forward returns stored results instead of computing")


class PostTimingTrial(BaseModel):
    """The post-timing trial's outcome: a fresh draw, then the same tensors refilled."""

    fresh_passed: bool
    fresh_error: str | None = None
    refill_passed: bool = True
    refill_error: str | None = None
    refill_repeats_fresh: bool = False  # the refilled call returned exactly the fresh call's output


def stale_output_finding(trial: PostTimingTrial) -> Finding | None:
    after = "after the timed calls"
    if not trial.fresh_passed:
        return Finding(check="output_caching", level="total",
                       detail=f"{after}, a post-timing trial with fresh inputs got a wrong output "
                              f"({trial.fresh_error or 'outside the tolerance'}) where every correctness trial passed: "
                              "the output went stale after repeated calls (a stored result, not one computed from "
                              "the new input)")
    if not trial.refill_passed:
        how = ("exactly the previous call's output" if trial.refill_repeats_fresh
               else f"a wrong output ({trial.refill_error or 'outside the tolerance'})")
        return Finding(check="output_caching", level="total",
                       detail=f"{after}, the same input tensors refilled in place with new values got {how}: the "
                              "result is keyed on the input's identity, address or shape, not on its values")
    return None


def post_timing_trial(candidate: Callable[[list[Any]], Any], reference: Callable[[list[Any]], Any],
                      draw: Callable[[int], list[Any]], compare: Callable[[Any, Any], Any]) -> PostTimingTrial:
    """Run the post-timing trial. ``candidate(args)`` and ``reference(args)`` return a detached
    output; ``draw(k)`` fresh inputs (k = 0, 1: two different draws); ``compare(ref, cand)`` the
    correctness comparison (``.passed``, ``.error``). The candidate gets the drawn tensors
    themselves, so the refill reaches the very objects it saw."""
    inputs = draw(0)
    expected = reference([v.clone() if isinstance(v, torch.Tensor) else v for v in inputs])
    got = candidate(inputs)
    first = compare(expected, got)
    outcome = PostTimingTrial(fresh_passed=first.passed, fresh_error=first.error)
    if not first.passed:
        return outcome
    got_print = fingerprint(got)
    del expected, got
    other = draw(1)
    for old, new in zip(inputs, other, strict=False):
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.shape == new.shape:
            old.copy_(new)
    del other
    expected = reference([v.clone() if isinstance(v, torch.Tensor) else v for v in inputs])
    got = candidate(inputs)
    second = compare(expected, got)
    outcome.refill_passed, outcome.refill_error = second.passed, second.error
    outcome.refill_repeats_fresh = not second.passed and same_output(got_print, fingerprint(got))
    return outcome


def _detached(value: Any, device: Any = None) -> Any:
    """A copy apart from the buffers a model reuses, on ``device`` where one is given."""
    from torch.utils._pytree import tree_map

    def copy(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        return v.detach().clone() if device is None else v.detach().to(device, copy=True)
    return tree_map(copy, value)


def stale_outputs(model: Any, ref_model: Any, get_inputs: Callable[[], Any], config: Any, device: Any,
                  fp64: Any = None) -> list[Finding]:
    """The worker's step after timing: the post-timing trial on seeds no other trial used. ``fp64``
    (verify/conditioning.py): judges a comparison the fp32 reference itself cannot pass, as the
    correctness trials do, so an ill-conditioned task is not read as a stale output."""
    last_args: list[Any] = []

    def run_reference(args: list[Any]) -> Any:
        set_tf32(False)
        last_args[:] = [a.clone() if isinstance(a, torch.Tensor) else a for a in args] if fp64 is not None else []
        return _detached(ref_model(*args))

    def run_candidate(args: list[Any]) -> Any:
        # synchronised before and after, as in correctness: a program whose side stream races its
        # inputs or escapes the caller's stream is the escape probe's finding, not a stale output
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out = model(*args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return _detached(out, device)

    def compare(ref: Any, cand: Any) -> Any:
        found = compare_outputs(ref, cand, config.tol)
        reconsider(found, ref, cand, last_args, fp64, config.tol)
        return found

    trial = post_timing_trial(
        run_candidate, run_reference,
        lambda k: make_trial_inputs(get_inputs, config.seed + config.trials + 1 + k, "given", device), compare)
    finding = stale_output_finding(trial)
    return [finding] if finding else []
