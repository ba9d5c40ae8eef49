"""ATen operators as formulas of the kernel IR (expr.py): pointwise operators, activations with
parameters, eval-mode batch norm, and the steps of a row reduction or normalisation.

``pointwise_expr`` turns one pointwise node into an :class:`~stitchcuda.compiler.ir.expr.Expr` over
its operands; ``row_steps`` turns one row operator (softmax, log_softmax, layer_norm, rms_norm,
mean / sum / amax over the last dim) into the ``full`` / ``reduce`` / ``scalar`` steps of a row
program. Anything these do not know raises :class:`~stitchcuda.compiler.ir.expr.Unsupported`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stitchcuda.compiler.ir.expr import (
    IDENTITY,
    Expr,
    Leaf,
    Operand,
    Step,
    Unsupported,
    const,
    leaf,
    op,
    ref,
)
from stitchcuda.compiler.ir.op_table import tagged

POINTWISE_UNARY = {
    "aten.neg": "neg", "aten.exp": "exp", "aten.log": "log", "aten.sqrt": "sqrt", "aten.rsqrt": "rsqrt",
    "aten.abs": "abs", "aten.erf": "erf", "aten.tanh": "tanh", "aten.reciprocal": "reciprocal",
    "aten.sigmoid": "sigmoid", "aten.silu": "silu", "aten.relu": "relu", "aten.square": "square",
    "aten.log1p": "log1p", "aten.expm1": "expm1", "aten.sin": "sin", "aten.cos": "cos", "aten.floor": "floor",
    "aten.ceil": "ceil", "aten.round": "round", "aten.sign": "sign", "aten.isnan": "isnan",
    "aten.tan": "tan", "aten.asin": "asin", "aten.acos": "acos", "aten.atan": "atan", "aten.sinh": "sinh",
    "aten.cosh": "cosh", "aten.asinh": "asinh", "aten.acosh": "acosh", "aten.atanh": "atanh",
    "aten.log2": "log2", "aten.log10": "log10",
}
COMPARISONS = {"aten.gt": "gt", "aten.ge": "ge", "aten.lt": "lt", "aten.le": "le", "aten.eq": "eq", "aten.ne": "ne",
               "aten.logical_and": "and", "aten.logical_or": "or", "aten.bitwise_and": "and",
               "aten.bitwise_or": "or"}
# activations with parameters, as compositions of the operators above
ACTIVATIONS = {"aten.elu", "aten.selu", "aten.celu", "aten.softplus", "aten.mish", "aten.hardswish",
               "aten.hardsigmoid", "aten.logsigmoid"}
MASK_OPS = {"aten.bitwise_not", "aten.logical_not", "aten.masked_fill", "aten.where"}
"""Operators that may read a bool operand (a mask); nothing else reads a non-float32 value."""
ROW_OPS = tagged("row")  # what the fused row kernel computes


def is_pointwise(op_name: str) -> bool:
    return op_name in POINTWISE_UNARY or op_name in IDENTITY or op_name in {
        "aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.div", "aten.gelu", "aten.pow", "aten.maximum",
        "aten.minimum", "aten.clamp", "aten.clamp_min", "aten.clamp_max", "aten.hardtanh", "aten.leaky_relu",
        "aten.dropout", "aten.batch_norm", "aten.scalar_tensor", "aten.atan2"} or op_name in MASK_OPS or op_name in COMPARISONS \
        or op_name in ACTIVATIONS


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
    if name == "aten.scalar_tensor":  # core ATen's masked_fill value: where(mask, scalar_tensor(v), x)
        return const(_scalar(a[0], where))
    if name == "aten.dropout":
        if len(a) > 2 and a[2]:
            raise Unsupported(f"{where}: dropout in training mode")
        return arg(a[0])
    if name in POINTWISE_UNARY:
        return op(POINTWISE_UNARY[name], arg(a[0]))
    if name in COMPARISONS:
        return op(COMPARISONS[name], arg(a[0]), arg(a[1]))
    if name == "aten.atan2":
        return op("atan2", arg(a[0]), arg(a[1]))
    if name in ACTIVATIONS:
        return _activation(name, a, kw, arg, where)
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
    if name == "aten.batch_norm":
        return _batch_norm(node, arg, where)
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


def _softplus(x: Expr, beta: float, threshold: float) -> Expr:
    bx = op("mul", x, const(beta)) if beta != 1.0 else x
    soft = op("log1p", op("exp", bx))
    soft = op("div", soft, const(beta)) if beta != 1.0 else soft
    return op("where", op("gt", bx, const(threshold)), x, soft)


def _activation(name: str, a: list, kw: dict, arg: Operand, where: str) -> Expr:
    """PyTorch's formulas of the parametrised activations (thresholds and constants as its kernels)."""
    x = arg(a[0])

    def param(i: int, key: str, default: float) -> float:
        return _scalar(kw.get(key, a[i] if len(a) > i else default), where)

    def elu(alpha: float, scale: float, input_scale: float) -> Expr:
        neg = op("mul", const(alpha * scale), op("expm1", op("mul", x, const(input_scale))))
        return op("where", op("gt", x, const(0.0)), op("mul", x, const(scale)), neg)

    if name == "aten.elu":
        return elu(param(1, "alpha", 1.0), param(2, "scale", 1.0), param(3, "input_scale", 1.0))
    if name == "aten.selu":
        return elu(1.6732632423543772848170429916717, 1.0507009873554804934193349852946, 1.0)
    if name == "aten.celu":
        alpha = param(1, "alpha", 1.0)
        return elu(alpha, 1.0, 1.0 / alpha)
    if name == "aten.softplus":
        return _softplus(x, param(1, "beta", 1.0), param(2, "threshold", 20.0))
    if name == "aten.mish":
        return op("mul", x, op("tanh", _softplus(x, 1.0, 20.0)))
    if name == "aten.logsigmoid":
        return op("neg", _softplus(op("neg", x), 1.0, 20.0))
    relu6 = op("min", op("max", op("add", x, const(3.0)), const(0.0)), const(6.0))
    if name == "aten.hardswish":
        return op("div", op("mul", x, relu6), const(6.0))
    return op("div", relu6, const(6.0))  # hardsigmoid


def _batch_norm(node: Any, arg: Operand, where: str) -> Expr:
    """Eval-mode batch norm, a per-channel affine of its running statistics:
    (x - mean) * rsqrt(var + eps) * weight + bias, the channel on dim 1."""
    a = node.args
    if len(a) < 8 or a[5]:
        raise Unsupported(f"{where}: batch norm in training mode (batch statistics)")
    x = arg(a[0])
    rank = len(x.shape)
    if rank < 2:
        raise Unsupported(f"{where}: batch norm of a {rank}-d value")

    def channel(value: Any, what: str) -> Expr | None:
        if value is None:
            return None
        e = arg(value)
        if e.op != "leaf" or len(e.shape) != 1 or not e.leaf.plain:  # type: ignore[union-attr]
            raise Unsupported(f"{where}: {what} is not a per-channel parameter or buffer")
        lf: Leaf = e.leaf  # type: ignore[assignment]
        trail = rank - 2
        return leaf(lf.value, (e.shape[0],) + (1,) * trail, (lf.strides[0],) + (0,) * trail, lf.offset)

    weight, bias = channel(a[1], "weight"), channel(a[2], "bias")
    mean, var = channel(a[3], "running_mean"), channel(a[4], "running_var")
    if mean is None or var is None:
        raise Unsupported(f"{where}: batch norm without running statistics")
    y = op("mul", op("sub", x, mean), op("rsqrt", op("add", var, const(_scalar(a[7], where)))))
    if weight is not None:
        y = op("mul", y, weight)
    return op("add", y, bias) if bias is not None else y


def pick_steps(node: Any, table: Expr, index: Expr, full_shape: tuple[int, ...]) -> list[Step]:
    """``aten.gather`` along the row from a row computed in the program (a ``ref``), by one int index
    per row: a sum over the row of the value at the index's column (0 elsewhere), then NaN where the
    index lies outside the row. The last step names the node's value."""
    where = f"{node.name} ({node.op}.{node.overload})"
    lf = index.leaf if index.op == "leaf" else None
    row_scalar = tuple(full_shape[:-1]) + (1,)
    if node.op != "aten.gather" or node.args[1] % len(full_shape) != len(full_shape) - 1 or \
            tuple(table.shape) != full_shape or lf is None or not lf.plain or tuple(lf.shape) != row_scalar:
        raise Unsupported(f"{where}: only a gather of one element per row, along the row, from a computed row")
    p = node.name
    return [Step(f"{p}__pick", "reduce", op("pick", table, index), "sum"),
            Step(p, "scalar", op("index_ok", ref(f"{p}__pick", row_scalar), index, const(full_shape[-1])))]


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
    if name in ("aten.softmax", "aten._softmax", "aten._safe_softmax", "aten.log_softmax", "aten._log_softmax"):
        _last_dim(a[1], rank, where)
        m = ref(f"{p}__max", row_scalar)
        e = op("exp", op("sub", x, m))
        s = ref(f"{p}__sum", row_scalar)
        steps = [Step(f"{p}__max", "reduce", x, "max")]
        if "log" in name:
            steps += [Step(f"{p}__sum", "reduce", e, "sum"),
                      Step(p, "full", op("sub", op("sub", x, m), op("log", s)))]
        else:
            y = op("div", ref(f"{p}__exp", full_shape), s)
            if name == "aten._safe_softmax":  # a row of -inf only (a fully masked query) is 0, not NaN
                y = op("where", op("eq", m, const(float("-inf"))), const(0.0), y)
            steps += [Step(f"{p}__exp", "full", e), Step(f"{p}__sum", "reduce", ref(f"{p}__exp", full_shape), "sum"),
                      Step(p, "full", y)]
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
