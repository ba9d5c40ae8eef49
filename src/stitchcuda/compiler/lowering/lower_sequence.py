"""Whole recurrent layers (``aten.lstm`` / ``aten.gru`` / ``aten.rnn_tanh`` / ``aten.rnn_relu``, kept
whole by the capture): any number of layers, one or two directions, batch-first or not, given or
zero initial states, and every output (the sequence, ``h_n``, ``c_n``).

Per layer and direction: x.W_ihᵀ for every time step as ONE GEMM, then per step h.W_hhᵀ as a GEMM
(skipped at a zero initial state) and one pointwise kernel for the biases, the gates and the state
update. The states live in a buffer of ``T + 2`` rows of ``[batch, hidden]``: the forward direction
reads row ``t`` and writes row ``t + 1`` (row 0 is ``h0``), the backward one reads row ``t + 2`` and
writes row ``t + 1``, so both directions' outputs of time ``t`` sit in row ``t + 1`` and a step
writes one contiguous row. The output sequence, ``h_n`` and ``c_n`` are gathered from those rows
by one copy kernel each (a layer's input too, where two directions must be joined)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from stitchcuda.compiler.capture.graph import Node, TensorMeta
from stitchcuda.compiler.ir.data_movement import cat_expr
from stitchcuda.compiler.ir.expr import (
    Expr,
    Leaf,
    Program,
    Step,
    Unsupported,
    const,
    contiguous_strides,
    leaf,
    op,
    ref,
)
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.lowering.kernel_call import KernelCall
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lower_gemm import gemm_shape, place_product
from stitchcuda.compiler.lowering.lower_recurrent import fold_states_and_views
from stitchcuda.compiler.lowering.lowered import Lowered, to_ident
from stitchcuda.compiler.lowering.registry import group_lowering
from stitchcuda.compiler.lowering.sequence_kernel import (
    BARRIER,
    BARRIER_NAME,
    PLACES,
    Pointer,
    RecurrenceGroup,
    RecurrenceLaunch,
    RecurrencePlan,
    plan_recurrence,
    recurrence_kernel,
    recurrence_launch,
    recurrence_ms,
    stepped_ms,
)

# operator -> (cell, gates per hidden unit)
SEQUENCES = {"aten.lstm": ("lstm", 4), "aten.gru": ("gru", 3), "aten.rnn_tanh": ("tanh", 1),
             "aten.rnn_relu": ("relu", 1)}


def _transposed(w: Expr, where: str) -> Expr:
    if w.op != "leaf" or len(w.shape) != 2 or not w.leaf.plain:  # type: ignore[union-attr]
        raise Unsupported(f"{where}: a weight that is not a parameter matrix")
    lf: Leaf = w.leaf  # type: ignore[assignment]
    wt = Leaf(lf.value, (w.shape[1], w.shape[0]), (lf.strides[1], lf.strides[0]), lf.offset)
    return Expr("leaf", leaf=wt, shape=wt.shape)


def _cat(pieces: list[Expr], dim: int, shape: tuple[int, ...]) -> Expr:
    names = {f"%p{i}": p for i, p in enumerate(pieces)}
    node = SimpleNamespace(name="recurrent_gather", op="aten.cat", overload="default", args=[list(names), dim],
                           out=[TensorMeta(shape=list(shape), dtype="float32")])
    return cat_expr(node, lambda a: names[a])


class _Layers:
    def __init__(self, cx: LowerContext, g: FusionGroup, node: Node, env: dict[str, Expr]):
        self.cx, self.g, self.node = cx, g, node
        self.where = f"{node.name} ({node.op})"
        self.cell, self.gates = SEQUENCES[node.op]
        a = node.args
        self.arg = cx.arg(env, self.where)
        self.x = self.arg(a[0])
        hx = a[1] if isinstance(a[1], list) else [a[1]]
        self.hx = [self.arg(h) for h in hx]
        self.params = [self.arg(p) for p in a[2]]
        self.biases, self.layers = bool(a[3]), int(a[4])
        dropout, train, bidirectional, self.batch_first = float(a[5]), bool(a[6]), bool(a[7]), bool(a[8])
        if train and dropout > 0 and self.layers > 1:
            raise Unsupported(f"{self.where}: dropout {dropout} between layers in training mode draws random numbers")
        if len(self.x.shape) != 3:
            raise Unsupported(f"{self.where}: an unbatched input of shape {list(self.x.shape)}")
        self.dirs = 2 if bidirectional else 1
        per = 4 if self.biases else 2
        if len(self.params) != self.layers * self.dirs * per:
            raise Unsupported(f"{self.where}: {len(self.params)} weights for {self.layers} layers "
                              f"(an LSTM with projections is not supported)")
        self.per = per
        if self.batch_first:
            self.batch, self.steps = self.x.shape[0], self.x.shape[1]
        else:
            self.steps, self.batch = self.x.shape[0], self.x.shape[1]
        self.hidden = self.params[1].shape[1]
        self.parts: list[Lowered] = []
        self.ident = to_ident(node.name)
        table = cx.out.machine.table
        T, B, H, G = self.steps, self.batch, self.hidden, self.gates
        plan = plan_recurrence(B, H, G, self.dirs, table.sms)
        self.costs = (recurrence_ms(plan, T, B, H, G, table) if plan else None, stepped_ms(T, B, H, G, self.dirs, table))
        self.plan = plan if plan is not None and self.costs[0] < self.costs[1] else None  # type: ignore[operator]
        # a unidirectional stack: every layer in one launch, a step behind the one below (a wavefront)
        wave = plan_recurrence(B, H, G, 1, table.sms, layers=self.layers) if self.dirs == 1 and self.layers > 1 \
            else None
        self.wave = wave if wave is not None and self.plan is not None and wave.w_place == "registers" and \
            recurrence_ms(wave, T, B, H, G, table) < self.layers * self.costs[0] else None  # type: ignore[operator]
        if self.wave is not None:
            self.costs = (recurrence_ms(self.wave, T, B, H, G, table), self.costs[1] * self.layers)
        elif self.costs[0] is not None:
            self.costs = (self.costs[0] * self.layers, self.costs[1] * self.layers)

    def _buffer(self, tag: str, shape: tuple[int, ...]) -> str:
        value = f"{self.node.name}__{tag}"
        self.cx.scratch(value, shape)
        return value

    def _gemm(self, lhs: Expr, w: Expr, out: str, shape: tuple[int, ...], what: str) -> None:
        gemm = gemm_shape(self.cx, self.node, lhs, _transposed(w, self.where))
        gemm.out = self.cx.out.storage[out]
        place_product(self.cx, gemm)
        self.parts.append(Lowered(self.g, "gemm", gemm=gemm, describe=f"{self.node.op}: {what} "
                                  f"[{gemm.m} x {gemm.k}] . [{gemm.k} x {gemm.n}]"))

    def _initial(self, which: int, index: int) -> Expr:
        """h0 (``which`` 0) or c0 (1) of layer-direction ``index`` as a [batch, hidden] read."""
        h = self.hx[which]
        if h.op == "const":
            return const(h.const or 0.0)  # a zero (or constant) initial state
        if h.op != "leaf" or not h.leaf.plain or len(h.shape) != 3:  # type: ignore[union-attr]
            raise Unsupported(f"{self.where}: an initial state that is not a tensor in memory")
        lf: Leaf = h.leaf  # type: ignore[assignment]
        return leaf(lf.value, (self.batch, self.hidden), lf.strides[1:], lf.offset + index * lf.strides[0])

    def run(self) -> dict[str, Any]:
        T, B, H, G = self.steps, self.batch, self.hidden, self.gates
        states: dict[tuple[int, int], tuple[str, str | None]] = {}
        layer_in = self.x
        for layer in range(self.layers):
            rows = T * B
            if layer_in.op != "leaf":
                raise Unsupported(f"{self.where}: the layer input is computed")
            x2 = Expr("leaf", leaf=Leaf(layer_in.leaf.value, (rows, layer_in.shape[-1]),  # type: ignore[union-attr]
                                        (layer_in.shape[-1], 1), layer_in.leaf.offset),  # type: ignore[union-attr]
                      shape=(rows, layer_in.shape[-1]))
            if layer_in.leaf.strides != contiguous_strides(layer_in.shape):  # type: ignore[union-attr]
                raise Unsupported(f"{self.where}: the input sequence is a strided view")
            time_major = layer > 0 or not self.batch_first
            at = (B * G * H, G * H) if time_major else (G * H, T * G * H)  # gi's step and batch-row strides
            one_launch = self.plan is not None and all(self._plain(layer * self.dirs + d) for d in range(self.dirs))
            wave = layer == 0 and self.wave is not None and all(self._plain(i, i > 0) for i in range(self.layers))
            for d in range(self.dirs):
                index = layer * self.dirs + d
                w_ih, w_hh, *bs = self.params[index * self.per:(index + 1) * self.per]
                gi = self._buffer(f"gi{layer}_{d}", (rows, G * H))
                self._gemm(x2, w_ih, gi, (rows, G * H), f"layer {layer} direction {d}: x.W_ihᵀ for all {T} steps")
                hs = self._buffer(f"h{layer}_{d}", (T + 2, B, H))
                cs = self._buffer(f"c{layer}_{d}", (T + 2, B, H)) if self.cell == "lstm" else None
                states[(layer, d)] = (hs, cs)
                if one_launch or wave:
                    continue
                gh = self._buffer(f"gh{layer}_{d}", (B, G * H))
                for s in range(T):
                    t = s if d == 0 else T - 1 - s
                    prev = t if d == 0 else t + 2
                    h_prev = self._initial(0, index) if s == 0 else leaf(hs, (B, H), (H, 1), prev * B * H)
                    c_prev = None
                    if cs is not None:
                        c_prev = self._initial(1, index) if s == 0 else leaf(cs, (B, H), (H, 1), prev * B * H)
                    has_gh = not (h_prev.op == "const" and h_prev.const == 0.0)
                    if has_gh:
                        self._gemm(h_prev, w_hh, gh, (B, G * H), f"layer {layer} direction {d} step {s}: h.W_hhᵀ")
                    self._step(layer, d, t, gi, (t * at[0], at[1]), gh if has_gh else None, bs, h_prev, c_prev, hs, cs)
            if wave:  # every layer in one launch, each a step behind the one below
                for above in range(1, self.layers):
                    states[(above, 0)] = (self._buffer(f"h{above}_0", (T + 2, B, H)),
                                          self._buffer(f"c{above}_0", (T + 2, B, H)) if self.cell == "lstm" else None)
                self._one_launch(list(range(self.layers)), at, states, self.wave)  # type: ignore[arg-type]
                break
            if one_launch:
                self._one_launch([layer], at, states, self.plan)  # type: ignore[arg-type]
            if layer + 1 < self.layers:
                layer_in = self._sequence(states, layer, None)
        return {"states": states}

    def _plain(self, index: int, w_ih: bool = False) -> bool:
        """Whether layer-direction ``index``'s W_hh (and W_ih) and biases are dense parameters one
        launch can read."""
        H, G = self.hidden, self.gates
        first = index * self.per if w_ih else index * self.per + 1
        *ws, = self.params[first:index * self.per + 2]
        bs = self.params[index * self.per + 2:(index + 1) * self.per]
        dense = all(w.op == "leaf" and w.leaf.plain and w.shape == (G * H, H) and  # type: ignore[union-attr]
                    w.leaf.strides == (H, 1) for w in ws)  # type: ignore[union-attr]
        return dense and all(b.op == "leaf" and b.leaf.plain and b.leaf.strides == (1,) for b in bs)  # type: ignore[union-attr]

    def _pointer(self, lf: Leaf) -> Pointer:
        return self.cx.out.storage[lf.value], lf.offset

    def _one_launch(self, layers: list[int], at: tuple[int, int], states: dict, plan: RecurrencePlan) -> None:
        """Every step of both directions of ``layers`` (one, or a wavefront of all) in one
        cooperative launch (sequence_kernel.py)."""
        T, B, H, G = self.steps, self.batch, self.hidden, self.gates
        initial: dict[str, tuple[float | None, int, int]] = {"h0": (0.0, 0, 0), "c0": (0.0, 0, 0)}
        store = self.cx.out.storage
        groups: list[RecurrenceGroup] = []
        for layer, d in ((lay, d) for lay in layers for d in range(self.dirs)):
            index = layer * self.dirs + d
            w_ih, w_hh, *bs = self.params[index * self.per:(index + 1) * self.per]
            hs, cs = states[(layer, d)]
            first = layer == layers[0]
            group = RecurrenceGroup(w=self._pointer(w_hh.leaf), hs=store[hs], cs=store[cs] if cs else None,  # type: ignore[arg-type]
                                    gi=(store[f"{self.node.name}__gi{layer}_{d}"], 0) if first else None,
                                    wi=None if first else self._pointer(w_ih.leaf))  # type: ignore[arg-type]
            if bs:
                group.bi, group.bh = (self._pointer(b.leaf) for b in bs)  # type: ignore[arg-type]
            for which, key in enumerate(("h0", "c0")[:2 if self.cell == "lstm" else 1]):
                e = self._initial(which, index)
                if e.op == "const":
                    initial[key] = (e.const or 0.0, 0, 0)
                else:
                    initial[key] = (None, *e.leaf.strides)  # type: ignore[union-attr]
                    setattr(group, key, self._pointer(e.leaf))  # type: ignore[arg-type]
            groups.append(group)
        what = RecurrenceLaunch(self.cell, T, B, H, G, self.dirs, at[0], at[1], initial["h0"], initial["c0"], groups)
        sync = store[self._buffer(f"sync{layers[0]}", (len(groups),))]
        self.cx.out.ctypes[sync] = "int32_t"
        name = f"k_{self.ident}_l{layers[0]}_steps"
        source = recurrence_kernel(name, plan, self.cell, T, B, H, G, self.dirs, at[0], at[1], bool(self.biases),
                                   initial["h0"], initial["c0"], layers=len(layers))
        launch = recurrence_launch(name, plan, what, f"a.{sync}")
        span = f"layers {layers[0]}-{layers[-1]} as a wavefront" if len(layers) > 1 else f"layer {layers[0]}"
        text = (f"{self.node.op}: {span}: every step in one launch, {plan.blocks} blocks of {plan.units} units a "
                f"direction, W_hh {PLACES[plan.w_place]}")
        self.parts.append(Lowered(self.g, "kernel", call=KernelCall(kernels={BARRIER_NAME: BARRIER, name: source},
                                                                    launch=launch, describe=text),
                                  describe=text, recurrence=what))

    def _step(self, layer: int, d: int, t: int, gi: str, at: tuple[int, int], gh: str | None, bs: list[Expr],
              h_prev: Expr, c_prev: Expr | None, hs: str, cs: str | None) -> None:
        B, H, G = self.batch, self.hidden, self.gates
        start, row_stride = at
        steps: list[Step] = []
        tag = f"{self.ident}_l{layer}d{d}"

        def step(name: str, e: Expr) -> Expr:
            steps.append(Step(f"{tag}__{name}", "full", e))
            return ref(steps[-1].name, (B, H))

        def part(which: str, k: int) -> Expr:
            e: Expr | None = None
            if which == "i":
                e = leaf(gi, (B, H), (row_stride, 1), start + k * H)
            elif gh is not None:
                e = leaf(gh, (B, H), (G * H, 1), k * H)
            if bs:
                b = bs[0 if which == "i" else 1]
                lf: Leaf = b.leaf  # type: ignore[assignment]
                bias = leaf(lf.value, (H,), (lf.strides[0],), lf.offset + k * H * lf.strides[0])
                e = bias if e is None else op("add", e, bias)
            return e if e is not None else const(0.0)

        if self.cell == "lstm":
            i, f, g, o = (step(nm, op(fn, op("add", part("i", k), part("h", k)))) for k, (nm, fn) in
                          enumerate((("i", "sigmoid"), ("f", "sigmoid"), ("g", "tanh"), ("o", "sigmoid"))))
            c2 = step("c", op("add", op("mul", f, c_prev), op("mul", i, g)))  # type: ignore[arg-type]
            results = {hs: step("h", op("mul", o, op("tanh", c2))), cs: c2}
        elif self.cell == "gru":
            r = step("r", op("sigmoid", op("add", part("i", 0), part("h", 0))))
            z = step("z", op("sigmoid", op("add", part("i", 1), part("h", 1))))
            n = step("n", op("tanh", op("add", part("i", 2), op("mul", r, part("h", 2)))))
            results = {hs: step("h", op("add", op("mul", op("sub", const(1.0), z), n), op("mul", z, h_prev)))}
        else:
            pre = op("add", part("i", 0), part("h", 0))
            results = {hs: step("h", op("tanh", pre) if self.cell == "tanh" else op("relu", pre))}
        prog = Program("pointwise", (B, H), steps=steps)
        for buf, value in results.items():
            if buf is None:
                continue
            name = f"{buf}__row{t + 1}"
            self.cx.out.storage[name] = self.cx.out.storage[buf]
            prog.outputs[name] = value.ref  # type: ignore[assignment]
            prog.output_shapes[name] = (B, H)
            prog.write_offsets[name] = (t + 1) * B * H
        for s in prog.steps:
            for lf in s.expr.leaves():
                lf.effective_strides(prog.shape)
        self.parts.append(Lowered(self.g, "pointwise", program=prog,
                                  describe=f"{self.node.op}: layer {layer} direction {d} step gates"))

    def _sequence(self, states: dict, layer: int, out: str | None) -> Expr:
        """Layer ``layer``'s output sequence: a read of its state rows (one direction, time-major), or
        a copy joining both directions into ``out`` (a fresh buffer when None) in the output's layout."""
        T, B, H = self.steps, self.batch, self.hidden
        pieces = []
        for d in range(self.dirs):
            hs = states[(layer, d)][0]
            if out is not None and self.batch_first:
                pieces.append(leaf(hs, (B, T, H), (H, B * H, 1), B * H))
            else:
                pieces.append(leaf(hs, (T, B, H), (B * H, H, 1), B * H))
        if len(pieces) == 1 and out is None:
            return pieces[0]
        shape = (B, T, self.dirs * H) if out is not None and self.batch_first else (T, B, self.dirs * H)
        target = out if out is not None else self._buffer(f"y{layer}", shape)
        self._copy(target, _cat(pieces, 2, shape), shape, f"layer {layer}'s output sequence")
        return leaf(target, shape)

    def _copy(self, value: str, e: Expr, shape: tuple[int, ...], what: str) -> None:
        prog = Program("pointwise", shape, steps=[Step(f"{to_ident(value)}__out", "full", e)])
        prog.outputs[value] = f"{to_ident(value)}__out"
        prog.output_shapes[value] = shape
        for lf in e.leaves():
            lf.effective_strides(shape)
        self.parts.append(Lowered(self.g, "pointwise", program=prog, describe=f"{self.node.op}: {what}"))

    def outputs(self, states: dict, wanted: dict[int, str]) -> None:
        """Write the outputs the graph reads: 0 the sequence, 1 h_n, 2 c_n."""
        T, B, H = self.steps, self.batch, self.hidden
        for index, value in wanted.items():
            self.cx.buffer(value)
            if index == 0:
                self._sequence(states, self.layers - 1, value)
                continue
            pieces = []
            for layer in range(self.layers):
                for d in range(self.dirs):
                    buf = states[(layer, d)][index - 1]
                    row = T if d == 0 else 1
                    pieces.append(leaf(buf, (1, B, H), (B * H, H, 1), row * B * H))
            shape = (self.layers * self.dirs, B, H)
            self._copy(value, _cat(pieces, 0, shape), shape, "h_n" if index == 1 else "c_n")


@group_lowering("recurrent layer", 20, lambda g, nodes: any(n.op in SEQUENCES for n in nodes))
def lower_sequence(cx: LowerContext, g: FusionGroup, nodes: list[Node]) -> Lowered:
    """A whole recurrent layer, its zero initial states and the views before it folded in."""
    env: dict[str, Expr] = {}
    seq = [n for n in nodes if n.op in SEQUENCES]
    if len(seq) != 1:
        raise Unsupported(f"{len(seq)} recurrent layers in one group")
    node = seq[0]
    if nodes[-1] is not node:
        raise Unsupported(f"{nodes[-1].name} ({nodes[-1].op}) fused after a recurrent layer")
    fold_states_and_views(cx, nodes, node, env)
    layers = _Layers(cx, g, node, env)
    states = layers.run()["states"]
    inside = set(g.nodes)
    read = {i for n in cx.graph.nodes if n.name not in inside for i in n.inputs()} | set(cx.graph.outputs)
    wanted = {index: name for name, (src, index) in cx.graph.getitems.items() if src == node.name and name in read}
    if not wanted:
        raise Unsupported(f"{layers.where}: nothing reads its outputs")
    layers.outputs(states, wanted)
    one, stepped = layers.costs
    one_way = "all layers in one launch as a wavefront" if layers.wave else "every step of a layer in one launch"
    how = (f"{one_way} [cost model, {cx.out.machine.table.label}: {one:.3f} ms est.; "
           f"stepped {stepped:.3f}]" if layers.plan else "per step h.W_hhᵀ + fused gates" + (
               f" [cost model, {cx.out.machine.table.label}: {stepped:.3f} ms est.; one launch {one:.3f}]"
               if one is not None else ""))
    return Lowered(g, "sequence", parts=layers.parts,
                   describe=f"{node.op} {node.module}: {layers.layers} layer(s) x {layers.dirs} direction(s) x "
                            f"{layers.steps} steps, input GEMM batched over steps, {how}")
