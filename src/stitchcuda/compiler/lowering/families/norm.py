"""Normalisations and softmax: batch norm (training and eval), group, layer and instance norm, softmax
and log_softmax, over any rank, any dims and any length.

Each lowering here reads its operator's arguments and regroups the input's dims into kept ones
(they pick a group: batch norm's channel, layer norm's leading dims, every dim but softmax's) and
reduced ones (a group's elements), with every operand's strides: a :class:`~.norm_kernels.Plan`.
norm_kernels.py turns a plan into a statistics kernel and an elementwise apply kernel.
"""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported, reshape_strides
from stitchcuda.compiler.lowering.families.norm_kernels import (
    Kind,
    Layout,
    Plan,
    emit,
    literal,
    prod,
    row_major,
)
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided
from stitchcuda.compiler.lowering.registry import lowering

# ----------------------------------------------------------------------------- plans per operator

def _where(node: Node) -> str:
    return f"{node.name} ({node.op})"


def _arg(node: Node, i: int, key: str, default: Any = None) -> Any:
    return node.args[i] if len(node.args) > i else node.kwargs.get(key, default)


def _float_input(ctx: FamilyContext, node: Node, arg: Any) -> Strided:
    x = ctx.read(arg)
    if x.ctype != "float":
        raise Unsupported(f"{_where(node)}: input of C type {x.ctype}; only float32 is supported")
    if x.numel == 0:
        raise Unsupported(f"{_where(node)}: empty input")
    return x


def _optional(ctx: FamilyContext, node: Node, arg: Any, size: int, what: str) -> Strided | None:
    """A per-channel (or per-position) parameter tensor, or None."""
    if arg is None:
        return None
    t = _float_input(ctx, node, arg)
    if t.numel != size:
        raise Unsupported(f"{_where(node)}: {what} has {t.numel} elements, expected {size}")
    return t


def _flat_strides(t: Strided, shape: list[int]) -> list[int]:
    """Strides of ``t`` read as ``shape`` (same element count), where that is a view."""
    st = reshape_strides(list(t.shape), list(t.strides), shape)
    if st is None:
        raise Unsupported(f"a parameter of shape {list(t.shape)} cannot be read as {shape}")
    return st


def _plan(ctx: FamilyContext, node: Node, kind: Kind, x: Strided, sizes: list[int], red: list[bool],
          x_strides: list[int], eps: float, params: dict[str, tuple[Strided, list[int]]], out: str | None) -> Plan:
    """A plan over dims ``sizes`` (a regrouping of x's shape: same row-major order)."""
    lay = Layout(list(sizes), list(red), {"x": list(x_strides), "o": row_major(sizes, [True] * len(sizes)),
                                           "g": row_major(sizes, [not r for r in red])})
    for k, (_, st) in params.items():
        lay.strides[k] = list(st)
    plan = Plan(node, kind, x, lay.merged(), eps, {k: t for k, (t, _) in params.items()})
    if not plan.layout.sizes:  # one element: keep one dim so that the generators have something to index
        plan.layout = Layout([1], [True], {k: [0] for k in lay.strides})
    if out is not None:
        meta_numel = prod(sizes)
        plan.out = ctx.write(out)
        if plan.out.numel != meta_numel:
            raise Unsupported(f"{_where(node)}: output of {plan.out.numel} elements, expected {meta_numel}")
    return plan


def _stat_output(ctx: FamilyContext, p: Plan, value: str | None, param: str, expr: str) -> None:
    """Write per-group ``expr`` into output ``value`` (numbered like the groups) when it is read."""
    if value is None:
        return
    buf = ctx.write(value)
    if buf.numel == 0:
        return
    if buf.numel != p.groups:
        raise Unsupported(f"{_where(p.node)}: statistics output {value} has {buf.numel} elements, "
                          f"expected {p.groups}")
    p.finish_args.append((f"float* __restrict__ {param}", buf.ptr))
    p.finish.append(f"{param}[g] = {expr};")


def _channel_norm(ctx: FamilyContext, node: Node, x: Strided, w: Any, b: Any, rm: Any, rv: Any,
                  training: bool, momentum: float, eps: float) -> KernelCall:
    """Batch norm over dim 1 (statistics over every other dim), training or with running stats."""
    where = _where(node)
    if len(x.shape) < 2:
        raise Unsupported(f"{where}: batch norm of a rank-{len(x.shape)} input")
    sizes = list(x.shape)
    c = sizes[1]
    chan = [d == 1 for d in range(len(sizes))]
    params: dict[str, tuple[Strided, list[int]]] = {}
    for key, arg, what in (("w", w, "weight"), ("b", b, "bias"), ("rm", rm, "running_mean"),
                           ("rv", rv, "running_var")):
        t = _optional(ctx, node, arg, c, what)
        if t is not None and (key in ("w", "b") or not training):
            params[key] = (t, [_flat_strides(t, [c])[0] if d == 1 else 0 for d in range(len(sizes))])
    if not training and ("rm" not in params or "rv" not in params):
        raise Unsupported(f"{where}: evaluation-mode batch norm without running statistics")
    outs = ctx.outputs(node)
    if not training and any(o is not None and ctx.write(o).numel for o in outs[1:]):
        raise Unsupported(f"{where}: statistics outputs of evaluation-mode batch norm are read")
    kind: Kind = "moments" if training else "running"
    p = _plan(ctx, node, kind, x, sizes, [not k for k in chan], list(x.strides), eps, params, outs[0])
    if training:
        n = prod(sizes) // c
        _stat_output(ctx, p, outs[1] if len(outs) > 1 else None, "o_mean", "(float)mean")
        _stat_output(ctx, p, outs[2] if len(outs) > 2 else None, "o_rstd", "rstd")
        for i, key, stat in ((3, "rm", "mean"), (4, "rv", f"var * {float(n)!r} / {float(max(n - 1, 0))!r}")):
            if len(outs) > i and outs[i] is not None:
                run = _optional(ctx, node, rm if key == "rm" else rv, c, key)
                assert run is not None
                st = _flat_strides(run, [c])[0]
                p.finish_args.append((f"const float* __restrict__ i_{key}", run.ptr))
                _stat_output(ctx, p, outs[i], f"o_{key}", f"(float)((1.0 - {literal(momentum)}) * (double)__ldg(i_{key} + "
                             f"{run.offset}LL + g * {st}LL) + {literal(momentum)} * ({stat}))")
    return emit(ctx, p, f"batch_norm ({'training' if training else 'running stats'}) over {list(x.shape)}")


@lowering("aten._native_batch_norm_legit_functional")
def batch_norm_functional(ctx: FamilyContext, node: Node) -> KernelCall:
    x = _float_input(ctx, node, node.args[0])
    a = node.args
    return _channel_norm(ctx, node, x, a[1], a[2], a[3], a[4], bool(a[5]), float(a[6]), float(a[7]))


@lowering("aten._native_batch_norm_legit_no_training")
def batch_norm_no_training(ctx: FamilyContext, node: Node) -> KernelCall:
    x = _float_input(ctx, node, node.args[0])
    a = node.args
    return _channel_norm(ctx, node, x, a[1], a[2], a[3], a[4], False, float(a[5]), float(a[6]))


@lowering("aten._native_batch_norm_legit", "aten.native_batch_norm")
def batch_norm_legit(ctx: FamilyContext, node: Node) -> KernelCall:
    """With running stats (training mutates them in place, which a functional graph never holds:
    export turns that into the _functional form, so here the outputs alone are computed) or without."""
    x = _float_input(ctx, node, node.args[0])
    a = node.args
    if node.overload.startswith("no_stats"):
        rm = rv = None
        training, momentum, eps = bool(a[3]), float(a[4]), float(a[5])
    else:
        rm, rv = a[3], a[4]
        training, momentum, eps = bool(a[5]), float(a[6]), float(a[7])
    return _channel_norm(ctx, node, x, a[1], a[2], rm, rv, training, momentum, eps)


def _group_norm(ctx: FamilyContext, node: Node, x: Strided, groups: int, w: Any, b: Any, eps: float) -> KernelCall:
    where = _where(node)
    shape = list(x.shape)
    if len(shape) < 2 or groups <= 0 or shape[1] % groups:
        raise Unsupported(f"{where}: {groups} groups for input {shape}")
    n, c = shape[0], shape[1]
    cg = c // groups
    sizes = [n, groups, cg, *shape[2:]]
    red = [False, False, *([True] * (len(shape) - 1))]
    xs = [x.strides[0], x.strides[1] * cg, x.strides[1], *x.strides[2:]]
    params = {}
    for key, arg, what in (("w", w, "weight"), ("b", b, "bias")):
        t = _optional(ctx, node, arg, c, what)
        if t is not None:
            s = _flat_strides(t, [c])[0]
            params[key] = (t, [0, s * cg, s, *([0] * (len(shape) - 2))])
    outs = ctx.outputs(node)
    p = _plan(ctx, node, "moments", x, sizes, red, xs, eps, params, outs[0])
    _stat_output(ctx, p, outs[1] if len(outs) > 1 else None, "o_mean", "(float)mean")
    _stat_output(ctx, p, outs[2] if len(outs) > 2 else None, "o_rstd", "rstd")
    return emit(ctx, p, f"group_norm ({groups} groups) over {shape}")


@lowering("aten.native_group_norm")
def native_group_norm(ctx: FamilyContext, node: Node) -> KernelCall:
    x = _float_input(ctx, node, node.args[0])
    a = node.args
    if len(x.shape) < 2 or x.shape[0] != int(a[3]) or x.shape[1] != int(a[4]):
        raise Unsupported(f"{_where(node)}: input {list(x.shape)} is not (N={a[3]}, C={a[4]}, ...)")
    return _group_norm(ctx, node, x, int(a[6]), a[1], a[2], float(a[7]))


@lowering("aten.group_norm")
def group_norm(ctx: FamilyContext, node: Node) -> KernelCall:
    x = _float_input(ctx, node, node.args[0])
    return _group_norm(ctx, node, x, int(node.args[1]), _arg(node, 2, "weight"), _arg(node, 3, "bias"),
                       float(_arg(node, 4, "eps", 1e-5)))


@lowering("aten.native_layer_norm", "aten.layer_norm")
def layer_norm(ctx: FamilyContext, node: Node) -> KernelCall:
    x = _float_input(ctx, node, node.args[0])
    shape = list(x.shape)
    norm = [int(d) for d in node.args[1]]
    k = len(norm)
    if k == 0 or k > len(shape) or shape[len(shape) - k:] != norm:
        raise Unsupported(f"{_where(node)}: normalized_shape {norm} of input {shape}")
    red = [d >= len(shape) - k for d in range(len(shape))]
    params = {}
    for key, arg, what in (("w", _arg(node, 2, "weight"), "weight"), ("b", _arg(node, 3, "bias"), "bias")):
        t = _optional(ctx, node, arg, prod(norm), what)
        if t is not None:
            params[key] = (t, [0] * (len(shape) - k) + _flat_strides(t, norm))
    outs = ctx.outputs(node)
    p = _plan(ctx, node, "moments", x, shape, red, list(x.strides), float(_arg(node, 4, "eps", 1e-5)), params,
              outs[0])
    _stat_output(ctx, p, outs[1] if len(outs) > 1 else None, "o_mean", "(float)mean")
    _stat_output(ctx, p, outs[2] if len(outs) > 2 else None, "o_rstd", "rstd")
    return emit(ctx, p, f"layer_norm over the last {k} dims of {shape}")


@lowering("aten.instance_norm")
def instance_norm(ctx: FamilyContext, node: Node) -> KernelCall:
    x = _float_input(ctx, node, node.args[0])
    a = node.args
    shape = list(x.shape)
    if len(shape) < 2:
        raise Unsupported(f"{_where(node)}: instance norm of a rank-{len(shape)} input")
    use_input_stats, momentum, eps = bool(a[5]), float(a[6]), float(a[7])
    if not use_input_stats:  # the running statistics, per channel, as evaluation-mode batch norm
        return _channel_norm(ctx, node, x, a[1], a[2], a[3], a[4], False, momentum, eps)
    if a[3] is not None:
        raise Unsupported(f"{_where(node)}: instance norm that updates running statistics in place")
    c = shape[1]
    red = [d >= 2 for d in range(len(shape))]
    params = {}
    for key, arg, what in (("w", a[1], "weight"), ("b", a[2], "bias")):
        t = _optional(ctx, node, arg, c, what)
        if t is not None:
            params[key] = (t, [_flat_strides(t, [c])[0] if d == 1 else 0 for d in range(len(shape))])
    p = _plan(ctx, node, "moments", x, shape, red, list(x.strides), eps, params, ctx.outputs(node)[0])
    return emit(ctx, p, f"instance_norm over {shape}")


@lowering("aten.softmax", "aten._softmax", "aten._safe_softmax", "aten.log_softmax", "aten._log_softmax")
def softmax(ctx: FamilyContext, node: Node) -> KernelCall:
    x = _float_input(ctx, node, node.args[0])
    shape = list(x.shape)
    rank = max(len(shape), 1)
    dim = int(_arg(node, 1, "dim", -1))
    if not -rank <= dim < rank:
        raise Unsupported(f"{_where(node)}: dim {dim} of a rank-{len(shape)} input")
    dim %= rank
    if node.op in ("aten.softmax", "aten._safe_softmax", "aten.log_softmax"):
        dtype = _arg(node, 2, "dtype")
        if dtype not in (None, "torch.float32"):
            raise Unsupported(f"{_where(node)}: softmax to dtype {dtype}")
    if node.out and node.out[0].dtype != "float32":
        raise Unsupported(f"{_where(node)}: output of dtype {node.out[0].dtype}")
    sizes, xs = (shape, list(x.strides)) if shape else ([1], [0])
    kind: Kind = "log_softmax" if "log" in node.op else "safe_softmax" if "safe" in node.op else "softmax"
    red = [d == dim for d in range(len(sizes))]
    p = _plan(ctx, node, kind, x, sizes, red, xs, 0.0, {}, ctx.outputs(node)[0])
    return emit(ctx, p, f"{kind} over dim {dim} of {shape}")
