"""Pointwise chains as one kernel over their output shape (broadcasts, views, concatenations and
gathers are index arithmetic; a group that only reshapes a contiguous buffer is an alias), and the
epilogue kernel that applies bias + a pointwise chain in place after a cuBLAS or cuDNN call."""

from __future__ import annotations

from typing import Literal

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.data_movement import DATA_OPS
from stitchcuda.compiler.ir.expr import (
    VIEWS,
    Expr,
    Program,
    Step,
    Unsupported,
    broadcast,
    leaf,
    numel,
    ref,
    reshape_strides,
    view_expr,
)
from stitchcuda.compiler.ir.formulas import pointwise_expr
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import RESHAPES, SPLITS
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lowered import Lowered, to_ident
from stitchcuda.compiler.lowering.registry import group_lowering
from stitchcuda.compiler.lowering.regroup import onto, refined


@group_lowering("pointwise", 90, lambda g, nodes: True)  # last: any group nothing else takes
def lower_pointwise(cx: LowerContext, g: FusionGroup, nodes: list[Node], env: dict[str, Expr] | None = None,
                    program: Program | None = None) -> Lowered:
    env = dict(env or {})
    steps = program.steps if program else []
    for n in nodes:
        arg = cx.arg(env, f"{n.name} ({n.op})")
        if n.op in SPLITS:
            cx.split(n, env)
        elif n.op in VIEWS:
            x = arg(n.args[0])
            try:
                env[n.name] = view_expr(n, x)
            except Unsupported:
                if n.op not in RESHAPES or x.op not in ("leaf", "ref") or numel(x.shape) != numel(cx.shape(n.name)):
                    raise
                # a reshape of what the kernel computes, or of a read it cannot view (a copy's
                # permute): the value at the same element, the kernel running over the finer shape
                if x.op == "leaf":
                    name = to_ident(n.name) + "__copy"
                    steps.append(Step(name, "full", x))
                    x = ref(name, x.shape)
                env[n.name] = ref(x.ref, cx.shape(n.name))
        else:
            e = cx.data_expr(n, arg) if n.op in DATA_OPS else pointwise_expr(n, arg)
            if e.op in ("leaf", "ref", "const"):
                env[n.name] = e
            else:
                steps.append(Step(to_ident(n.name), "full", e))
                env[n.name] = ref(to_ident(n.name), cx.shape(n.name))
    outs = cx.outputs_of(g)
    if not outs:
        raise Unsupported("the group produces nothing that is used")
    shapes = {cx.shape(v) for v in outs}
    if len(shapes) != 1:
        raise Unsupported(f"outputs of different shapes {sorted(map(list, shapes))}")
    shape = shapes.pop()
    if steps and program is None:
        shape = refined(shape, [tuple(s.expr.shape) for s in steps])
        for s in steps:
            s.expr = onto(s.expr, shape)
    if program is None and len(outs) == 1 and not steps and outs[0] not in cx.out.layouts:
        e = env[outs[0]]
        if e.op == "leaf" and e.leaf.contiguous:  # type: ignore[union-attr]
            source = e.leaf.value  # type: ignore[union-attr]
            # an output whose value was planned into its buffer (output_views.py) is an alias too
            if outs[0] not in cx.graph.outputs or cx.out.storage.get(outs[0], "") == cx.out.storage.get(source):
                cx.out.storage[outs[0]] = cx.out.storage[source]
                return Lowered(g, "alias", describe=f"{outs[0]} is a view of {source}")
    prog = program or Program("pointwise", shape)
    prog.steps = steps
    for v in outs:
        e = env[v]
        if e.op != "ref":
            steps.append(Step(to_ident(v) + "__out", "full", onto(e, shape)))
            e = ref(to_ident(v) + "__out", cx.shape(v))
        prog.outputs[v] = e.ref
        prog.output_shapes[v] = cx.shape(v)
        if v in cx.out.layouts:  # a piece of a concatenation, written into its slice (concat_plan.py)
            strides, offset = cx.out.layouts[v]
            over = reshape_strides(cx.shape(v), strides, prog.shape)  # the kernel may run over a finer shape
            if over is None:
                raise Unsupported(f"{v}: its slice of {list(strides)} strides cannot be written over {list(prog.shape)}")
            prog.write_strides[v] = (tuple(over), offset)
        cx.buffer(v)
    for s in prog.steps:
        broadcast(s.expr.shape, shape)
        for lf in s.expr.leaves():
            lf.effective_strides(shape)
    return Lowered(g, "pointwise", program=prog, describe=f"pointwise over {list(shape)}")


def epilogue_text(bias: Expr | None, epilogue: list[Node]) -> str:
    return ", ".join(([f"bias {bias.leaf.value}"] if bias is not None and bias.leaf else [])  # type: ignore[union-attr]
                     + [f"{n.op}" for n in epilogue]) or "copy"


def library_call(cx: LowerContext, g: FusionGroup, kind: Literal["gemm", "conv"], value: Node, epilogue: list[Node], bias: Expr | None,
                 env: dict[str, Expr], describe: str) -> tuple[Lowered, str]:
    """A library call (``kind``: "gemm" or "conv") that writes ``value``'s buffer itself, or, with
    a bias or an epilogue left, its raw result for one pointwise kernel (:func:`with_epilogue`);
    returns (the group's lowering, the buffer the call must write)."""
    if bias is None and not epilogue:
        return Lowered(g, kind, describe=describe), cx.buffer(value.name)
    low, out = with_epilogue(cx, g, value, epilogue, bias, env)
    low.kind, low.describe = kind, describe + " + epilogue " + epilogue_text(bias, epilogue)
    return low, out


def with_epilogue(cx: LowerContext, g: FusionGroup, anchor: Node, epilogue: list[Node], bias: Expr | None,
                  env: dict[str, Expr]) -> tuple[Lowered, str]:  # anchor: the node the library call computes
    """The anchor (a library call) writes its raw result into a group output of its shape (or a
    scratch buffer), and one pointwise kernel applies bias + the epilogue in place there;
    returns (that kernel, the buffer the library call must write)."""
    out_shape = cx.shape(anchor.name)
    raw_value = f"{anchor.name}__raw"
    raw_target = next((v for v in cx.outputs_of(g) if cx.shape(v) == out_shape), None)
    if raw_target is None:
        raw = cx.scratch(raw_value, out_shape)
    else:
        raw = cx.out.storage[raw_value] = cx.buffer(raw_target)
    return apply_epilogue(cx, g, anchor, leaf(raw_value, out_shape), epilogue, bias, env), raw


def apply_epilogue(cx: LowerContext, g: FusionGroup, anchor: Node, value: Expr, epilogue: list[Node],
                   bias: Expr | None, env: dict[str, Expr]) -> Lowered:
    """The bias and the epilogue as one pointwise kernel over the anchor's output shape (over the
    group's output shape where the epilogue reshapes it), ``value`` reading the library call's
    result wherever (and in whatever layout) it wrote it."""
    out_shape = cx.shape(anchor.name)
    shapes = {cx.shape(v) for v in cx.outputs_of(g)}
    if len(shapes) == 1 and bias is None:
        out_shape = shapes.pop()
    steps: list[Step] = []
    if bias is not None:
        steps.append(Step(to_ident(anchor.name), "full", Expr("add", (value, bias),
                                                              shape=broadcast(value.shape, bias.shape))))
        env[anchor.name] = ref(to_ident(anchor.name), out_shape)
    else:
        env[anchor.name] = value
    return lower_pointwise(cx, g, epilogue, env, Program("pointwise", out_shape, steps=steps))
