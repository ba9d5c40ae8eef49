"""The data-movement operators as reads of the kernel IR (expr.py): a gather or an index (a read
indexed by int64 values), a pooling window (its taps), and the pieces of a
concatenation (each a read guarded to its range of the concatenated axis)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from stitchcuda.compiler.ir.expr import (
    Expr,
    Gather,
    Leaf,
    Operand,
    Unsupported,
    broadcast,
    const,
    numel,
    op,
)
from stitchcuda.compiler.ir.op_table import tagged

GATHER_OPS = tagged("gather")
CAT_OPS = tagged("cat")
POOL_OPS = tagged("pool")
DATA_OPS = GATHER_OPS | CAT_OPS | POOL_OPS


def _read(e: Expr, where: str, what: str, indexed: bool = False) -> Leaf:
    """The read behind ``e`` (a plain one unless ``indexed`` allows a gather); anything else raises."""
    lf = e.leaf if e.op == "leaf" else None
    if lf is None or lf.guard is not None or (lf.gathers and not indexed):
        raise Unsupported(f"{where}: {what} is computed inside the group (only a buffer read is supported)")
    return lf


def gather_expr(node: Any, arg: Operand) -> Expr:
    """``aten.embedding`` / ``aten.gather`` / ``aten.index.Tensor`` of buffer reads: the table read
    through the output shape (stride 0 along the indexed dimensions) plus one :class:`Gather` per
    index tensor (the operands' dtypes are checked by the caller)."""
    name, a = node.op, node.args
    where = f"{node.name} ({name}.{node.overload})"
    out = tuple(node.out[0].shape)
    if name == "aten.embedding":
        w, k = _read(arg(a[0]), where, "the table"), _read(arg(a[1]), where, "the index")
        if len(w.shape) != 2 or out != k.shape + (w.shape[1],):
            raise Unsupported(f"{where}: table {list(w.shape)} indexed by {list(k.shape)}")
        index = Leaf(k.value, k.shape + (1,), k.strides + (0,), k.offset)
        lf = Leaf(w.value, out, (0,) * len(k.shape) + (w.strides[1],), w.offset,
                  (Gather(index, w.strides[0], w.shape[0]),))
    elif name == "aten.gather":
        x, k = _read(arg(a[0]), where, "the input"), _read(arg(a[2]), where, "the index")
        dim = a[1] % max(len(x.shape), 1)
        if len(k.shape) != len(x.shape) or k.shape != out or any(
                kd > xd for d, (kd, xd) in enumerate(zip(k.shape, x.shape, strict=True)) if d != dim):
            raise Unsupported(f"{where}: input {list(x.shape)} gathered by {list(k.shape)}")
        strides = list(x.strides)
        strides[dim] = 0
        lf = Leaf(x.value, out, tuple(strides), x.offset, (Gather(k, x.strides[dim], x.shape[dim]),))
    elif name == "aten.index" and node.overload == "Tensor":
        x = _read(arg(a[0]), where, "the input")
        spec = list(a[1])
        pos = [i for i, v in enumerate(spec) if v is not None]
        if not pos or pos != list(range(pos[0], pos[-1] + 1)):
            raise Unsupported(f"{where}: index tensors separated by full slices")
        first, count = pos[0], len(pos)
        idx = [_read(arg(spec[i]), where, "an index") for i in pos]
        b = broadcast(*(k.shape for k in idx))
        after = len(x.shape) - first - count
        if out != x.shape[:first] + b + x.shape[first + count:]:
            raise Unsupported(f"{where}: input {list(x.shape)} indexed to {list(out)}")
        gathers = tuple(Gather(Leaf(k.value, k.shape + (1,) * after, k.strides + (0,) * after, k.offset),
                               x.strides[first + j], x.shape[first + j], wrap=True) for j, k in enumerate(idx))
        lf = Leaf(x.value, out, x.strides[:first] + (0,) * len(b) + x.strides[first + count:], x.offset, gathers)
    else:
        raise Unsupported(f"{where} is not a supported gather")
    return Expr("leaf", leaf=lf, shape=out)


def _pool2d_geometry(node: Any, in_shape: Sequence[int]) -> tuple[tuple[int, int], tuple[int, int],
                                                                   tuple[int, int]]:
    """(kernel, stride, dilation) of a pooling :func:`pool_expr` takes: 2-d over a 3-d or 4-d input
    of fewer than 2^31 elements, unpadded, floor mode, no divisor override, the output the usual
    size; raises Unsupported else."""
    name, a = node.op, list(node.args)
    where = f"{node.name} ({name}.{node.overload})"
    if name not in POOL_OPS or len(in_shape) not in (3, 4):
        raise Unsupported(f"{where}: input of shape {list(in_shape)}")

    def pair(v: Any, default: Any, what: str) -> tuple[int, int]:
        v = default if v is None or v == [] else v
        v = list(v) if isinstance(v, (list, tuple)) else [v, v]
        v = v * 2 if len(v) == 1 else v
        if len(v) != 2 or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
            raise Unsupported(f"{where}: {what} {v!r}")
        return v[0], v[1]

    a += [None] * (7 - len(a))
    kernel = pair(a[1], None, "kernel size")
    stride = pair(a[2], kernel, "stride")
    padding = pair(a[3], 0, "padding")
    if name == "aten.max_pool2d":
        dilation, ceil = pair(a[4], 1, "dilation"), bool(a[5])
    else:
        dilation, ceil = (1, 1), bool(a[4])
        if a[6] is not None:
            raise Unsupported(f"{where}: a divisor override")
    if padding != (0, 0) or ceil:
        raise Unsupported(f"{where}: padded or ceil-mode pooling")
    if numel(in_shape) > 2 ** 31 - 1:  # the pointwise kernels index in int
        raise Unsupported(f"{where}: an input of 2^31 elements or more")
    h, w = in_shape[-2:]
    expect = (*in_shape[:-2], (h - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1,
              (w - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1)
    if tuple(node.out[0].shape) != expect:
        raise Unsupported(f"{where}: output {list(node.out[0].shape)} is not {list(expect)}")
    return kernel, stride, dilation


def pool_fusable(node: Any, in_shape: Sequence[int] | None) -> bool:
    """Whether :func:`pool_expr` takes this pooling (else the pooling family lowers it)."""
    if node.op not in POOL_OPS or in_shape is None:
        return False
    try:
        _pool2d_geometry(node, in_shape)
    except Unsupported:
        return False
    return True


def pool_expr(node: Any, arg: Operand) -> Expr:
    """Unpadded 2-d max / average pooling of a buffer read: the window's k x k elements are k x k
    strided reads of the input through the output shape (offsets i * dilation along each axis,
    strides times the pooling stride), combined with max or summed and scaled."""
    name = node.op
    x = _read(arg(node.args[0]), f"{node.name} ({name}.{node.overload})", "the input")
    kernel, stride, dilation = _pool2d_geometry(node, x.shape)
    out = tuple(node.out[0].shape)
    lead_strides = x.strides[:-2]
    sh, sw = x.strides[-2:]
    reads = [Expr("leaf", leaf=Leaf(x.value, out, lead_strides + (sh * stride[0], sw * stride[1]),
                                    x.offset + i * dilation[0] * sh + j * dilation[1] * sw), shape=out)
             for i in range(kernel[0]) for j in range(kernel[1])]
    combined = reads[0]
    for r in reads[1:]:
        combined = op("max" if name == "aten.max_pool2d" else "add", combined, r)
    return combined if name == "aten.max_pool2d" else op("mul", combined, const(1.0 / len(reads)))


def _unsqueeze(lf: Leaf, dim: int) -> Leaf:
    """``lf`` with a new size-1 dimension at ``dim`` (its index reads too, where they reach it)."""
    gathers = []
    for g in lf.gathers:
        k = dim - (len(lf.shape) - len(g.index.shape))
        x = g.index
        if k >= 0:
            x = replace(x, shape=x.shape[:k] + (1,) + x.shape[k:], strides=x.strides[:k] + (0,) + x.strides[k:])
        gathers.append(replace(g, index=x))
    return replace(lf, shape=lf.shape[:dim] + (1,) + lf.shape[dim:], strides=lf.strides[:dim] + (0,) + lf.strides[dim:],
                   gathers=tuple(gathers))


def _lift(lf: Leaf, dim: int, start: int, total: int) -> Leaf:
    """The piece ``lf`` of a concatenation along ``dim``, read over the whole output: coordinate
    ``c`` along ``dim`` reads the piece's ``c - start`` and only where it lies in the piece."""
    size = lf.shape[dim]

    def shift(x: Leaf, k: int) -> Leaf:
        if k < 0 or x.shape[k] == 1:
            return x
        return replace(x, shape=x.shape[:k] + (total,) + x.shape[k + 1:], offset=x.offset - start * x.strides[k])

    gathers = tuple(replace(g, index=shift(g.index, dim - (len(lf.shape) - len(g.index.shape)))) for g in lf.gathers)
    if size == 1:  # one coordinate of it: stride 0, nothing to shift
        main = replace(lf, shape=lf.shape[:dim] + (total,) + lf.shape[dim + 1:],
                       strides=lf.strides[:dim] + (0,) + lf.strides[dim + 1:])
    else:
        main = shift(lf, dim)
    return replace(main, gathers=gathers, guard=(dim - len(lf.shape), start, start + size))


def cat_expr(node: Any, arg: Operand) -> Expr:
    """``aten.cat`` / ``aten.stack`` of reads (plain or gathered) as the sum of guarded pieces, each
    read only where the output coordinate along the concatenated axis lies in its range."""
    a = node.args
    where = f"{node.name} ({node.op}.{node.overload})"
    out = tuple(node.out[0].shape)
    dim = (a[1] if len(a) > 1 else 0) % len(out)
    pieces = []
    for x in a[0]:
        lf = _read(arg(x), where, "a concatenated value", indexed=True)
        if node.op == "aten.stack":
            lf = _unsqueeze(lf, dim)
        if numel(lf.shape) == 0:
            continue  # torch.cat skips empty (legacy 1-D) pieces
        if len(lf.shape) != len(out) or lf.shape[:dim] != out[:dim] or lf.shape[dim + 1:] != out[dim + 1:]:
            raise Unsupported(f"{where}: piece {list(lf.shape)} of {list(out)} along dim {dim}")
        pieces.append(lf)
    if len(pieces) == 1:
        return Expr("leaf", leaf=pieces[0], shape=out)
    terms, start = [], 0
    for lf in pieces:
        terms.append(Expr("leaf", leaf=_lift(lf, dim, start, out[dim]), shape=out))
        start += lf.shape[dim]
    if start != out[dim]:
        raise Unsupported(f"{where}: pieces of {start} along dim {dim}, the output has {out[dim]}")
    result = terms[0]
    for t in terms[1:]:
        result = op("add", result, t)
    return result
