"""Trials the tolerance cannot judge: outputs whose fp32 value is itself uncertain beyond it.

A deep network with random weights (Inception v3's logits reach 1e12; ResNet-101's fp32 result
moves by 1.7e-4 with the convolution algorithm) or a sum of 8192 GEMM outputs has an fp32
reference that misses the same model's fp64 value by more than ``atol + rtol * |ref|`` at some
elements. No program can then pass against it, short of repeating the reference's own rounding
operation for operation: an exact program fails. Such a trial is judged against the fp64 value
instead: the candidate's error may be at most ``FACTOR`` times the fp32 reference's own error, in
its largest element and in relative L2 (a different but equally sound order of fp32 operations
lands within a small factor of it; a wrong program lands far outside). The trial records both
errors, and the verdict says the trial was judged so. Tasks with state or random draws are not
re-run in fp64 (the fp64 run would start from another state or draw other numbers).
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch

from stitchcuda.verify.config import Tolerance
from stitchcuda.verify.correctness import cloned, compare_outputs
from stitchcuda.verify.verdict import ConditioningCheck

FACTOR = 4.0


class Fp64Reference:
    """The reference model in float64 on the same device, made once and only when a trial needs it."""

    def __init__(self, ref_model: Any):
        self._source = ref_model
        self._model: Any = None
        self.unavailable: str | None = None
        self.seconds = 0.0  # spent making and running the fp64 copy

    def __call__(self, inputs: list[Any]) -> Any | None:
        if self.unavailable is not None:
            return None
        started = time.perf_counter()
        try:
            return self._run(inputs)
        finally:
            self.seconds += time.perf_counter() - started

    def _run(self, inputs: list[Any]) -> Any | None:
        try:
            if self._model is None:
                self._model = copy.deepcopy(self._source).double()
            args = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in cloned(inputs)]
            return _as_float32(self._model(*args))
        except Exception as exc:  # out of memory, an op without a float64 kernel: judged as before
            self.unavailable = f"{type(exc).__name__}: {str(exc)[:200]}"
            self._model = None
            return None

    def release(self) -> None:
        self._model = None


def _as_float32(value: Any) -> Any:
    from torch.utils._pytree import tree_map

    def cast(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        return v.detach().float() if v.dtype == torch.float64 else v.detach()
    return tree_map(cast, value)


def judge_against_fp64(reference: Any, candidate: Any, exact: Any, tolerance: Tolerance) -> ConditioningCheck | None:
    """None where the fp32 ``reference`` is within the tolerance of ``exact`` (its fp64 value, as
    float32): the ordinary comparison stands. Otherwise the candidate judged against ``exact``."""
    own = compare_outputs(exact, reference, tolerance)
    if own.passed or own.max_abs_error is None or own.rel_l2_error is None:
        return None
    theirs = compare_outputs(exact, candidate, tolerance)
    if theirs.max_abs_error is None or theirs.rel_l2_error is None:
        return None
    passed = theirs.max_abs_error <= FACTOR * own.max_abs_error and theirs.rel_l2_error <= FACTOR * max(
        own.rel_l2_error, 1e-12)
    return ConditioningCheck(reference_max_abs=own.max_abs_error, reference_rel_l2=own.rel_l2_error,
                             candidate_max_abs=theirs.max_abs_error, candidate_rel_l2=theirs.rel_l2_error,
                             factor=FACTOR, passed=passed)


def reconsider(comparison: Any, reference: Any, candidate: Any, inputs: list[Any], fp64: Fp64Reference | None,
               tolerance: Tolerance) -> ConditioningCheck | None:
    """A failed numeric ``comparison`` judged again against fp64 where the fp32 reference is itself
    beyond the tolerance: ``comparison`` passes when the candidate is within ``FACTOR`` of the
    reference's own error. The check, or None where the ordinary comparison stands."""
    if comparison.passed or comparison.max_abs_error is None or fp64 is None:
        return None
    exact = fp64(inputs)
    check = None if exact is None else judge_against_fp64(reference, candidate, exact, tolerance)
    if check is not None:
        comparison.passed = check.passed
        if check.passed:
            comparison.error = None
    return check

