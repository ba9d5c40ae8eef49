"""Correctness: input distributions for the trials and the comparison of two outputs.

Pure functions over tensors; the worker decides when to call them. The comparison checks,
in order: structure, shape, dtype, the NaN/Inf pattern, then the tolerance, and reports the
errors whether or not it passes, so the Coder learns how close a wrong answer was.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from stitchcuda.task.inspect import draw_inputs
from stitchcuda.verify.config import Tolerance

# Each trial draws the task's own inputs with a fresh seed, then reshapes their value
# distribution. Transforms keep the sign and range structure of what get_inputs() returned
# (positive inputs stay positive, values stay inside the drawn range) so that a task whose
# math needs, say, positive inputs is not broken by the trial itself.


def _given(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return x


def _uniform_in_range(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    lo, hi = x.min(), x.max()
    return lo + (hi - lo) * torch.rand(x.shape, generator=g, dtype=x.dtype, device=x.device)


def _scaled(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return x * 3.0


def _shrunk(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    return x * 0.05


def _heavy_tailed(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    # a few large-magnitude entries, signs kept: catches overflow-prone reductions
    spikes = (torch.rand(x.shape, generator=g, device=x.device) < 0.01).to(x.dtype) * 15.0 + 1.0
    return x * spikes


DISTRIBUTIONS: dict[str, Callable[[torch.Tensor, torch.Generator], torch.Tensor]] = {
    "given": _given,
    "uniform-in-range": _uniform_in_range,
    "scaled-x3": _scaled,
    "shrunk-x0.05": _shrunk,
    "heavy-tailed": _heavy_tailed,
}


def distribution_for_trial(index: int) -> str:
    names = list(DISTRIBUTIONS)
    return names[index % len(names)]


def trial_draw(seed: int, index: int) -> tuple[int, str]:
    """Correctness trial ``index``'s seed and value distribution (the baselines are judged on the
    same inputs)."""
    return seed + 1 + index, distribution_for_trial(index)


def make_trial_inputs(get_inputs: Callable[[], Sequence[Any]], seed: int, distribution: str,
                      device: torch.device | str | None = None) -> list[Any]:
    """The task's inputs for one trial: seeded draw, then the named transform on float tensors.

    With a device, get_inputs() runs with that device as torch's default, so its random
    tensors are drawn where they are used: a level-1 task's 6 GB input took ~10 s per trial to
    draw, transform and copy on the CPU. A get_inputs() that cannot run that way (it calls
    .numpy(), say) is drawn on the CPU and moved.
    """
    inputs = draw_inputs(get_inputs, device, seed)
    generators: dict[torch.device, torch.Generator] = {}  # one stream per device: inputs of one shape differ
    out = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            if device is not None:
                value = value.to(device)
            if value.is_floating_point() and value.numel() > 0:
                if value.device not in generators:
                    generators[value.device] = torch.Generator(device=value.device).manual_seed(seed + 7919)
                value = DISTRIBUTIONS[distribution](value, generators[value.device]).to(value.dtype)
        out.append(value)
    return out


# --- comparison ------------------------------------------------------------------------------


@dataclass
class Comparison:
    passed: bool
    error: str | None = None
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    rel_l2_error: float | None = None
    mismatched: int = 0
    elements: int = 0
    worst: str | None = None
    output_dtypes: tuple[str, ...] = ()


def flatten_output(value: Any) -> list[torch.Tensor] | None:
    """A model output's tensors in torch's pytree order (a tensor, or tuples, lists and dicts of them,
    nested); None where it holds anything else."""
    from torch.utils._pytree import tree_leaves

    leaves = tree_leaves(value)
    if not leaves or not all(isinstance(x, torch.Tensor) for x in leaves):
        return None
    return leaves


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def compare_outputs(reference: Any, candidate: Any, tolerance: Tolerance) -> Comparison:
    ref = flatten_output(reference)
    cand = flatten_output(candidate)
    if ref is None:
        return Comparison(False, error=f"the reference returned {type(reference).__name__}, not tensors")
    if cand is None:
        return Comparison(False, error=f"the candidate returned {type(candidate).__name__}, expected tensors")
    dtypes = tuple(dtype_name(c.dtype) for c in cand)
    if len(ref) != len(cand):
        return Comparison(False, error=f"the candidate returned {len(cand)} tensors, the reference {len(ref)}",
                          output_dtypes=dtypes)
    total = Comparison(True, max_abs_error=0.0, max_rel_error=0.0, rel_l2_error=0.0, output_dtypes=dtypes)
    for i, (r, c) in enumerate(zip(ref, cand, strict=True)):
        label = f"output {i}" if len(ref) > 1 else "output"
        one = _compare_tensor(r, c, tolerance, label)
        total.mismatched += one.mismatched
        total.elements += one.elements
        for field in ("max_abs_error", "max_rel_error", "rel_l2_error"):
            mine, theirs = getattr(total, field), getattr(one, field)
            if theirs is not None and (mine is None or theirs > mine):
                setattr(total, field, theirs)
                if field == "max_abs_error":
                    total.worst = one.worst
        if not one.passed:
            total.passed = False
            total.error = total.error or one.error
            total.worst = one.worst or total.worst
    return total


_COMPARE_CHUNK = 1 << 26


def _compare_tensor(ref: torch.Tensor, cand: torch.Tensor, tolerance: Tolerance, label: str) -> Comparison:
    if tuple(ref.shape) != tuple(cand.shape):
        return Comparison(False, error=f"{label} shape {tuple(cand.shape)}, expected {tuple(ref.shape)}")
    if ref.dtype != cand.dtype:
        return Comparison(False, error=f"{label} dtype {dtype_name(cand.dtype)}, expected {dtype_name(ref.dtype)}")
    n = ref.numel()
    if n == 0:
        return Comparison(True, max_abs_error=0.0, max_rel_error=0.0, rel_l2_error=0.0)
    cand = cand.to(ref.device)
    if not ref.is_floating_point() and not ref.is_complex():
        diff_mask = ref != cand
        bad = int(diff_mask.sum())
        return Comparison(bad == 0, error=None if bad == 0 else f"{label}: {bad} of {n} elements differ (exact match required)",
                          max_abs_error=float((ref.double() - cand.double()).abs().max()), mismatched=bad, elements=n)
    atol, rtol = tolerance.for_dtype(dtype_name(ref.dtype))
    # float64 in chunks: a whole-tensor float64 copy of a 6 GB output (KernelBench level 1 has
    # several) would need tens of GB beside the model's own tensors
    flat_ref, flat_cand = ref.detach().reshape(-1), cand.detach().reshape(-1)
    mismatched = bad_pattern = 0
    max_diff = max_rel = 0.0
    diff_sq = ref_sq = 0.0
    first_bad_pattern: int | None = None
    worst_index, worst_score = 0, -1.0
    for begin in range(0, n, _COMPARE_CHUNK):
        r = flat_ref[begin:begin + _COMPARE_CHUNK].double()
        c = flat_cand[begin:begin + _COMPARE_CHUNK].double()
        # Non-finite values must sit in the same places with the same sign.
        pattern_ok = torch.isnan(r) == torch.isnan(c)
        pattern_ok &= torch.isposinf(r) == torch.isposinf(c)
        pattern_ok &= torch.isneginf(r) == torch.isneginf(c)
        bad_here = int((~pattern_ok).sum())
        if bad_here and first_bad_pattern is None:
            first_bad_pattern = begin + int(torch.argmax((~pattern_ok).to(torch.uint8)))
        bad_pattern += bad_here
        finite = torch.isfinite(r) & torch.isfinite(c)
        diff = torch.where(finite, (c - r).abs(), torch.zeros_like(r))
        max_diff = max(max_diff, float(diff.max()))
        max_rel = max(max_rel, float((diff / r.abs().clamp_min(max(atol, 1e-12))).max()))
        mismatch = (diff > atol + rtol * r.abs()) | ~pattern_ok
        mismatched += int(mismatch.sum())
        ref_sq += float(torch.linalg.vector_norm(torch.where(finite, r, torch.zeros_like(r)))) ** 2
        diff_sq += float(torch.linalg.vector_norm(diff)) ** 2
        score = torch.where(mismatch, diff + 1.0, diff)
        here = int(torch.argmax(score))
        if float(score[here]) > worst_score:
            worst_index, worst_score = begin + here, float(score[here])
    if first_bad_pattern is not None:
        worst_index = first_bad_pattern
    rel_l2 = math.sqrt(diff_sq) / max(math.sqrt(ref_sq), 1e-30)
    where = _unravel(worst_index, tuple(ref.shape))
    worst = (f"{label}{list(where)}: candidate {float(flat_cand[worst_index]):.6g}, "
             f"reference {float(flat_ref[worst_index]):.6g}")
    result = Comparison(
        passed=mismatched == 0,
        max_abs_error=max_diff,
        max_rel_error=max_rel,
        rel_l2_error=rel_l2,
        mismatched=mismatched,
        elements=n,
        worst=worst,
    )
    if bad_pattern:
        result.error = f"{label}: NaN/Inf pattern differs from the reference at {bad_pattern} of {n} elements"
    elif mismatched:
        result.error = (f"{label}: {mismatched} of {n} elements outside atol={atol:g}, rtol={rtol:g} "
                        f"(max abs error {result.max_abs_error:.3g}, max rel {result.max_rel_error:.3g})")
    return result


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    coords = []
    for size in reversed(shape):
        coords.append(index % size)
        index //= size
    return tuple(reversed(coords))


def detached(value: Any) -> Any:
    """An output on its device, apart from the graph or buffers that made it (a CUDA graph's
    static output is overwritten by the next replay)."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, value)


def on_device(value: Any, device: Any) -> Any:
    """``value`` (a tensor, or tuples, lists and dicts of them) moved to ``device``."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: v.to(device) if isinstance(v, torch.Tensor) else v, value)


def cloned(values: Sequence[Any]) -> list[Any]:
    """Fresh copies of the tensor arguments (the rest as they are): a call may not touch the originals."""
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in values]


def changed_inputs(before: Sequence[Any], after: Sequence[Any]) -> list[int]:
    """Indices of tensor inputs whose values changed (NaN-aware, bitwise on the values)."""
    changed = []
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        if isinstance(b, torch.Tensor) and isinstance(a, torch.Tensor):
            same = b.shape == a.shape and torch.equal(torch.nan_to_num(b), torch.nan_to_num(a.to(b.device)))
            if not same or (b.is_floating_point() and not torch.equal(torch.isnan(b), torch.isnan(a.to(b.device)))):
                changed.append(i)
    return changed
