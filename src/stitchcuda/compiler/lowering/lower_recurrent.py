"""LSTM and GRU cells, one time step each: the input and hidden products as SGEMMs into gate
buffers (the input ones of every step as one GEMM where the steps read one sequence with one
weight), then one pointwise kernel for the gates and the state updates."""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import (
    VIEWS,
    Expr,
    Leaf,
    Program,
    Step,
    Unsupported,
    const,
    leaf,
    op,
    ref,
    view_expr,
)
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import CELLS, SPLITS, ZEROS
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lower_gemm import gemm_shape, place_product
from stitchcuda.compiler.lowering.lowered import Lowered, to_ident
from stitchcuda.compiler.lowering.registry import group_lowering


def batch_recurrent_inputs(cx: LowerContext) -> None:
    """Cells that read x[t] of one forward argument for every t with the same input weight:
    x.W_ih^T for all steps is one GEMM ([T*B, I] . [I, gates*H], emitted before the first
    step), and each step's gate kernel reads its slice; only h.W_hh^T stays per step."""
    found: dict[tuple[str, Any, str], list[tuple[int, Node]]] = {}
    entry = {v for v, _, _ in cx.out.args}
    for n in cx.graph.nodes:
        a = n.args
        if n.op not in CELLS or not (isinstance(a[0], str) and a[0].startswith("%")):
            continue
        sel = cx.nodes.get(a[0][1:])
        if sel is None or sel.op != "aten.select" or not isinstance(sel.args[0], str):
            continue
        x = sel.args[0][1:]
        if x not in entry or len(cx.shape(x)) != 3 or sel.args[1] % 3 != 0:
            continue
        found.setdefault((x, a[2], n.op), []).append((sel.args[2] % cx.shape(x)[0], n))
    for (x, w, _cell_op), steps in found.items():
        t_all = cx.shape(x)[0]
        if len(steps) < 2 or sorted(t for t, _ in steps) != list(range(t_all)):
            continue
        value = f"{x}__{to_ident(str(w))}__gi_all"
        for t, n in steps:
            cx.batched[n.name] = (value, t, x, w)


def fold_states_and_views(cx: LowerContext, nodes: list[Node], anchor: Node, env: dict[str, Expr]) -> None:
    """The nodes before a recurrent ``anchor`` into ``env``: zero (or constant) initial states as
    constants its kernels fold, views and splits as strided reads."""
    for n in nodes:
        if n is anchor:
            break
        if n.op in ZEROS:
            value = float(n.args[1]) if n.op == "aten.full" else 0.0
            env[n.name] = Expr("const", const=value, shape=cx.shape(n.name))
        elif n.op in SPLITS:
            cx.split(n, env)
        elif n.op in VIEWS:
            env[n.name] = view_expr(n, cx.arg(env, n.name)(n.args[0]))
        else:
            raise Unsupported(f"{n.name} ({n.op}) before {anchor.name} ({anchor.op})")


@group_lowering("recurrent cell", 30, lambda g, nodes: any(n.op in CELLS for n in nodes))
def lower_recurrent(cx: LowerContext, g: FusionGroup, nodes: list[Node]) -> Lowered:
    """One time step of an LSTM/GRU cell: x.W_ih^T and h.W_hh^T as two cuBLAS GEMMs into gate
    buffers (the second skipped while h is the zero initial state), then one pointwise kernel
    over [batch, hidden] for biases, gate nonlinearities and the state updates, writing every
    output the rest of the graph reads (h', and c' for an LSTM)."""
    env: dict[str, Expr] = {}
    cells = [n for n in nodes if n.op in CELLS]
    if len(cells) != 1:
        raise Unsupported(f"{len(cells)} recurrent cells in one group")
    cell = cells[0]
    where = f"{cell.name} ({cell.op})"
    fold_states_and_views(cx, nodes, cell, env)
    if nodes[-1] is not cell:
        raise Unsupported(f"{nodes[-1].name} ({nodes[-1].op}) after the cell")
    arg = cx.arg(env, where)
    lstm = cell.op == "aten.lstm_cell"
    a = cell.args
    x, (h, c) = arg(a[0]), ([arg(v) for v in a[1]] if lstm else (arg(a[1]), None))
    if len(a) < 6 or a[4] is None or a[5] is None:
        raise Unsupported(f"{where}: a cell without biases")
    w_ih, w_hh, b_ih, b_hh = (arg(v) for v in a[2:6])
    gates = CELLS[cell.op]
    if len(x.shape) != 2 or len(w_hh.shape) != 2:
        raise Unsupported(f"{where}: unbatched input of shape {list(x.shape)}")
    batch, hidden = x.shape[0], w_hh.shape[1]
    width = gates * hidden
    parts: list[Lowered] = []
    pre: dict[str, Expr] = {}
    if cell.name in cx.batched:
        value, t, x_all, _ = cx.batched[cell.name]
        steps_all, b_all, i_all = cx.shape(x_all)
        if value not in cx.out.storage:  # the first step: one GEMM for every step's x[t].W_ih^T
            wt = Leaf(w_ih.leaf.value, (w_ih.shape[1], w_ih.shape[0]),  # type: ignore[union-attr]
                      (w_ih.leaf.strides[1], w_ih.leaf.strides[0]))  # type: ignore[union-attr]
            gemm = gemm_shape(cx, cell, leaf(x_all, (steps_all * b_all, i_all)),
                              Expr("leaf", leaf=wt, shape=wt.shape))
            gemm.out = f"b_{to_ident(value)}"
            place_product(cx, gemm)
            cx.out.intermediates.append((gemm.out, [steps_all, b_all, width]))
            cx.out.storage[value] = gemm.out
            parts.append(Lowered(g, "gemm", gemm=gemm, describe=f"{cell.op} {cell.module}: gi for all "
                                 f"{steps_all} steps [{gemm.m} x {gemm.k}] . [{gemm.k} x {gemm.n}] via cublasSgemm"))
        pre["gi"] = Expr("leaf", leaf=Leaf(value, (batch, width), (width, 1), t * batch * width),
                         shape=(batch, width))
    for tag, lhs, w in (("gi", x, w_ih), ("gh", h, w_hh)):
        if tag in pre:
            continue  # computed for every step at once
        if lhs.op == "const" and lhs.const == 0.0:
            continue  # the zero initial state: h.W_hh^T is zero
        if w.op != "leaf" or len(w.shape) != 2:
            raise Unsupported(f"{where}: weight {tag} is not a parameter matrix")
        wt = Leaf(w.leaf.value, (w.shape[1], w.shape[0]), (w.leaf.strides[1], w.leaf.strides[0]))  # type: ignore[union-attr]
        gemm = gemm_shape(cx, cell, lhs, Expr("leaf", leaf=wt, shape=wt.shape))
        value = f"{cell.name}__{tag}"
        gemm.out = f"b_{to_ident(value)}"
        place_product(cx, gemm)
        cx.out.intermediates.append((gemm.out, [batch, width]))
        cx.out.storage[value] = gemm.out
        parts.append(Lowered(g, "gemm", gemm=gemm, describe=f"{cell.op} {cell.module}: {tag} "
                             f"[{gemm.m} x {gemm.k}] . [{gemm.k} x {gemm.n}] via cublasSgemm"))
        pre[tag] = Expr("leaf", leaf=Leaf(value, (batch, width), (width, 1)), shape=(batch, width))

    def gate(tag: str, k: int) -> Expr:
        bias = b_ih if tag == "gi" else b_hh
        lf: Leaf = bias.leaf  # type: ignore[assignment]
        b = leaf(lf.value, (hidden,), (lf.strides[0],), lf.offset + k * hidden * lf.strides[0])
        if tag not in pre:
            return b
        m: Leaf = pre[tag].leaf  # type: ignore[assignment]
        return op("add", leaf(m.value, (batch, hidden), (width, 1), m.offset + k * hidden), b)

    steps: list[Step] = []

    def step(name: str, e: Expr) -> Expr:
        steps.append(Step(f"{to_ident(cell.name)}__{name}", "full", e))
        return ref(steps[-1].name, (batch, hidden))

    if lstm:
        i, f, gg, o = (step(nm, op(fn, op("add", gate("gi", k), gate("gh", k)))) for k, (nm, fn) in
                       enumerate((("i", "sigmoid"), ("f", "sigmoid"), ("g", "tanh"), ("o", "sigmoid"))))
        c2 = step("c", op("add", op("mul", f, c), op("mul", i, gg)))
        h2 = step("h", op("mul", o, op("tanh", c2)))
        results = [h2, c2]
    else:
        r = step("r", op("sigmoid", op("add", gate("gi", 0), gate("gh", 0))))
        z = step("z", op("sigmoid", op("add", gate("gi", 1), gate("gh", 1))))
        nn_ = step("n", op("tanh", op("add", gate("gi", 2), op("mul", r, gate("gh", 2)))))
        results = [step("h", op("add", op("mul", op("sub", const(1.0), z), nn_), op("mul", z, h)))]
    prog = Program("pointwise", (batch, hidden), steps=steps)
    inside = set(g.nodes)
    readers = {i: n.name for n in cx.graph.nodes if n.name not in inside for i in n.inputs()}
    for name, (src, index) in cx.graph.getitems.items():
        if src == cell.name and (name in readers or name in cx.graph.outputs):
            prog.outputs[name] = results[index].ref
            prog.output_shapes[name] = cx.shape(name)
            cx.buffer(name)
    if len(cell.out) == 1 and (cell.name in readers or cell.name in cx.graph.outputs):  # gru_cell: h' only
        prog.outputs[cell.name] = results[0].ref
        prog.output_shapes[cell.name] = cx.shape(cell.name)
        cx.buffer(cell.name)
    if not prog.outputs:
        raise Unsupported(f"{where}: nothing reads its outputs")
    for s in prog.steps:
        for lf in s.expr.leaves():
            lf.effective_strides(prog.shape)
    parts.append(Lowered(g, "pointwise", program=prog, describe=f"{cell.op} gates over [{batch} x {hidden}]"))
    return Lowered(g, "sequence", parts=parts, describe=f"{cell.op} {cell.module}: " + ", ".join(
        p.describe.split(": ", 1)[-1] for p in parts))
