"""Row kernels: reductions along the last dimension (softmax, norms, sums, a pick of one element
per row) with the pointwise work before and after them, a reduction over several trailing dims
as one over a merged view, and group norm as a statistics row kernel plus a pointwise kernel."""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.data_movement import DATA_OPS
from stitchcuda.compiler.ir.expr import (
    VIEWS,
    Expr,
    Leaf,
    Program,
    Step,
    Unsupported,
    const,
    leaf,
    numel,
    op,
    ref,
    reshape_strides,
    view_expr,
)
from stitchcuda.compiler.ir.formulas import (
    ROW_OPS,
    is_pointwise,
    pick_steps,
    pointwise_expr,
    row_scalar_leaf,
    row_steps,
)
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import MAX_ROW, RESHAPES, SPLITS
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lowered import Lowered, to_ident
from stitchcuda.compiler.lowering.registry import group_lowering
from stitchcuda.compiler.lowering.regroup import onto, refined, regrouped


@group_lowering("row", 70, lambda g, nodes: any(n.op in ROW_OPS for n in nodes))
def lower_row(cx: LowerContext, g: FusionGroup, nodes: list[Node], env: dict[str, Expr] | None = None,
              outs: list[str] | None = None) -> Lowered:
    env = dict(env or {})
    nodes, merged = _merge_trailing(cx, nodes, env)
    # the largest shape, a row operator's input first (a norm over a permuted view of its producer)
    shape = max([merged.get(n.args[0][1:]) or cx.shape(n.args[0][1:]) for n in nodes if n.op in ROW_OPS
                 and isinstance(n.args[0], str) and n.args[0].startswith("%")] + [cx.shape(n.name) for n in nodes],
                key=numel)
    if not shape:
        raise Unsupported("a row reduction over a 0-d value")
    shape = refined(shape, [cx.shape(n.name) for n in nodes])
    n_col = shape[-1]
    if n_col > MAX_ROW:
        raise Unsupported(f"rows of {n_col} elements (at most {MAX_ROW})")
    kinds: dict[str, str] = {}
    prog = Program("row", shape)

    def kind_of(e: Expr) -> str:
        if any(not row_scalar_leaf(lf, shape) for lf in e.leaves()) or any(kinds[r] == "full" for r in e.refs()):
            flat = [r for r in e.refs() if kinds[r] == "scalar" and squeezed.get(r)]
            if flat:  # a [rows] value would broadcast along the row in torch, not per row
                raise Unsupported(f"the per-row value {flat[0]}, reshaped, is combined with a whole row")
            return "full"
        return "scalar"

    rows = numel(shape) // n_col
    squeezed: dict[str, bool] = {}  # scalar refs reshaped so that their last dimension is not 1

    for n in nodes:
        arg = cx.arg(env, f"{n.name} ({n.op})")
        if n.op in SPLITS:
            cx.split(n, env)
            continue
        out = cx.shape(n.name)
        if n.op in VIEWS:
            x = arg(n.args[0])
            if x.op == "ref" and kinds.get(x.ref) == "scalar" and n.op in RESHAPES and numel(out) == rows:
                env[n.name] = ref(x.ref, out)  # one value per row either way: a reshape of nothing
                squeezed[x.ref] = squeezed.get(x.ref, False) or out[-1:] not in ((1,), ())
            elif x.op == "ref" and kinds.get(x.ref) == "full" and n.op in RESHAPES and regrouped(out, shape):
                env[n.name] = ref(x.ref, out)  # the same element of the same row: a reshape of nothing
            else:
                env[n.name] = view_expr(n, x)
            continue
        if n.op == "aten.gather" and arg(n.args[0]).op == "ref":
            steps = pick_steps(n, arg(n.args[0]), arg(n.args[2]), shape)
            for s in steps:
                s.name = to_ident(s.name)
                kinds[s.name] = "scalar"
            prog.steps += steps
            env[n.name] = ref(steps[-1].name, out)
            continue
        if n.op in ROW_OPS:
            steps = row_steps(n, lambda v, arg=arg: onto(arg(v), shape), shape)
            for s in steps:
                s.name = to_ident(s.name)
                kinds[s.name] = "scalar" if s.kind in ("scalar", "reduce") else "full"
            prog.steps += steps
            env[n.name] = ref(steps[-1].name, out)
            continue
        e = cx.data_expr(n, arg) if n.op in DATA_OPS else pointwise_expr(n, arg)
        if e.op in ("leaf", "ref", "const"):
            env[n.name] = e
            continue
        e = onto(e, shape)
        kind = kind_of(e)
        if kind == "scalar" and out[-1:] not in ((1,), ()) and n_col > 1 and numel(out) != rows:
            raise Unsupported(f"{n.name}: shape {list(out)} neither a row nor a per-row value")
        name = to_ident(n.name)
        prog.steps.append(Step(name, kind, e))  # type: ignore[arg-type]
        kinds[name] = kind
        squeezed[name] = kind == "scalar" and out[-1:] not in ((1,), ())
        env[n.name] = ref(name, out)
    for s in prog.steps:
        if s.kind == "reduce" and kind_of(s.expr) != "full":
            raise Unsupported(f"{s.name}: reduction of a per-row value")
    outs = cx.outputs_of(g) if outs is None else outs
    for v in outs:
        e = env[v]
        if e.op != "ref":
            name = to_ident(v) + "__out"
            e = onto(e, shape)
            kinds[name] = kind_of(e)
            prog.steps.append(Step(name, kinds[name], e))  # type: ignore[arg-type]
            e = ref(name, cx.shape(v))
        vs = cx.shape(v)
        if kinds[e.ref] == "full" and not regrouped(vs, shape):  # stored row by row either way
            raise Unsupported(f"output {v} of shape {list(vs)} is not the row shape {list(shape)}")
        if kinds[e.ref] == "scalar" and numel(vs) != numel(shape) // n_col:
            raise Unsupported(f"output {v} of shape {list(vs)} is not one value per row")
        prog.outputs[v] = e.ref
        prog.output_shapes[v] = vs
        cx.buffer(v)
    for s in prog.steps:
        for lf in s.expr.leaves():
            lf.effective_strides(shape)
    return Lowered(g, "row", program=prog, describe=f"row kernel over {numel(shape) // n_col} rows of {n_col}")


def _merge_trailing(cx: LowerContext, nodes: list[Node], env: dict[str, Expr]) -> tuple[list[Node], dict[str, tuple]]:
    """A mean / sum / amax over several trailing dimensions of a buffer (e.g. a spatial mean of
    NCHW over H and W) becomes a reduction over the last dimension of a merged view of it."""
    merged: dict[str, tuple] = {}
    out = []
    for n in nodes:
        a = n.args
        x_name = a[0][1:] if a and isinstance(a[0], str) and a[0].startswith("%") else None
        dims = a[1] if len(a) > 1 else None
        if (n.op in ("aten.mean", "aten.sum", "aten.amax") and x_name and isinstance(dims, list) and len(dims) > 1
                and x_name not in env and x_name in cx.out.storage):
            x = cx.arg(env, n.name)(a[0]).leaf  # the buffer, or a strided part of another's
            rank, k = len(x.shape), len(dims)
            new_shape = tuple(x.shape[:rank - k]) + (numel(x.shape[rank - k:]),)
            strides = reshape_strides(x.shape, x.strides, new_shape)
            if sorted(d % rank for d in dims) == list(range(rank - k, rank)) and strides is not None:
                tmp = f"{n.name}__rows"
                env[tmp] = leaf(x_name, new_shape, strides, x.offset)
                merged[tmp] = new_shape
                n = n.model_copy(update={"args": ["%" + tmp, [-1], *a[2:]]})
        out.append(n)
    return out, merged


@group_lowering("group norm", 60, lambda g, nodes: nodes[0].op == "aten.group_norm")
def lower_group_norm(cx: LowerContext, g: FusionGroup, nodes: list[Node]) -> Lowered:
    """Group norm of a [N, C, *spatial] buffer and the pointwise chain after it, in two kernels:
    a row kernel over the N x G groups (each row the C/G channels x spatial elements of one
    group, two-pass variance) writing mean and 1/std per group, then one pointwise kernel over
    the buffer seen as [N, G, C/G, S] (so the group and channel of an element are plain
    coordinates) normalising, applying the per-channel affine and the rest of the chain."""
    gn = nodes[0]
    where = f"{gn.name} ({gn.op})"
    a = list(gn.args) + [None] * (5 - len(gn.args))
    x = cx.arg({}, where)(a[0])
    if x.op != "leaf" or not x.leaf.contiguous or len(x.shape) < 3:  # type: ignore[union-attr]
        raise Unsupported(f"{where}: the input is not a contiguous [N, C, ...] buffer")
    groups = a[1]
    n_, c_ = x.shape[0], x.shape[1]
    spatial = numel(x.shape[2:])
    if not isinstance(groups, int) or groups < 1 or c_ % groups:
        raise Unsupported(f"{where}: {groups!r} groups of {c_} channels")
    cg = c_ // groups
    if cg * spatial > MAX_ROW:
        raise Unsupported(f"{where}: groups of {cg * spatial} elements (at most {MAX_ROW})")
    eps = float(a[4]) if a[4] is not None else 1e-5
    src = x.leaf.value  # type: ignore[union-attr]
    # kernel 1: statistics per (n, group)
    rows = (n_, groups, cg * spatial)
    xr = leaf(src, rows)
    stat = (n_, groups, 1)
    p = to_ident(gn.name)
    stats = Program("row", rows, steps=[
        Step(f"{p}__sum", "reduce", xr, "sum"),
        Step(f"{p}__mean", "scalar", op("div", ref(f"{p}__sum", stat), const(cg * spatial))),
        Step(f"{p}__sq", "reduce", op("square", op("sub", xr, ref(f"{p}__mean", stat))), "sum"),
        Step(f"{p}__rstd", "scalar", op("rsqrt", op("add", op("div", ref(f"{p}__sq", stat),
                                                                const(cg * spatial)), const(eps)))),
    ])
    for part in ("mean", "rstd"):
        value, ident = f"{gn.name}__{part}", f"b_{p}__{part}"
        cx.out.intermediates.append((ident, [n_, groups]))
        cx.out.storage[value] = ident
        stats.outputs[value] = f"{p}__{part}"
        stats.output_shapes[value] = (n_, groups)
    # kernel 2: normalise + affine + the chain, over [N, G, C/G, S]
    shape = (n_, groups, cg, spatial)
    per_group = {part: leaf(f"{gn.name}__{part}", (n_, groups, 1, 1), (groups, 1, 0, 0)) for part in
                 ("mean", "rstd")}
    y = op("mul", op("sub", leaf(src, shape), per_group["mean"]), per_group["rstd"])
    arg = cx.arg({}, where)
    for k, combine in ((2, "mul"), (3, "add")):
        if a[k] is None:
            continue
        w = arg(a[k])
        if w.op != "leaf" or w.shape != (c_,) or not w.leaf.plain:  # type: ignore[union-attr]
            raise Unsupported(f"{where}: affine parameter of shape {list(w.shape)}")
        lf: Leaf = w.leaf  # type: ignore[assignment]
        y = op(combine, y, leaf(lf.value, (groups, cg, 1), (cg * lf.strides[0], lf.strides[0], 0), lf.offset))
    steps = [Step(p, "full", y)]
    env: dict[str, Expr] = {gn.name: ref(p, shape)}
    full = tuple(x.shape)

    def resolve(v: Any) -> Expr:  # the chain's other operands, seen in the [N, G, C/G, S] shape
        e = cx.arg(env, where)(v)
        if e.op != "leaf":
            return e
        lf: Leaf = e.leaf  # type: ignore[assignment]
        eff = lf.effective_strides(full) if len(lf.shape) <= len(full) else None
        if eff is None or not lf.plain:
            raise Unsupported(f"{where}: the chain reads {lf.value} of shape {list(lf.shape)}")
        inner = reshape_strides(full, eff, shape)
        if inner is None:
            raise Unsupported(f"{where}: {lf.value} cannot be read by group")
        return leaf(lf.value, shape, inner, lf.offset)

    for n in nodes[1:]:
        if not is_pointwise(n.op) or n.op == "aten.batch_norm":
            raise Unsupported(f"{n.name} ({n.op}) after the group norm (only elementwise operators)")
        e = pointwise_expr(n, resolve)
        if e.op in ("leaf", "ref", "const"):
            env[n.name] = e
            continue
        steps.append(Step(to_ident(n.name), "full", e))
        env[n.name] = ref(to_ident(n.name), shape)
    prog = Program("pointwise", shape, steps=steps)
    for v in cx.outputs_of(g):
        if cx.shape(v) != full:
            raise Unsupported(f"{v}: an output of shape {list(cx.shape(v))} after the group norm")
        e = env[v]
        if e.op != "ref":
            steps.append(Step(to_ident(v) + "__out", "full", e))
            e = ref(to_ident(v) + "__out", shape)
        prog.outputs[v] = e.ref
        prog.output_shapes[v] = shape
        cx.buffer(v)
    if not prog.outputs:
        raise Unsupported("the group produces nothing that is used")
    parts = [Lowered(g, "row", program=stats, describe=f"group statistics over {n_ * groups} rows of "
                                                        f"{cg * spatial}"),
             Lowered(g, "pointwise", program=prog, describe=f"normalise + affine + "
                                                            f"{', '.join(n.op for n in nodes[1:]) or 'copy'}")]
    return Lowered(g, "sequence", parts=parts, describe=f"group_norm ({groups} groups): " + " -> ".join(
        x.describe for x in parts))
