"""Controls for KernelBench's harness: can its tolerance judge this task in fp32 at all?

Where its harness finds a program of ours wrong against a true-fp32 reference too, it is asked
about two candidates that are right by construction:

- the exact answer: the reference itself, run in float64 on a copy of its module, its outputs
  rounded to float32;
- the reference reordered: the reference itself in fp32, channels-last (another, equally valid
  order of every convolution's sums; a model without 4-d tensors is unchanged by it).

Where one fails, its 1e-4 is below its fp32 reference's own rounding spread on the task: a deep
network in training mode with random weights can be such a task (ResNet-101, on an H100, one input
outside its harness: the reference run channels-last missed it by 2.7e-4, the program by 1.9e-4,
the fp32 reference missed fp64 by 2.2e-4; in a bench its harness's own five trials passed both
controls, so there the task was judged). Its "incorrect" then says nothing of a program that
misses by no more than ``FACTOR`` times what the control missed by (our trial's rule against fp64,
verify/conditioning.py): the task is not judgeable by it for that program. A program further off
stays judged wrong. Both controls run the reference's own forward on its own state, which advances
as the reference's does; both run under no_grad, as its harness calls them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from stitchcuda.verify.conditioning import FACTOR  # our own trial's rule: a sound fp32 order lands within it

_EXACT = """

# stitchcuda: a control, not a program: the reference in float64, its outputs rounded to float32
import copy as _stitchcuda_copy

import torch
from torch.utils._pytree import tree_map as _stitchcuda_tree_map


def _stitchcuda_cast(v, dtype):
    return v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v


class ModelNew(Model):
    @torch.no_grad()  # (a state tensor with a graph could not be copied)
    def forward(self, *args):
        exact = _stitchcuda_copy.deepcopy(self).double()
        out = Model.forward(exact, *_stitchcuda_tree_map(lambda v: _stitchcuda_cast(v, torch.float64), args))
        # the state it left (running statistics, a kept hidden state) becomes this module's, as
        # the reference's own call leaves its state
        for mine, theirs in zip(self.modules(), exact.modules()):
            for key, value in list(theirs._buffers.items()) + [
                    (k, v) for k, v in vars(theirs).items()
                    if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter)]:
                old = getattr(mine, key, None)
                if isinstance(old, torch.Tensor) and isinstance(value, torch.Tensor):
                    setattr(mine, key, value.to(old.dtype))
        return _stitchcuda_tree_map(lambda v: _stitchcuda_cast(v, torch.float32), out)
"""

_REORDERED = """

# stitchcuda: a control, not a program: the reference itself in fp32, channels-last
import torch


def _stitchcuda_channels_last(v):
    return v.contiguous(memory_format=torch.channels_last) if isinstance(v, torch.Tensor) and v.dim() == 4 else v


class ModelNew(Model):
    @torch.no_grad()
    def forward(self, *args):
        self.to(memory_format=torch.channels_last)
        return Model.forward(self, *(_stitchcuda_channels_last(a) for a in args))
"""


def exact_control(reference: str) -> str:
    """A candidate source computing ``reference`` exactly: in float64, rounded to float32."""
    return reference + _EXACT


def reordered_control(reference: str) -> str:
    """A candidate source computing ``reference`` in fp32 in another order: channels-last."""
    return reference + _REORDERED


def max_difference(detail: str) -> float | None:
    """The largest of the per-trial ``max_difference`` figures its harness reports, or None."""
    found = re.search(r"max_difference: \[([^\]]*)\]", detail)
    values = [float(v) for v in re.findall(r"[-+0-9.eE]+", found.group(1))] if found else []
    return max(values) if values else None


def _verdict_of(control: Any) -> bool | None:
    # a miss it measured (max_difference) is a verdict; an exception, a shape or no result is not
    measured = control.correct or "max_difference" in control.detail
    return bool(control.correct) if control.compiled and measured else None


def ask_controls(verdict: Any, judge: Callable[[str], Any], reference: str,
                 on_gpu: Callable[[], AbstractContextManager[None]], program_max: float | None) -> None:
    """Fill ``verdict``'s ``reordered_correct``, ``exact_correct``, ``control_detail`` and
    ``judgeable``: ``judge(candidate_source)`` is the harness's verdict against its true-fp32
    reference; ``program_max`` the program's largest difference there. The reordered control
    first; the exact one only where that passed."""
    details = []
    for field, source in (("reordered_correct", reordered_control(reference)),
                          ("exact_correct", exact_control(reference))):
        with on_gpu():
            control = judge(source)
        setattr(verdict, field, _verdict_of(control))
        details.append(f"{field.split('_')[0]}: {control.detail[:200] or 'correct'}")
        if getattr(verdict, field) is False:
            missed = max_difference(control.detail)
            verdict.judgeable = not (missed is not None and program_max is not None and program_max <= FACTOR * missed)
            details.append(f"the program missed by {program_max}, the control by {missed}")
            break
    verdict.control_detail = "; ".join(details)[:500]
