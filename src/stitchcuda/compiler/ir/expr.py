"""Note: the offline Coder's kernel IR.

A fusion group becomes a :class:`Program`: an ordered list of SSA :class:`Step` records, each
naming one value. A step is

- ``full``: one value per element of the group's iteration space (a whole row in a row
  kernel, one element in a pointwise kernel), computed from an :class:`Expr`;
- ``scalar``: one value per row (row kernels only), computed from row scalars and constants;
- ``reduce``: a row scalar, the sum or max over the row of a full expression.

Expressions are trees over :class:`Leaf` reads (a buffer read through a shape and element
strides, so views, transposes and broadcasts are index arithmetic, not copies), references to
earlier steps, and constants. A read may also be indexed (:class:`Gather`: embedding, gather and
advanced indexing add ``index * stride`` per int64 index read, bounds-checked, NaN outside) and
guarded (one piece of a concatenation: it reads only where the output coordinate along one axis
lies in its range and is ``-0.0`` elsewhere, so a ``cat`` / ``stack`` is the sum of its lifted
pieces, exact because ``-0.0`` is the identity of float addition) or windowed (one tap of a
zero-padded convolution window: ``0.0`` where the tap falls outside the input). One table (:data:`OPS`) gives
every operator both its CUDA text and a torch function computing the same formula, so
``evaluate.evaluate`` runs a program on the CPU exactly as the generated kernel would (in the same
order, with the same reduction structure): that is how the tests check the expression builder
without a GPU.

Here too: views as reads (:func:`view_expr`); the data-movement reads (gather, pooling windows,
the pieces of a concatenation) are data_movement.py's. formulas.py lowers pointwise and row operators into expressions
and steps; anything neither knows raises :class:`Unsupported` naming the operator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from stitchcuda.compiler.ir.op_table import tagged


class Unsupported(ValueError):
    """The offline Coder cannot generate this (the message says which operator or shape, and why);
    ``ops`` names the operators of the groups that failed, where lowering knows them; ``groups`` the
    nodes of each group that failed."""

    def __init__(self, message: str, ops: frozenset[str] = frozenset(),
                 groups: tuple[tuple[str, ...], ...] = ()):
        super().__init__(message)
        self.ops = ops
        self.groups = groups

    @property
    def reasons(self) -> list[str]:
        """Every reason, one per refused group or check (the message joins them with '; ')."""
        return [r for r in str(self).split("; ") if r]

    def summary(self, limit: int = 3) -> str:
        """The first ``limit`` reasons and how many more there are: for a terminal line."""
        reasons = self.reasons
        more = len(reasons) - limit
        return "; ".join(reasons[:limit]) + (f"; and {more} more reason{'s' if more > 1 else ''}" if more > 0 else "")


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s):
            j = rank - len(s) + i
            if d != 1:
                if out[j] not in (1, d):
                    raise Unsupported(f"shapes {[list(x) for x in shapes]} do not broadcast")
                out[j] = d
    return tuple(out)


@dataclass(frozen=True)
class Gather:
    """One indexed dimension of a read: ``stride * k`` more elements, ``k`` read through the int
    ``index`` leaf (right-aligned with the read's shape); ``k`` outside ``[0, bound)`` (after adding
    ``bound`` to a negative one where ``wrap``, as advanced indexing does) makes the value NaN."""

    index: Leaf
    stride: int
    bound: int
    wrap: bool = False


@dataclass(frozen=True)
class Leaf:
    """A read of graph value ``value``'s buffer through ``shape`` and element ``strides``."""

    value: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0  # elements from the buffer's start (slices, selects); negative for a lifted piece
    gathers: tuple[Gather, ...] = ()  # indexed dimensions (their own strides are 0 in ``strides``)
    guard: tuple[int, int, int] | None = None  # (axis counted from the end, lo, hi): a piece of a cat
    # A zero-padded window (one tap of a convolution): per entry (axis counted from the end, step,
    # shift, size), the input coordinate ``coord * step + shift`` of that output axis must lie in
    # [0, size), else the value is 0.0 and nothing is read.
    window: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def plain(self) -> bool:
        """A read at an affine offset (no index reads, no guard): views and GEMMs take only these."""
        return not self.gathers and self.guard is None and not self.window

    @property
    def contiguous(self) -> bool:
        return self.plain and self.offset == 0 and self.strides == contiguous_strides(self.shape)

    def reads(self) -> list[str]:
        """The graph values this read loads: the buffer and its index buffers."""
        return [self.value, *(g.index.value for g in self.gathers)]

    def effective_strides(self, out: Sequence[int]) -> tuple[int, ...]:
        """Element strides of this read over the output shape ``out`` (0 where it broadcasts)."""
        for g in self.gathers:
            g.index.effective_strides(out)
        pad = len(out) - len(self.shape)
        if pad < 0:
            raise Unsupported(f"{self.value} of shape {list(self.shape)} does not broadcast to {list(out)}")
        eff = [0] * pad
        for d, s, o in zip(self.shape, self.strides, out[pad:], strict=True):
            if d not in (1, o):
                raise Unsupported(f"{self.value} of shape {list(self.shape)} does not broadcast to {list(out)}")
            eff.append(0 if d == 1 else s)
        return tuple(eff)


@dataclass(frozen=True)
class Expr:
    op: str  # "leaf", "const", "ref", or a key of OPS
    args: tuple[Expr, ...] = ()
    leaf: Leaf | None = None
    const: float = 0.0
    ref: str = ""
    shape: tuple[int, ...] = ()

    def leaves(self) -> list[Leaf]:
        if self.op == "leaf":
            return [self.leaf]  # type: ignore[list-item]
        return [x for a in self.args for x in a.leaves()]

    def refs(self) -> list[str]:
        if self.op == "ref":
            return [self.ref]
        return [x for a in self.args for x in a.refs()]


def leaf(value: str, shape: Sequence[int], strides: Sequence[int] | None = None, offset: int = 0) -> Expr:
    shape = tuple(shape)
    return Expr("leaf", leaf=Leaf(value, shape, tuple(strides) if strides is not None else contiguous_strides(shape),
                                  offset), shape=shape)


def const(value: float) -> Expr:
    return Expr("const", const=float(value))


def ref(name: str, shape: Sequence[int]) -> Expr:
    return Expr("ref", ref=name, shape=tuple(shape))


# ----------------------------------------------------------------------------- operators
# name -> (CUDA format over operand texts, torch function of the same formula). The CUDA
# helpers (sc_gelu, ...) are defined in templates/prelude.cu.j2 with the same formulas.

def _t():
    import torch

    return torch


def _gelu(x):
    t = _t()
    return 0.5 * x * (1.0 + t.erf(x * 0.7071067811865476))


def _gelu_tanh(x):
    t = _t()
    return 0.5 * x * (1.0 + t.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


OPS: dict[str, tuple[str, Callable[..., Any]]] = {
    "add": ("({0} + {1})", lambda a, b: a + b),
    "sub": ("({0} - {1})", lambda a, b: a - b),
    "mul": ("({0} * {1})", lambda a, b: a * b),
    "div": ("({0} / {1})", lambda a, b: a / b),
    "neg": ("(-{0})", lambda a: -a),
    "exp": ("expf({0})", lambda a: _t().exp(a)),
    "log": ("logf({0})", lambda a: _t().log(a)),
    "sqrt": ("sqrtf({0})", lambda a: _t().sqrt(a)),
    "rsqrt": ("rsqrtf({0})", lambda a: _t().rsqrt(a)),
    "abs": ("fabsf({0})", lambda a: _t().abs(a)),
    "erf": ("erff({0})", lambda a: _t().erf(a)),
    "tanh": ("tanhf({0})", lambda a: _t().tanh(a)),
    "reciprocal": ("(1.0f / {0})", lambda a: 1.0 / a),
    "sigmoid": ("sc_sigmoid({0})", lambda a: 1.0 / (1.0 + _t().exp(-a))),
    "silu": ("sc_silu({0})", lambda a: a / (1.0 + _t().exp(-a))),
    "relu": ("sc_relu({0})", lambda a: _t().where(a < 0, _t().zeros_like(a), a)),
    "gelu": ("sc_gelu({0})", _gelu),
    "gelu_tanh": ("sc_gelu_tanh({0})", _gelu_tanh),
    "square": ("sc_square({0})", lambda a: a * a),
    "pow": ("powf({0}, {1})", lambda a, b: _t().pow(a, b)),
    "max": ("fmaxf({0}, {1})", lambda a, b: _t().maximum(a, b)),
    "min": ("fminf({0}, {1})", lambda a, b: _t().minimum(a, b)),
    "leaky_relu": ("sc_leaky_relu({0}, {1})", lambda a, s: _t().where(a < 0, a * s, a)),
    "log1p": ("log1pf({0})", lambda a: _t().log1p(a)),
    "expm1": ("expm1f({0})", lambda a: _t().expm1(a)),
    "sin": ("sinf({0})", lambda a: _t().sin(a)),
    "cos": ("cosf({0})", lambda a: _t().cos(a)),
    "tan": ("tanf({0})", lambda a: _t().tan(a)),
    "asin": ("asinf({0})", lambda a: _t().asin(a)),
    "acos": ("acosf({0})", lambda a: _t().acos(a)),
    "atan": ("atanf({0})", lambda a: _t().atan(a)),
    "sinh": ("sinhf({0})", lambda a: _t().sinh(a)),
    "cosh": ("coshf({0})", lambda a: _t().cosh(a)),
    "asinh": ("asinhf({0})", lambda a: _t().asinh(a)),
    "acosh": ("acoshf({0})", lambda a: _t().acosh(a)),
    "atanh": ("atanhf({0})", lambda a: _t().atanh(a)),
    "log2": ("log2f({0})", lambda a: _t().log2(a)),
    "log10": ("log10f({0})", lambda a: _t().log10(a)),
    "atan2": ("atan2f({0}, {1})", lambda a, b: _t().atan2(a, b)),
    "floor": ("floorf({0})", lambda a: _t().floor(a)),
    "ceil": ("ceilf({0})", lambda a: _t().ceil(a)),
    "round": ("rintf({0})", lambda a: _t().round(a)),
    "sign": ("(({0} > 0.0f) - ({0} < 0.0f) + 0.0f)", lambda a: _t().sign(a)),
    "isnan": ("({0} != {0} ? 1.0f : 0.0f)", lambda a: _t().isnan(a).float()),
    # comparisons give masks: 1.0f / 0.0f
    "gt": ("({0} > {1} ? 1.0f : 0.0f)", lambda a, b: (a > b).float()),
    "ge": ("({0} >= {1} ? 1.0f : 0.0f)", lambda a, b: (a >= b).float()),
    "lt": ("({0} < {1} ? 1.0f : 0.0f)", lambda a, b: (a < b).float()),
    "le": ("({0} <= {1} ? 1.0f : 0.0f)", lambda a, b: (a <= b).float()),
    "eq": ("({0} == {1} ? 1.0f : 0.0f)", lambda a, b: (a == b).float()),
    "ne": ("({0} != {1} ? 1.0f : 0.0f)", lambda a, b: (a != b).float()),
    "and": ("(({0} != 0.0f && {1} != 0.0f) ? 1.0f : 0.0f)", lambda a, b: ((a != 0) & (b != 0)).float()),
    "or": ("(({0} != 0.0f || {1} != 0.0f) ? 1.0f : 0.0f)", lambda a, b: ((a != 0) | (b != 0)).float()),
    # masks: a bool (or integer) operand is read as 0.0f / 1.0f, so "true" is "!= 0"
    "not": ("({0} == 0.0f ? 1.0f : 0.0f)", lambda a: (a == 0).float()),
    "where": ("({0} != 0.0f ? {1} : {2})", lambda c, a, b: _t().where(c != 0, a, b)),
    # row programs only: the value at the row's column {1} (an int read), 0 elsewhere (summed over the
    # row it picks one element: gather from a row computed in registers), and the bounds check after it
    "pick": ("({1} == c ? {0} : 0.0f)", lambda v, k: _t().where(_t().arange(v.shape[-1]) == k, v, 0.0)),
    "index_ok": ("(({1} >= 0 && {1} < {2}) ? {0} : NAN)",
                 lambda v, k, b: _t().where((k >= 0) & (k < b), v, float("nan"))),
}


def op(name: str, *args: Expr) -> Expr:
    return Expr(name, args=tuple(args), shape=broadcast(*(a.shape for a in args)))


def c_float(value: float) -> str:
    if math.isnan(value):
        return "NAN"
    if math.isinf(value):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = repr(float(value))
    return f"{text}f" if ("e" in text or "." in text) else f"{text}.0f"


# ----------------------------------------------------------------------------- programs

StepKind = Literal["full", "scalar", "reduce"]


@dataclass
class Step:
    name: str
    kind: StepKind
    expr: Expr
    reduce: Literal["sum", "max"] | None = None


@dataclass
class Program:
    """The kernel body of one group over output shape ``shape``: ``row`` programs iterate rows of
    length ``shape[-1]``, ``pointwise`` programs single elements (only ``full`` steps)."""

    kind: Literal["pointwise", "row"]
    shape: tuple[int, ...]
    steps: list[Step] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)  # graph value -> step name
    output_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    write_offsets: dict[str, int] = field(default_factory=dict)  # graph value -> where in its buffer it starts
    # graph value -> (strides, offset): a pointwise output stored through strides (a slice of a buffer)
    write_strides: dict[str, tuple[tuple[int, ...], int]] = field(default_factory=dict)

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def leaves(self) -> list[Leaf]:
        return list(dict.fromkeys(x for s in self.steps for x in s.expr.leaves()))


# ----------------------------------------------------------------------------- views

IDENTITY = tagged("identity")
VIEWS = tagged("strided")  # the views an expression reads through


Operand = Callable[[Any], Expr]  # graph arg ('%name' or a number) -> Expr


def reshape_strides(shape: Sequence[int], strides: Sequence[int], out: Sequence[int]) -> list[int] | None:
    """Strides of ``out`` viewing the strided ``shape`` without a copy (torch's rule for
    ``view``), or None where the dimensions it merges are not laid out contiguously."""
    if not shape or not out or numel(shape) == 0:
        return list(contiguous_strides(out)) if numel(shape) == numel(out) else None
    new = [0] * len(out)
    view_d = len(out) - 1
    chunk_base = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk_base):
            while view_d >= 0 and (view_numel < tensor_numel or out[view_d] == 1):
                new[view_d] = view_numel * chunk_base
                view_numel *= out[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base = strides[d - 1]
                tensor_numel = view_numel = 1
    return new if view_d == -1 else None


def permutation(node: Any, rank: int) -> list[int] | None:
    """The dims a permute or transpose node of a rank-``rank`` value puts in each place, else None."""
    if node.op == "aten.permute" and len(node.args) > 1 and isinstance(node.args[1], list):
        order = [int(d) % rank for d in node.args[1]]
    elif node.op == "aten.transpose" and len(node.args) > 2:
        a, b = int(node.args[1]) % rank, int(node.args[2]) % rank
        order = list(range(rank))
        order[a], order[b] = order[b], order[a]
    else:
        return None
    return order if sorted(order) == list(range(rank)) else None


def view_expr(node: Any, x: Expr) -> Expr:
    """A view node applied to a buffer read: the same buffer through new shape and strides."""
    where = f"{node.name} ({node.op}.{node.overload})"
    out = tuple(node.out[0].shape)
    if x.op != "leaf":
        raise Unsupported(f"{where}: a view of a computed value inside a fused group")
    lf: Leaf = x.leaf  # type: ignore[assignment]
    if lf.gathers and lf.guard is None and not lf.window:
        return _view_of_gather(node, lf)
    if not lf.plain:
        raise Unsupported(f"{where}: a view of a gathered or concatenated value inside a fused group")
    shape, strides = list(lf.shape), list(lf.strides)
    name, a = node.op, node.args
    if name in ("aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten"):
        if lf.contiguous:
            return leaf(lf.value, out)
        new = reshape_strides(shape, strides, out)
        if new is None:
            raise Unsupported(f"{where}: reshape of a non-contiguous view (it would need a copy)")
        return leaf(lf.value, out, new, lf.offset)
    if name in ("aten.unsqueeze", "aten.squeeze"):
        if lf.contiguous:
            return leaf(lf.value, out)
        kept = [(d, s) for d, s in zip(shape, strides, strict=True) if d != 1]
        new_strides, it = [], iter(kept)
        for d in out:
            new_strides.append(next(it)[1] if d != 1 else 0)
        return leaf(lf.value, out, new_strides, lf.offset)
    if name in ("aten.transpose", "aten.t"):
        i, j = (a[1], a[2]) if name == "aten.transpose" else (0, 1)
        i, j = i % len(shape), j % len(shape)
        shape[i], shape[j] = shape[j], shape[i]
        strides[i], strides[j] = strides[j], strides[i]
        return leaf(lf.value, shape, strides, lf.offset)
    if name == "aten.permute":
        dims = [d % len(shape) for d in a[1]]
        return leaf(lf.value, [shape[d] for d in dims], [strides[d] for d in dims], lf.offset)
    if name == "aten.expand":
        pad = len(out) - len(shape)
        eff = [0] * pad + [0 if d == 1 and o != 1 else s for d, s, o in zip(shape, strides, out[pad:], strict=True)]
        return leaf(lf.value, out, eff, lf.offset)
    if name == "aten.unfold" and shape:  # Tensor.unfold: windows along a dim, each a new last dim
        dim, step = a[1] % len(shape), a[3]
        return leaf(lf.value, out, strides[:dim] + [strides[dim] * step] + strides[dim + 1:] + [strides[dim]],
                    lf.offset)
    if name == "stitchcuda.buffer_view":  # strides over the value's elements in row-major order
        if not lf.plain or list(lf.strides) != list(contiguous_strides(lf.shape)):
            raise Unsupported(f"{where}: a buffer view of a strided view")
        return leaf(lf.value, out, [int(s) for s in a[2]], lf.offset + int(a[3]))  # where it starts in its buffer
    if name in ("aten.slice", "aten.select"):
        dim = (a[1] if len(a) > 1 else 0) % len(shape)
        if name == "aten.select":
            index = a[2] % shape[dim]
            return leaf(lf.value, shape[:dim] + shape[dim + 1:], strides[:dim] + strides[dim + 1:],
                        lf.offset + index * strides[dim])
        start = a[2] if len(a) > 2 and a[2] is not None else 0
        step = a[4] if len(a) > 4 else 1
        start = max(0, min(start + shape[dim] if start < 0 else start, shape[dim]))
        shape[dim] = out[dim]
        offset = lf.offset + start * strides[dim]
        strides[dim] *= step
        return leaf(lf.value, shape, strides, offset)
    raise Unsupported(f"{where} is not a supported view")


def _view_of_gather(node: Any, lf: Leaf) -> Expr:
    """A view of a gathered read (a relative position bias: ``table[index].view(N, N, H).permute(2,
    0, 1)``): the same view of the read with its gathered dims at stride 0, and of each index read
    spread over the read's shape, so every element still adds ``index * stride`` from its own
    coordinates."""
    plain = view_expr(node, leaf(lf.value, lf.shape, lf.strides, lf.offset)).leaf
    gathers = []
    for g in lf.gathers:
        spread = leaf(g.index.value, lf.shape, g.index.effective_strides(lf.shape), g.index.offset)
        gathers.append(replace(g, index=view_expr(node, spread).leaf))
    return Expr("leaf", leaf=replace(plain, gathers=tuple(gathers)), shape=plain.shape)  # type: ignore[arg-type]
