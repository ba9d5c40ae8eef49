"""The kernel IR run on the CPU with torch, structured as the generated kernel computes it (the
same order, the same reductions over a row): how the tests check a program without a GPU."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from stitchcuda.compiler.ir.expr import OPS, Expr, Leaf, Program, numel
from stitchcuda.compiler.ir.formulas import row_scalar_leaf


def _positions(shape: Sequence[int], strides: Sequence[int], offset: int) -> Any:
    """Element offsets of a strided read (any offset, negative ones of lifted pieces too)."""
    pos = torch.full((), offset, dtype=torch.long)
    for d, (size, stride) in enumerate(zip(shape, strides, strict=True)):
        at = [1] * len(shape)
        at[d] = size
        pos = pos + torch.arange(size).reshape(at) * stride
    return pos.expand(tuple(shape))


def _indexed_read(lf: Leaf, flat: Callable[[str], Any]) -> Any:
    """A gathered, guarded or windowed read over ``lf.shape``, as the kernel computes it: index
    reads bounds-checked (NaN outside), a guarded piece -0.0 outside its range, a window's tap 0.0
    outside the input (and nothing read there)."""
    def take(buf: Any, pos: Any) -> Any:
        return buf[pos.clamp(0, max(buf.numel() - 1, 0))]

    base = flat(lf.value)
    pos = _positions(lf.shape, lf.strides, lf.offset)
    valid = torch.ones(lf.shape, dtype=torch.bool)
    for g in lf.gathers:
        k = take(flat(g.index.value), _positions(g.index.shape, g.index.strides, g.index.offset)).expand(lf.shape)
        if g.wrap:
            k = torch.where(k < 0, k + g.bound, k)
        ok = (k >= 0) & (k < g.bound)
        valid = valid & ok
        pos = pos + torch.where(ok, k, 0) * g.stride
    values = torch.where(valid, take(base, pos), float("nan"))
    if lf.guard is not None:
        axis, lo, hi = lf.guard
        at = [1] * len(lf.shape)
        at[axis] = lf.shape[axis]
        coord = torch.arange(lf.shape[axis]).reshape(at)
        values = torch.where((coord >= lo) & (coord < hi), values, -0.0)
    for axis, step, shift, size in lf.window:
        at = [1] * len(lf.shape)
        at[axis] = lf.shape[axis]
        inside = torch.arange(lf.shape[axis]).reshape(at) * step + shift
        values = torch.where((inside >= 0) & (inside < size), values, 0.0)
    return values


def evaluate(program: Program, buffers: dict[str, Any]) -> dict[str, Any]:
    """Run ``program`` with torch on the CPU, structured like the generated kernel: row programs
    as [rows, n] (full) and [rows, 1] (scalar) tensors with reductions over dim 1. ``buffers``
    maps graph values to tensors; returns graph value -> tensor for the program's outputs."""
    shape = program.shape
    n = shape[-1] if shape else 1
    rows = numel(shape) // max(n, 1)
    env: dict[str, Any] = {}

    def flat(value: str) -> Any:  # int index buffers stay int64, everything else is read as float
        t = buffers[value].contiguous().reshape(-1)
        return t.long() if t.dtype in (torch.int64, torch.int32) else t.float()

    def read(lf: Leaf) -> Any:
        if lf.plain:
            base = flat(lf.value)
            view = torch.as_strided(base, lf.shape, lf.strides, lf.offset)
        else:
            view = _indexed_read(lf, flat)
        if program.kind == "pointwise":
            return view
        full = view.expand(shape).reshape(rows, n)
        return full[:, :1] if row_scalar_leaf(lf, shape) else full

    def ev(e: Expr) -> Any:
        if e.op == "leaf":
            return read(e.leaf)  # type: ignore[arg-type]
        if e.op == "const":
            return torch.tensor(e.const, dtype=torch.float32)
        if e.op == "ref":
            return env[e.ref]
        return OPS[e.op][1](*(ev(x) for x in e.args))

    for st in program.steps:
        value = torch.as_tensor(ev(st.expr))
        if program.kind == "row":
            value = value.expand(rows, n if st.kind in ("full", "reduce") else 1)
        if st.kind == "reduce":
            value = value.sum(dim=1, keepdim=True) if st.reduce == "sum" else value.amax(dim=1, keepdim=True)
        env[st.name] = value
    out = {}
    for value_name, st_name in program.outputs.items():
        target = program.output_shapes.get(value_name, shape)
        # stored in row-major order: a target that regroups the program's shape reads the same elements
        out[value_name] = env[st_name].expand(shape if program.kind == "pointwise" else env[st_name].shape) \
            .reshape(target).contiguous()
    return out
