"""Note: the offline Coder's kernel IR.

A fusion group becomes a :class:`Program`: an ordered list of SSA :class:`Step` records, each
naming one value. A step is

- ``full``: one value per element of the group's iteration space (a whole row in a row
  kernel, one element in a pointwise kernel), computed from an :class:`Expr`;
- ``scalar``: one value per row (row kernels only), computed from row scalars and constants;
- ``reduce``: a row scalar, the sum or max over the row of a full expression.

Expressions are trees over :class:`Leaf` reads (a buffer read through a shape and element
strides, so views, transposes and broadcasts are index arithmetic, not copies), references to
earlier steps, and constants. One table (:data:`OPS`) gives every operator both its CUDA text
and a torch function computing the same formula, so :func:`evaluate` runs a program on the CPU
exactly as the generated kernel would (in the same order, with the same reduction structure):
that is how the tests check the expression builder without a GPU.

``build_step`` lowers one ATen node (``aten.gelu``, ``aten.softmax.int``, ...) into steps;
anything it does not know raises :class:`Unsupported` naming the operator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal


class Unsupported(ValueError):
    """The offline Coder cannot generate this (the message says which operator or shape, and why)."""


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
class Leaf:
    """A read of graph value ``value``'s buffer through ``shape`` and element ``strides``."""

    value: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0  # elements from the buffer's start (slices, selects)

    @property
    def contiguous(self) -> bool:
        return self.offset == 0 and self.strides == contiguous_strides(self.shape)

    def effective_strides(self, out: Sequence[int]) -> tuple[int, ...]:
        """Element strides of this read over the output shape ``out`` (0 where it broadcasts)."""
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
    # masks: a bool (or integer) operand is read as 0.0f / 1.0f, so "true" is "!= 0"
    "not": ("({0} == 0.0f ? 1.0f : 0.0f)", lambda a: (a == 0).float()),
    "where": ("({0} != 0.0f ? {1} : {2})", lambda c, a, b: _t().where(c != 0, a, b)),
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

    def step(self, name: str) -> Step:
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(name)

    def leaves(self) -> list[Leaf]:
        return list(dict.fromkeys(x for s in self.steps for x in s.expr.leaves()))


# ----------------------------------------------------------------------------- lowering nodes

POINTWISE_UNARY = {
    "aten.neg": "neg", "aten.exp": "exp", "aten.log": "log", "aten.sqrt": "sqrt", "aten.rsqrt": "rsqrt",
    "aten.abs": "abs", "aten.erf": "erf", "aten.tanh": "tanh", "aten.reciprocal": "reciprocal",
    "aten.sigmoid": "sigmoid", "aten.silu": "silu", "aten.relu": "relu", "aten.square": "square",
}
IDENTITY = {"aten.clone", "aten.alias", "aten.detach", "aten.contiguous", "aten.lift_fresh_copy"}
VIEWS = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.unsqueeze", "aten.squeeze",
         "aten.transpose", "aten.permute", "aten.t", "aten.expand", "aten.select", "aten.slice"}
MASK_OPS = {"aten.bitwise_not", "aten.logical_not", "aten.masked_fill", "aten.where"}
"""Operators that may read a bool operand (a mask); nothing else reads a non-float32 value."""
ROW_OPS = {"aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax", "aten.layer_norm",
           "aten.mean", "aten.sum", "aten.amax", "aten.rms_norm"}


def is_pointwise(op_name: str) -> bool:
    return op_name in POINTWISE_UNARY or op_name in IDENTITY or op_name in {
        "aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.div", "aten.gelu", "aten.pow", "aten.maximum",
        "aten.minimum", "aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh", "aten.leaky_relu",
        "aten.dropout"} or op_name in MASK_OPS


Operand = Callable[[Any], Expr]  # graph arg ('%name' or a number) -> Expr


def _scalar(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Unsupported(f"{what}: expected a number, got {value!r}")
    return float(value)


def pointwise_expr(node: Any, arg: Operand) -> Expr:
    """The expression of one pointwise ATen node, its operands resolved by ``arg``."""
    name, a, kw = node.op, node.args, node.kwargs
    where = f"{node.name} ({name}.{node.overload})"
    if name in IDENTITY:
        return arg(a[0])
    if name == "aten.dropout":
        if len(a) > 2 and a[2]:
            raise Unsupported(f"{where}: dropout in training mode")
        return arg(a[0])
    if name in POINTWISE_UNARY:
        return op(POINTWISE_UNARY[name], arg(a[0]))
    if name in ("aten.add", "aten.sub", "aten.rsub"):
        alpha = kw.get("alpha", a[2] if len(a) > 2 else 1)
        x, y = arg(a[0]), arg(a[1])
        if name == "aten.rsub":
            x, y = y, x
        if _scalar(alpha, where) != 1.0:
            y = op("mul", y, const(alpha))
        return op("add" if name == "aten.add" else "sub", x, y)
    if name in ("aten.mul", "aten.div"):
        if name == "aten.div" and kw.get("rounding_mode", a[2] if len(a) > 2 else None) is not None:
            raise Unsupported(f"{where}: division with a rounding mode")
        return op(name[5:], arg(a[0]), arg(a[1]))
    if name == "aten.gelu":
        approx = kw.get("approximate", a[1] if len(a) > 1 else "none")
        return op("gelu_tanh" if approx == "tanh" else "gelu", arg(a[0]))
    if name == "aten.pow":
        if node.overload == "Tensor_Scalar":
            e = _scalar(a[1], where)
            if e == 2.0:
                return op("square", arg(a[0]))
            if e == 1.0:
                return arg(a[0])
            if e == 0.5:
                return op("sqrt", arg(a[0]))
            return op("pow", arg(a[0]), const(e))
        return op("pow", arg(a[0]), arg(a[1]))
    if name in ("aten.maximum", "aten.minimum"):
        return op("max" if name == "aten.maximum" else "min", arg(a[0]), arg(a[1]))
    if name in ("aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh"):
        x = arg(a[0])
        if name == "aten.hardtanh":
            lo, hi = (a[1] if len(a) > 1 else -1.0), (a[2] if len(a) > 2 else 1.0)
        elif name == "aten.clamp":
            lo, hi = kw.get("min", a[1] if len(a) > 1 else None), kw.get("max", a[2] if len(a) > 2 else None)
        else:
            lo, hi = (a[1], None) if name == "aten.clamp_min" else (None, a[1])
        if lo is not None:
            x = op("max", x, const(_scalar(lo, where)))
        if hi is not None:
            x = op("min", x, const(_scalar(hi, where)))
        return x
    if name == "aten.leaky_relu":
        return op("leaky_relu", arg(a[0]), const(_scalar(a[1] if len(a) > 1 else 0.01, where)))
    if name in ("aten.bitwise_not", "aten.logical_not"):
        if name == "aten.bitwise_not" and node.out[0].dtype != "bool":
            raise Unsupported(f"{where}: bitwise not of a {node.out[0].dtype} value (only of a bool mask)")
        return op("not", arg(a[0]))
    if name == "aten.masked_fill":
        value = arg(a[2]) if node.overload == "Tensor" else const(_scalar(a[2], where))
        return op("where", arg(a[1]), value, arg(a[0]))
    if name == "aten.where":
        if len(a) != 3:
            raise Unsupported(f"{where}: where with {len(a)} arguments")
        return op("where", arg(a[0]), arg(a[1]), arg(a[2]))
    raise Unsupported(f"{where} is not a supported elementwise operator")


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


def view_expr(node: Any, x: Expr) -> Expr:
    """A view node applied to a buffer read: the same buffer through new shape and strides."""
    where = f"{node.name} ({node.op}.{node.overload})"
    out = tuple(node.out[0].shape)
    if x.op != "leaf":
        raise Unsupported(f"{where}: a view of a computed value inside a fused group")
    lf: Leaf = x.leaf  # type: ignore[assignment]
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


def _last_dim(dims: Any, rank: int, where: str) -> None:
    dims = dims if isinstance(dims, list) else [dims]
    if len(dims) != 1 or int(dims[0]) % rank != rank - 1:
        raise Unsupported(f"{where}: only a reduction over the last dimension is supported (dims {dims})")


def row_steps(node: Any, arg: Operand, full_shape: tuple[int, ...]) -> list[Step]:
    """The steps of one row operator (softmax, layer_norm, mean, ...) over rows of ``full_shape``;
    the last step names the node's value."""
    name, a, kw = node.op, node.args, node.kwargs
    where = f"{node.name} ({name}.{node.overload})"
    x = arg(a[0])
    rank, n = len(full_shape), full_shape[-1]
    if tuple(x.shape) != full_shape:
        raise Unsupported(f"{where}: input of shape {list(x.shape)} is not the group's row shape {list(full_shape)}")
    p = node.name
    row_scalar = tuple(full_shape[:-1]) + (1,)
    if name in ("aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax"):
        _last_dim(a[1], rank, where)
        m = ref(f"{p}__max", row_scalar)
        e = op("exp", op("sub", x, m))
        s = ref(f"{p}__sum", row_scalar)
        steps = [Step(f"{p}__max", "reduce", x, "max")]
        if "log" in name:
            steps += [Step(f"{p}__sum", "reduce", e, "sum"),
                      Step(p, "full", op("sub", op("sub", x, m), op("log", s)))]
        else:
            steps += [Step(f"{p}__exp", "full", e), Step(f"{p}__sum", "reduce", ref(f"{p}__exp", full_shape), "sum"),
                      Step(p, "full", op("div", ref(f"{p}__exp", full_shape), s))]
        return steps
    if name == "aten.layer_norm":
        if list(a[1]) != [n]:
            raise Unsupported(f"{where}: layer_norm over {a[1]}, only over the last dimension [{n}]")
        w = arg(a[2]) if len(a) > 2 and a[2] is not None else None
        b = arg(a[3]) if len(a) > 3 and a[3] is not None else None
        eps = _scalar(a[4], where) if len(a) > 4 else 1e-5
        mu, d, rstd = ref(f"{p}__mean", row_scalar), ref(f"{p}__centred", full_shape), ref(f"{p}__rstd", row_scalar)
        y = op("mul", d, rstd)
        if w is not None:
            y = op("mul", y, w)
        if b is not None:
            y = op("add", y, b)
        return [Step(f"{p}__sum", "reduce", x, "sum"),
                Step(f"{p}__mean", "scalar", op("div", ref(f"{p}__sum", row_scalar), const(n))),
                Step(f"{p}__centred", "full", op("sub", x, mu)),
                Step(f"{p}__sq", "reduce", op("square", d), "sum"),
                Step(f"{p}__rstd", "scalar", op("rsqrt", op("add", op("div", ref(f"{p}__sq", row_scalar), const(n)),
                                                              const(eps)))),
                Step(p, "full", y)]
    if name == "aten.rms_norm":
        if list(a[1]) != [n]:
            raise Unsupported(f"{where}: rms_norm over {a[1]}, only over the last dimension [{n}]")
        w = arg(a[2]) if len(a) > 2 and a[2] is not None else None
        eps = _scalar(a[3], where) if len(a) > 3 and a[3] is not None else 1.1920928955078125e-07
        y = op("mul", x, ref(f"{p}__rstd", row_scalar))
        return [Step(f"{p}__sq", "reduce", op("square", x), "sum"),
                Step(f"{p}__rstd", "scalar", op("rsqrt", op("add", op("div", ref(f"{p}__sq", row_scalar), const(n)),
                                                              const(eps)))),
                Step(p, "full", op("mul", y, w) if w is not None else y)]
    if name in ("aten.mean", "aten.sum", "aten.amax"):
        if kw.get("dtype") not in (None, "torch.float32"):
            raise Unsupported(f"{where}: reduction with dtype {kw.get('dtype')}")
        _last_dim(a[1] if len(a) > 1 else list(range(rank)), rank, where)
        if name == "aten.mean":
            return [Step(f"{p}__sum", "reduce", x, "sum"),
                    Step(p, "scalar", op("div", ref(f"{p}__sum", row_scalar), const(n)))]
        return [Step(p, "reduce", x, "sum" if name == "aten.sum" else "max")]
    raise Unsupported(f"{where} is not a supported row operator")


def row_scalar_leaf(lf: Leaf, shape: Sequence[int]) -> bool:
    """In a row program over ``shape``: whether the read is one value per row (it broadcasts
    along the row: a keepdim statistic, a 0-d tensor)."""
    return len(shape) > 0 and shape[-1] > 1 and (not lf.shape or lf.shape[-1] == 1)


# ----------------------------------------------------------------------------- CPU evaluation

def evaluate(program: Program, buffers: dict[str, Any]) -> dict[str, Any]:
    """Run ``program`` with torch on the CPU, structured like the generated kernel: row programs
    as [rows, n] (full) and [rows, 1] (scalar) tensors with reductions over dim 1. ``buffers``
    maps graph values to tensors; returns graph value -> tensor for the program's outputs."""
    import torch

    shape = program.shape
    n = shape[-1] if shape else 1
    rows = numel(shape) // max(n, 1)
    env: dict[str, Any] = {}

    def read(lf: Leaf) -> Any:
        base = buffers[lf.value].contiguous().reshape(-1).float()
        view = torch.as_strided(base, lf.shape, lf.strides, lf.offset)
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
        out[value_name] = env[st_name].expand(target if program.kind == "pointwise" else env[st_name].shape) \
            .reshape(target).contiguous()
    return out
