"""Explicit attention (Q.K^T -> scale/mask -> softmax -> P.V) as two strided-batched SGEMMs over
the buffers the views around them read and write, and one row kernel in place over the scores."""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import (
    IDENTITY,
    VIEWS,
    Expr,
    Leaf,
    Program,
    Step,
    Unsupported,
    contiguous_strides,
    leaf,
    permutation,
    view_expr,
)
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import RESHAPES, SPLITS
from stitchcuda.compiler.lowering.attention_kernel import fused_attention
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lower_gemm import describe_gemm, place_product, strided_gemm
from stitchcuda.compiler.lowering.lower_rows import lower_row
from stitchcuda.compiler.lowering.lowered import Gemm, Lowered, to_ident
from stitchcuda.compiler.lowering.registry import group_lowering
from stitchcuda.compiler.lowering.regroup import regrouped_read


@group_lowering("attention", 10, lambda g, nodes: g.kind == "attention")
def lower_attention(cx: LowerContext, g: FusionGroup, nodes: list[Node]) -> Lowered:
    """Q.K^T as a batched GEMM into a scores buffer, one in-place row kernel for what lies between
    (scale, mask, softmax), and P.V as a batched GEMM written straight into the layout of the
    group's output (the transpose -> reshape after it become the GEMM's output strides)."""
    roles = g.roles
    if "sdpa" in roles or not {"qk", "pv"} <= set(roles):
        raise Unsupported(f"attention without explicit Q.K^T and P.V products (roles {sorted(roles)})")
    names = [n.name for n in nodes]
    iq, ip = names.index(roles["qk"]), names.index(roles["pv"])
    qk, pv = nodes[iq], nodes[ip]
    before, middle, after = nodes[:iq], nodes[iq + 1:ip], nodes[ip + 1:]
    # the mask's preparation (a where over a bool mask) joined the group ahead of Q.K^T: the row
    # kernel computes it where it reads it
    def sources(n: Node) -> set[str]:  # a split's piece is read from the split node
        return {cx.graph.getitems.get(v, (v, 0))[0] for v in n.inputs()}

    operands = sources(qk) | sources(pv)
    for n in reversed(before):
        if n.name in operands:
            operands |= sources(n)
    middle = [n for n in before if n.name not in operands] + middle
    before = [n for n in before if n.name in operands]
    env: dict[str, Expr] = {}
    scale: dict[str, float] = {}  # values that are a view of a buffer times a constant
    for n in before:
        if n.op in SPLITS:
            cx.split(n, env)
        elif n.op in VIEWS or n.op in IDENTITY:
            x = cx.arg(env, n.name)(n.args[0])
            env[n.name] = x if n.op in IDENTITY else _operand_view(n, x, cx.shape(n.name))
            src = n.args[0][1:] if isinstance(n.args[0], str) else ""
            if src in scale:
                scale[n.name] = scale[src]
        elif n.op in ("aten.mul", "aten.div") and len(n.args) == 2 and isinstance(n.args[1], (int, float)) \
                and not isinstance(n.args[1], bool) and n.args[1] != 0:
            env[n.name] = cx.arg(env, n.name)(n.args[0])  # the constant goes into the GEMM's alpha
            factor = float(n.args[1]) if n.op == "aten.mul" else 1.0 / float(n.args[1])
            scale[n.name] = scale.get(n.args[0][1:], 1.0) * factor if isinstance(n.args[0], str) else factor
        else:
            raise Unsupported(f"{n.name} ({n.op}) before Q.K^T (only views and constant scales may feed it)")
    for n in (qk, pv):
        if n.op not in ("aten.matmul", "aten.bmm") or n.kwargs:
            raise Unsupported(f"{n.name} ({n.op}) as an attention product")
    inside = set(names)
    for n in [qk, *middle, pv, *after][:-1]:  # the last may be returned: P.V writes it
        if n.name in cx.graph.outputs or any(u not in inside for u in cx.users.get(n.name, [])):
            raise Unsupported(f"{n.name} ({n.op}) is used outside the attention group")
    if any(v in scale for n in middle + [pv] for v in n.inputs()):
        raise Unsupported("a scaled value is read after Q.K^T")
    final, strides = _output_layout(cx, pv, after)
    alpha = 1.0  # the constant scales of Q and K, folded into Q.K^T
    for operand in qk.args[:2]:
        alpha *= scale.get(operand[1:], 1.0) if isinstance(operand, str) else 1.0
    if cx.options.fused_attention:
        mark = cx.out.mark()
        try:
            return fused_attention(cx, g, qk, pv, middle, env, alpha, final, strides)
        except Unsupported:
            cx.out.undo(mark)  # the GEMM path lowers it
    # Q.K^T into a contiguous scores buffer, then the row kernel in place over it
    s_shape = cx.shape(qk.name)
    scores = cx.scratch(qk.name, s_shape)
    arg = cx.arg(env, f"{qk.name} ({qk.op})")
    copies: list[Lowered] = []  # regrouped operands the products cannot read in place, laid out first
    g_qk = _product(cx, g, f"{qk.name} ({qk.op})", arg(qk.args[0]), arg(qk.args[1]), scores, s_shape,
                    contiguous_strides(s_shape), copies)
    g_qk.alpha *= alpha
    place_product(cx, g_qk)
    parts = [*copies, Lowered(g, "gemm", gemm=g_qk, describe=describe_gemm(qk, g_qk))]
    p_value = qk.name
    if middle:
        p_value = middle[-1].name
        if pv.args[0] != "%" + p_value:
            raise Unsupported(f"{pv.name}: its left operand is not the softmax {p_value}")
        cx.out.storage[p_value] = scores  # the row kernel reads its row whole before writing it back
        row = lower_row(cx, g, middle, env, outs=[p_value])
        parts.append(row)
    out = cx.buffer(final)
    arg = cx.arg(env, f"{pv.name} ({pv.op})")
    lhs = leaf(p_value, s_shape) if middle else leaf(qk.name, s_shape)
    copies = []
    g_pv = place_product(cx, _product(cx, g, f"{pv.name} ({pv.op})", lhs, arg(pv.args[1]), out, cx.shape(pv.name),
                                      strides, copies))
    parts += [*copies, Lowered(g, "gemm", gemm=g_pv, describe=describe_gemm(pv, g_pv))]
    return Lowered(g, "sequence", parts=parts, describe=" -> ".join(
        ["Q.K^T (batched GEMM)"] + (["row kernel (" + ", ".join(n.op for n in middle if n.op not in VIEWS)
                                     + ")"] if middle else []) + [f"P.V (batched GEMM) into {final}"]))


def _output_layout(cx: LowerContext, pv: Node, after: list[Node]) -> tuple[str, tuple[int, ...]]:
    """The value P.V's result is stored as (the last of the views after it) and the strides of P.V's
    own shape in that value's buffer: the views, inverted."""
    chain, prev = [], pv.name
    for n in after:
        if n.op in IDENTITY and n.args[0] == "%" + prev:
            prev = n.name  # core ATen's clone before a reshape: P.V writes the layout the views give
            continue
        if n.op not in VIEWS or n.args[0] != "%" + prev:
            raise Unsupported(f"{n.name} ({n.op}) after P.V (only a chain of views may follow it)")
        chain.append(n)
        prev = n.name
    final = prev
    shape = cx.shape(final)
    strides = contiguous_strides(shape)
    for n in reversed(chain):
        inp = cx.shape(n.args[0][1:])
        if n.op in ("aten.transpose", "aten.t"):
            i, j = (n.args[1] % len(inp), n.args[2] % len(inp)) if n.op == "aten.transpose" else (0, 1)
            st = list(strides)
            st[i], st[j] = st[j], st[i]
            strides = tuple(st)
        elif n.op == "aten.permute":
            st = [0] * len(inp)
            for d, src in enumerate(n.args[1]):
                st[src % len(inp)] = strides[d]
            strides = tuple(st)
        elif n.op in ("aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.unsqueeze",
                      "aten.squeeze") and strides == contiguous_strides(shape):
            strides = contiguous_strides(inp)
        else:
            raise Unsupported(f"{n.name} ({n.op}) after P.V cannot be written as output strides")
        shape = inp
    return final, strides


def _operand_view(n: Node, x: Expr, out: tuple[int, ...]) -> Expr:
    """A view on a product's operand path: a view of the read; where a reshape merges batch dims no
    strides can merge (repeat_kv: ``expand`` then ``reshape`` of the key and value heads), a read
    that keeps them apart for the batched GEMM (regroup.regrouped_read), whose last two dims a
    transpose may still swap."""
    regrouped = x.op == "leaf" and tuple(x.shape) != x.leaf.shape  # type: ignore[union-attr]
    if not regrouped:
        try:
            return view_expr(n, x)
        except Unsupported:
            if n.op not in RESHAPES:
                raise
            return regrouped_read(x, out)
    lf: Leaf = x.leaf  # type: ignore[assignment]
    rank = len(x.shape)
    if permutation(n, rank) != [*range(rank - 2), rank - 1, rank - 2]:
        raise Unsupported(f"{n.name} ({n.op}) of a regrouped operand: only its last two dims may swap")
    swapped = Leaf(lf.value, (*lf.shape[:-2], lf.shape[-1], lf.shape[-2]), (*lf.strides[:-2], lf.strides[-1], lf.strides[-2]),
                   lf.offset)
    return Expr("leaf", leaf=swapped, shape=tuple(out))


def _product(cx: LowerContext, g: FusionGroup, where: str, lhs: Expr, rhs: Expr, out: str, shape: tuple[int, ...],
             strides: tuple[int, ...], copies: list[Lowered]) -> Gemm:
    """The batched GEMM of ``lhs`` and ``rhs``; where an operand read as a regrouping of its batch
    dims leaves more batch dims than a GEMM call takes, that operand laid out first by a copy kernel
    (appended to ``copies``), as the ``contiguous()`` of the model did."""
    try:
        return strided_gemm(cx, where, lhs, rhs, out, shape, strides)
    except Unsupported:
        if all(tuple(e.shape) == e.leaf.shape for e in (lhs, rhs)):  # type: ignore[union-attr]
            raise
    laid = []
    for e in (lhs, rhs):
        lf: Leaf = e.leaf  # type: ignore[assignment]
        if tuple(e.shape) == lf.shape:
            laid.append(e)
            continue
        name = f"{lf.value}__laid{len(cx.out.intermediates)}"
        cx.scratch(name, e.shape)
        ident = to_ident(name)
        prog = Program("pointwise", lf.shape, steps=[Step(ident, "full", Expr("leaf", leaf=lf, shape=lf.shape))])
        prog.outputs[name], prog.output_shapes[name] = ident, tuple(e.shape)  # row-major either way
        copies.append(Lowered(g, "pointwise", program=prog, describe=f"{lf.value} laid out as {list(e.shape)}"))
        laid.append(leaf(name, e.shape))
    return strided_gemm(cx, where, *laid, out, shape, strides)
