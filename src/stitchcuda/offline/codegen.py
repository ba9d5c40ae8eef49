"""The offline Coder: (task, OpGraph, fusion groups) -> one complete candidate program.

Each fusion group is lowered to the IR of :mod:`stitchcuda.offline.expr` and then to CUDA:

- ``gemm`` (anchor ``aten.linear`` / ``mm`` / ``matmul`` / ``bmm`` / ``addmm``): a true-fp32
  ``cublasSgemm`` / ``cublasSgemmStridedBatched`` (``CUBLAS_DEFAULT_MATH``, no TF32) with the
  row-major trick (C^T = B^T A^T), then one fused epilogue kernel for bias + the epilogue chain
  (skipped when there is neither);
- ``elementwise`` / ``data_movement``: one pointwise kernel evaluating the fused expression
  (broadcasts, views and transposes are index arithmetic; a float4 path when the shapes allow
  it and the pointers are aligned); a group that only reshapes a contiguous buffer is an alias;
- ``row_reduce``: one row kernel (a warp per row for short rows, a block per row otherwise) that
  keeps the row in registers, reduces with warp shuffles in fp32 (two-pass variance) and
  applies the absorbed prologue and epilogue.

The host code (``templates/program.cu.j2``) checks the arguments, allocates intermediates once
and caches them, launches everything in graph order on the caller's stream and, with
``CodegenOptions.graph``, replays a CUDA graph: see the template's header comment for how
inputs and outputs stay fresh. Python's ``forward`` only calls the entry point.
"""

from __future__ import annotations

import ast
import hashlib
import keyword
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from stitchcuda.offline.expr import (
    ROW_OPS,
    VIEWS,
    Expr,
    Leaf,
    Program,
    Step,
    Unsupported,
    broadcast,
    c_float,
    contiguous_strides,
    is_pointwise,
    leaf,
    numel,
    pointwise_expr,
    ref,
    row_scalar_leaf,
    row_steps,
    view_expr,
)
from stitchcuda.offline.fusion import FusionGroup
from stitchcuda.offline.graph import Node, OpGraph
from stitchcuda.task.record import Task

__all__ = ["CodegenOptions", "Unsupported", "generate", "lower", "supported", "split_cuda"]

TEMPLATES = Path(__file__).parent / "templates"
GEMM_OPS = {"aten.linear", "aten.mm", "aten.matmul", "aten.bmm", "aten.addmm"}
ENTRY_MARK = "// ---- stitchcuda entry point ----"
MAX_ROW = 32768


class CodegenOptions(BaseModel):
    """Variants the tuner can try."""

    graph: bool = Field(True, description="replay the forward from a CUDA graph (captured per argument pointers)")
    vector_width: int = Field(4, description="elements per thread in pointwise kernels: 1 or 4 (float4)")
    block: int = Field(256, description="threads per block (a multiple of 32, at most 1024)")


# ----------------------------------------------------------------------------- lowered records

@dataclass
class Gemm:
    batch: int
    m: int
    n: int
    k: int
    a: str  # buffer identifiers: row-major A [M, K] (or its transpose), B [K, N] (or its transpose)
    b: str
    a_trans: bool  # A is stored as A^T contiguous
    b_trans: bool  # B is stored as B^T contiguous (linear's weight)
    out: str  # identifier of the buffer the GEMM writes
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0


@dataclass
class Lowered:
    group: FusionGroup
    kind: Literal["gemm", "pointwise", "row", "alias"]
    program: Program | None = None
    gemm: Gemm | None = None
    describe: str = ""


@dataclass
class Lowering:
    """Everything ``generate`` renders: buffers, lowered groups in launch order."""

    graph: OpGraph
    args: list[tuple[str, str, list[int]]] = field(default_factory=list)  # (value, identifier, shape): entry args
    intermediates: list[tuple[str, list[int]]] = field(default_factory=list)  # (identifier, shape)
    outputs: list[tuple[str, str, list[int]]] = field(default_factory=list)  # (value, identifier, shape)
    storage: dict[str, str] = field(default_factory=dict)  # graph value -> buffer identifier
    groups: list[Lowered] = field(default_factory=list)
    uses_blas: bool = False


# ----------------------------------------------------------------------------- lowering

def _ident(name: str) -> str:
    text = re.sub(r"\W", "_", name)
    return text if text and not text[0].isdigit() else "v_" + text


def _group_order(graph: OpGraph, groups: list[FusionGroup]) -> tuple[list[FusionGroup], dict[str, int]]:
    """Groups in a dependency order (stable), and node -> group id; raises on nodes in no group."""
    owner: dict[str, int] = {}
    for g in groups:
        for n in g.nodes:
            if n in owner:
                raise Unsupported(f"node {n} is in two fusion groups ({owner[n]} and {g.id})")
            owner[n] = g.id
    missing = [n.name for n in graph.nodes if n.name not in owner]
    if missing:
        raise Unsupported(f"nodes in no fusion group: {', '.join(missing[:8])}")
    deps: dict[int, set[int]] = {g.id: set() for g in groups}
    for n in graph.nodes:
        for i in n.inputs():
            src = graph.getitems.get(i, (i, 0))[0]
            if src in owner and owner[src] != owner[n.name]:
                deps[owner[n.name]].add(owner[src])
    done: set[int] = set()
    order: list[FusionGroup] = []
    pending = list(groups)
    while pending:
        ready = [g for g in pending if deps[g.id] <= done]
        if not ready:
            raise Unsupported("the fusion groups depend on each other in a cycle")
        order.append(ready[0])
        done.add(ready[0].id)
        pending.remove(ready[0])
    return order, owner


class _Lowerer:
    def __init__(self, graph: OpGraph, groups: list[FusionGroup], options: CodegenOptions):
        self.graph, self.options = graph, options
        self.nodes = {n.name: n for n in graph.nodes}
        self.out = Lowering(graph=graph)
        self.users = graph.users()
        self.problems: list[str] = []
        self.order, self.owner = _group_order(graph, groups)
        self._check_placeholders()

    # values -----------------------------------------------------------------
    def _check_placeholders(self) -> None:
        for p in self.graph.placeholders:
            if p.kind == "constant":
                raise Unsupported(f"lifted tensor constant {p.name}: the generated module cannot recreate it")
            if p.meta is None:
                raise Unsupported(f"forward argument {p.name} is not a tensor")
            if p.meta.dtype != "float32":
                raise Unsupported(f"{p.kind} {p.name} has dtype {p.meta.dtype}; only float32 is supported")
            self.out.args.append((p.name, _ident(p.name), list(p.meta.shape)))
            self.out.storage[p.name] = _ident(p.name)
        for n in self.graph.nodes:
            if len(n.out) != 1:
                raise Unsupported(f"{n.name} ({n.op}) has {len(n.out)} outputs; only single-output operators are "
                                  "supported")
            if n.out[0].dtype != "float32":
                raise Unsupported(f"{n.name} ({n.op}) computes {n.out[0].dtype}; only float32 is supported")
        for name in self.graph.getitems:
            raise Unsupported(f"multi-output operator read through {name}")
        for o in self.graph.outputs:
            if o not in self.nodes:
                raise Unsupported(f"the forward returns {o}, an argument, not a computed value")

    def shape(self, value: str) -> tuple[int, ...]:
        meta = self.graph.meta(value)
        if meta is None:
            raise Unsupported(f"{value} has no tensor shape")
        return tuple(meta.shape)

    def _outputs_of(self, group: FusionGroup) -> list[str]:
        inside = set(group.nodes)
        outs = []
        for n in group.nodes:
            if n in self.graph.outputs or any(u not in inside for u in self.users.get(n, [])):
                outs.append(n)
        return outs

    def _buffer(self, value: str) -> str:
        """Give a group output its buffer: a fresh output tensor or a cached intermediate."""
        if value in self.out.storage:
            return self.out.storage[value]
        ident = ("o_" if value in self.graph.outputs else "b_") + _ident(value)
        taken = set(self.out.storage.values())
        while ident in taken:
            ident += "_"
        self.out.storage[value] = ident
        if value in self.graph.outputs:
            self.out.outputs.append((value, ident, list(self.shape(value))))
        else:
            self.out.intermediates.append((ident, list(self.shape(value))))
        return ident

    def _arg(self, env: dict[str, Expr], where: str):
        def resolve(a: Any) -> Expr:
            if isinstance(a, str) and a.startswith("%"):
                name = a[1:]
                if name in env:
                    return env[name]
                if name not in self.out.storage:
                    raise Unsupported(f"{where}: {name} is read before it is computed")
                return leaf(name, self.shape(name))
            if isinstance(a, bool) or not isinstance(a, (int, float)):
                raise Unsupported(f"{where}: unsupported operand {a!r}")
            return Expr("const", const=float(a))
        return resolve

    # groups -----------------------------------------------------------------
    def lower(self) -> Lowering:
        for g in self.order:
            try:
                self.out.groups.append(self._lower_group(g))
            except Unsupported as exc:
                ops = ", ".join(dict.fromkeys(self.nodes[n].op for n in g.nodes))
                self.problems.append(f"group {g.id} ({g.kind}: {ops}): {exc}")
                for v in self._outputs_of(g):  # keep going so that every problem is listed
                    self._buffer(v)
        return self.out

    def _lower_group(self, g: FusionGroup) -> Lowered:
        nodes = [self.nodes[n] for n in g.nodes]
        for n in nodes:
            if not (n.op in GEMM_OPS or n.op in ROW_OPS or n.op in VIEWS or is_pointwise(n.op)):
                raise Unsupported(f"{n.name}: operator {n.op}.{n.overload} is not supported by the offline Coder")
        gemms = [n for n in nodes if n.op in GEMM_OPS]
        if gemms:
            return self._lower_gemm(g, nodes, gemms)
        if any(n.op in ROW_OPS for n in nodes):
            return self._lower_row(g, nodes)
        return self._lower_pointwise(g, nodes)

    def _lower_pointwise(self, g: FusionGroup, nodes: list[Node], env: dict[str, Expr] | None = None,
                         program: Program | None = None) -> Lowered:
        env = dict(env or {})
        steps = program.steps if program else []
        for n in nodes:
            arg = self._arg(env, f"{n.name} ({n.op})")
            if n.op in VIEWS:
                env[n.name] = view_expr(n, arg(n.args[0]))
            else:
                e = pointwise_expr(n, arg)
                if e.op in ("leaf", "ref", "const"):
                    env[n.name] = e
                else:
                    steps.append(Step(_ident(n.name), "full", e))
                    env[n.name] = ref(_ident(n.name), self.shape(n.name))
        outs = self._outputs_of(g)
        if not outs:
            raise Unsupported("the group produces nothing that is used")
        shapes = {self.shape(v) for v in outs}
        if len(shapes) != 1:
            raise Unsupported(f"outputs of different shapes {sorted(map(list, shapes))}")
        shape = shapes.pop()
        if program is None and len(outs) == 1 and not steps:
            e = env[outs[0]]
            if e.op == "leaf" and e.leaf.contiguous and outs[0] not in self.graph.outputs:  # type: ignore[union-attr]
                self.out.storage[outs[0]] = self.out.storage[e.leaf.value]  # type: ignore[union-attr]
                return Lowered(g, "alias", describe=f"{outs[0]} is a view of {e.leaf.value}")  # type: ignore[union-attr]
        prog = program or Program("pointwise", shape)
        prog.steps = steps
        for v in outs:
            e = env[v]
            if e.op != "ref":
                steps.append(Step(_ident(v) + "__out", "full", e))
                e = ref(_ident(v) + "__out", self.shape(v))
            prog.outputs[v] = e.ref
            prog.output_shapes[v] = self.shape(v)
            self._buffer(v)
        for s in prog.steps:
            broadcast(s.expr.shape, shape)
            for lf in s.expr.leaves():
                lf.effective_strides(shape)
        return Lowered(g, "pointwise", program=prog, describe=f"pointwise over {list(shape)}")

    def _lower_gemm(self, g: FusionGroup, nodes: list[Node], gemms: list[Node]) -> Lowered:
        if len(gemms) != 1:
            raise Unsupported(f"{len(gemms)} matrix products in one group")
        anchor = gemms[0]
        where = f"{anchor.name} ({anchor.op})"
        env: dict[str, Expr] = {}
        before = nodes[:nodes.index(anchor)]
        for n in before:
            if n.op not in VIEWS:
                raise Unsupported(f"{n.name} ({n.op}) before the matrix product (only views may feed it)")
            env[n.name] = view_expr(n, self._arg(env, n.name)(n.args[0]))
        arg = self._arg(env, where)
        a = anchor.args
        bias: Expr | None = None
        if anchor.op == "aten.linear":
            x, w = arg(a[0]), arg(a[1])
            bias = arg(a[2]) if len(a) > 2 and a[2] is not None else None
            if len(w.shape) != 2:
                raise Unsupported(f"{where}: weight of shape {list(w.shape)}")
            wt = Leaf(w.leaf.value, (w.shape[1], w.shape[0]), (w.leaf.strides[1], w.leaf.strides[0]))  # type: ignore[union-attr]
            lhs, rhs = x, Expr("leaf", leaf=wt, shape=wt.shape)
        elif anchor.op == "aten.addmm":
            beta, alpha = anchor.kwargs.get("beta", 1), anchor.kwargs.get("alpha", 1)
            if beta != 1 or alpha != 1:
                raise Unsupported(f"{where}: addmm with alpha/beta")
            bias, lhs, rhs = arg(a[0]), arg(a[1]), arg(a[2])
        else:
            lhs, rhs = arg(a[0]), arg(a[1])
        gemm = self._gemm_shape(anchor, lhs, rhs)
        out_shape = self.shape(anchor.name)
        epilogue = nodes[nodes.index(anchor) + 1:]
        outs = self._outputs_of(g)
        needs_kernel = bias is not None or bool(epilogue)
        if not needs_kernel:
            gemm.out = self._buffer(anchor.name)
            return Lowered(g, "gemm", gemm=gemm, describe=self._describe_gemm(anchor, gemm))
        # the GEMM writes into a group output of its shape and the epilogue runs in place there
        raw_target = next((v for v in outs if self.shape(v) == out_shape), None)
        if raw_target is None:
            raw = f"b_{_ident(anchor.name)}__raw"
            self.out.intermediates.append((raw, list(out_shape)))
        else:
            raw = self._buffer(raw_target)
        gemm.out = raw
        raw_value = f"{anchor.name}__raw"
        self.out.storage[raw_value] = raw
        value = leaf(raw_value, out_shape)
        steps: list[Step] = []
        if bias is not None:
            steps.append(Step(_ident(anchor.name), "full", Expr("add", (value, bias), shape=broadcast(value.shape,
                                                                                                     bias.shape))))
            env[anchor.name] = ref(_ident(anchor.name), out_shape)
        else:
            env[anchor.name] = value
        program = Program("pointwise", out_shape, steps=steps)
        low = self._lower_pointwise(g, epilogue, env, program)
        low.kind, low.gemm = "gemm", gemm
        low.describe = self._describe_gemm(anchor, gemm) + " + epilogue " + (
            ", ".join(([f"bias {bias.leaf.value}"] if bias is not None and bias.leaf else [])  # type: ignore[union-attr]
                      + [f"{n.op}" for n in epilogue]) or "copy")
        return low

    def _describe_gemm(self, anchor: Node, gemm: Gemm) -> str:
        return (f"{anchor.op} {anchor.module or anchor.name}: {gemm.batch} x [{gemm.m} x {gemm.k}] . "
                f"[{gemm.k} x {gemm.n}] via cublasSgemm{'StridedBatched' if gemm.batch > 1 else ''}")

    def _operand(self, e: Expr, where: str, what: str) -> tuple[str, tuple[int, ...], bool]:
        """(buffer, logical shape, stored transposed) for a GEMM operand read."""
        if e.op != "leaf":
            raise Unsupported(f"{where}: {what} operand is computed inside the group")
        lf: Leaf = e.leaf  # type: ignore[assignment]
        buf = self.out.storage[lf.value] + (f" + {lf.offset}" if lf.offset else "")
        if lf.strides == contiguous_strides(lf.shape):
            return buf, lf.shape, False
        if len(lf.shape) >= 2:
            swapped = lf.shape[:-2] + (lf.shape[-1], lf.shape[-2])
            st = lf.strides[:-2] + (lf.strides[-1], lf.strides[-2])
            if st == contiguous_strides(swapped):
                return buf, lf.shape, True
        raise Unsupported(f"{where}: {what} operand {lf.value} is a strided view "
                          f"(shape {list(lf.shape)}, strides {list(lf.strides)})")

    def _gemm_shape(self, anchor: Node, lhs: Expr, rhs: Expr) -> Gemm:
        where = f"{anchor.name} ({anchor.op})"
        a_buf, a_shape, a_t = self._operand(lhs, where, "left")
        b_buf, b_shape, b_t = self._operand(rhs, where, "right")
        if len(a_shape) < 1 or len(b_shape) != 2 and len(b_shape) != 3:
            raise Unsupported(f"{where}: operand shapes {list(a_shape)} and {list(b_shape)}")
        k, n = b_shape[-2], b_shape[-1]
        if a_shape[-1] != k:
            raise Unsupported(f"{where}: inner sizes {a_shape[-1]} and {k} differ")
        if len(b_shape) == 2:
            if a_t and len(a_shape) == 3:  # per-batch transposed rows (a transposed activation): batched, B shared
                batch, m = a_shape[0], a_shape[1]
                return Gemm(batch, m, n, k, a_buf, b_buf, a_t, b_t, out="", stride_a=m * k, stride_b=0,
                            stride_c=m * n)
            if a_t and len(a_shape) > 3:
                raise Unsupported(f"{where}: transposed left operand of rank {len(a_shape)}")
            m = numel(a_shape[:-1])
            return Gemm(1, m, n, k, a_buf, b_buf, a_t, b_t, out="")
        if len(a_shape) != 3 or a_shape[0] != b_shape[0]:
            raise Unsupported(f"{where}: batched product of shapes {list(a_shape)} and {list(b_shape)}")
        batch, m = a_shape[0], a_shape[1]
        return Gemm(batch, m, n, k, a_buf, b_buf, a_t, b_t, out="", stride_a=m * k, stride_b=k * n, stride_c=m * n)

    def _lower_row(self, g: FusionGroup, nodes: list[Node]) -> Lowered:
        shape = max([self.shape(n.name) for n in nodes] + [self.shape(n.args[0][1:]) for n in nodes if n.op in ROW_OPS
                     and isinstance(n.args[0], str) and n.args[0].startswith("%")], key=numel)
        if not shape:
            raise Unsupported("a row reduction over a 0-d value")
        n_col = shape[-1]
        if n_col > MAX_ROW:
            raise Unsupported(f"rows of {n_col} elements (at most {MAX_ROW})")
        env: dict[str, Expr] = {}
        kinds: dict[str, str] = {}
        prog = Program("row", shape)

        def kind_of(e: Expr) -> str:
            if any(not row_scalar_leaf(lf, shape) for lf in e.leaves()):
                return "full"
            return "full" if any(kinds[r] == "full" for r in e.refs()) else "scalar"

        for n in nodes:
            arg = self._arg(env, f"{n.name} ({n.op})")
            out = self.shape(n.name)
            if n.op in VIEWS:
                env[n.name] = view_expr(n, arg(n.args[0]))
                continue
            if n.op in ROW_OPS:
                steps = row_steps(n, arg, shape)
                for s in steps:
                    s.name = _ident(s.name)
                    kinds[s.name] = "scalar" if s.kind in ("scalar", "reduce") else "full"
                prog.steps += steps
                env[n.name] = ref(steps[-1].name, out)
                continue
            e = pointwise_expr(n, arg)
            if e.op in ("leaf", "ref", "const"):
                env[n.name] = e
                continue
            kind = kind_of(e)
            if kind == "scalar" and out[-1:] not in ((1,), ()) and n_col > 1:
                raise Unsupported(f"{n.name}: shape {list(out)} neither a row nor a per-row value")
            name = _ident(n.name)
            prog.steps.append(Step(name, kind, e))  # type: ignore[arg-type]
            kinds[name] = kind
            env[n.name] = ref(name, out)
        for s in prog.steps:
            if s.kind == "reduce" and kind_of(s.expr) != "full":
                raise Unsupported(f"{s.name}: reduction of a per-row value")
        outs = self._outputs_of(g)
        for v in outs:
            e = env[v]
            if e.op != "ref":
                name = _ident(v) + "__out"
                kinds[name] = kind_of(e)
                prog.steps.append(Step(name, kinds[name], e))  # type: ignore[arg-type]
                e = ref(name, self.shape(v))
            vs = self.shape(v)
            if kinds[e.ref] == "full" and vs != shape:
                raise Unsupported(f"output {v} of shape {list(vs)} is not the row shape {list(shape)}")
            if kinds[e.ref] == "scalar" and numel(vs) != numel(shape) // n_col:
                raise Unsupported(f"output {v} of shape {list(vs)} is not one value per row")
            prog.outputs[v] = e.ref
            prog.output_shapes[v] = vs
            self._buffer(v)
        for s in prog.steps:
            for lf in s.expr.leaves():
                lf.effective_strides(shape)
        return Lowered(g, "row", program=prog, describe=f"row kernel over {numel(shape) // n_col} rows of {n_col}")


def lower(graph: OpGraph, groups: list[FusionGroup], options: CodegenOptions | None = None) -> Lowering:
    """Lower every group, raising :class:`Unsupported` with all the problems found."""
    lowerer = _Lowerer(graph, groups, options or CodegenOptions())
    low = lowerer.lower()
    if lowerer.problems:
        raise Unsupported("; ".join(lowerer.problems))
    low.uses_blas = any(g.gemm is not None for g in low.groups)
    return low


def supported(graph: OpGraph, groups: list[FusionGroup]) -> list[str]:
    """The reasons the offline Coder cannot generate this graph (empty when it can)."""
    try:
        lowerer = _Lowerer(graph, groups, CodegenOptions())
    except Unsupported as exc:
        return [str(exc)]
    lowerer.lower()
    return lowerer.problems


# ----------------------------------------------------------------------------- CUDA emission

def _offset(eff: tuple[int, ...], shape: tuple[int, ...], idx: str, base: int = 0) -> str:
    """C expression of the element offset of a read with effective strides ``eff`` at linear
    index ``idx`` of ``shape`` (dims merged where the read is contiguous or broadcast)."""
    dims: list[list[int]] = []
    for d, s in zip(shape, eff, strict=True):
        if d == 1:
            continue
        if dims and ((dims[-1][1] == s * d and s != 0) or (dims[-1][1] == 0 and s == 0)):
            dims[-1] = [dims[-1][0] * d, s]
        else:
            dims.append([d, s])
    terms, inner = [], 1
    for k in reversed(range(len(dims))):
        size, stride = dims[k]
        if stride:
            t = idx if inner == 1 else f"({idx} / {inner})"
            if k > 0:
                t = f"({t} % {size})"
            terms.append(t if stride == 1 else f"{t} * {stride}")
        inner *= size
    terms = list(reversed(terms)) + ([str(base)] if base else [])
    return " + ".join(terms) or "0"


def _code(e: Expr, leafs: dict[Leaf, str], refs: dict[str, str]) -> str:
    if e.op == "leaf":
        return leafs[e.leaf]  # type: ignore[index]
    if e.op == "const":
        return c_float(e.const)
    if e.op == "ref":
        return refs[e.ref]
    from stitchcuda.offline.expr import OPS

    return OPS[e.op][0].format(*(_code(a, leafs, refs) for a in e.args))


@dataclass
class _Kernel:
    source: str
    launch: str
    params: list[str]


def _params(prog: Program, low: Lowering, writes: list[str]) -> tuple[list[str], list[str]]:
    """Kernel parameter declarations and the matching launch arguments (``a.<buffer>``)."""
    reads = list(dict.fromkeys(low.storage[lf.value] for lf in prog.leaves()))
    decls, args = [], []
    for b in reads:
        if b in writes:
            continue
        decls.append(f"const float* __restrict__ {b}")
        args.append(f"a.{b}")
    for b in writes:
        decls.append(f"float* {b}" if b in reads else f"float* __restrict__ {b}")
        args.append(f"a.{b}")
    return decls, args


class _Emitter:
    def __init__(self, low: Lowering, options: CodegenOptions, prefix: str):
        from jinja2 import Environment, FileSystemLoader, StrictUndefined

        self.low, self.options, self.prefix = low, options, prefix
        self.env = Environment(loader=FileSystemLoader(str(TEMPLATES)), undefined=StrictUndefined,
                               trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
        if options.block % 32 or not 32 <= options.block <= 1024:
            raise Unsupported(f"block size {options.block}: must be a multiple of 32 in [32, 1024]")
        if options.vector_width not in (1, 4):
            raise Unsupported(f"vector width {options.vector_width}: must be 1 or 4")

    def pointwise(self, gid: int, prog: Program) -> _Kernel:
        low, block = self.low, self.options.block
        shape = prog.shape
        total = numel(shape)
        writes = list(dict.fromkeys(low.storage[v] for v in prog.outputs))
        decls, args = _params(prog, low, writes)
        idx_t = "int" if total < 2**31 - 8 else "long long"
        leaves = prog.leaves()
        leaf_vars = {lf: f"l{i}" for i, lf in enumerate(leaves)}
        refs = {s.name: f"t_{s.name}" for s in prog.steps}
        loads = [(leaf_vars[lf], low.storage[lf.value], _offset(lf.effective_strides(shape), shape, "i", lf.offset),
                  lf.offset == 0 and lf.effective_strides(shape) == contiguous_strides(shape)) for lf in leaves]
        steps = [(refs[s.name], _code(s.expr, leaf_vars, refs)) for s in prog.steps]
        stores = [(low.storage[v], refs[s]) for v, s in prog.outputs.items()]
        vec = self.options.vector_width == 4 and total % 4 == 0 and total >= 4
        name = f"{self.prefix}_g{gid}_pointwise"
        source = self.env.get_template("pointwise.cu.j2").render(
            name=name, block=block, decls=decls, idx_t=idx_t, total=total, loads=loads, steps=steps,
            stores=stores, vec=vec)
        pointers = list(dict.fromkeys([a for a in args]))
        launch = self.env.get_template("launch_pointwise.cu.j2").render(
            name=name, block=block, total=total, args=args, vec=vec, pointers=pointers)
        return _Kernel(source, launch, decls)

    def row(self, gid: int, prog: Program) -> _Kernel:
        low = self.low
        shape = prog.shape
        n = shape[-1]
        rows = numel(shape) // n
        if n <= 256:
            team, block = 32, self.options.block
        else:
            block = self.options.block
            while -(-n // block) > 16 and block < 1024:
                block *= 2
            team = block
        per = -(-n // team)
        if per > 64:
            raise Unsupported(f"rows of {n} elements need {per} values per thread")
        writes = list(dict.fromkeys(low.storage[v] for v in prog.outputs))
        decls, args = _params(prog, low, writes)
        lead = shape[:-1]
        leaves = prog.leaves()
        loads = []
        leaf_full: dict[Leaf, str] = {}
        leaf_row: dict[Leaf, str] = {}
        for i, lf in enumerate(leaves):
            eff = lf.effective_strides(shape)
            base = _offset(eff[:-1], lead, "row", lf.offset)
            col = "" if eff[-1] == 0 else ("c" if eff[-1] == 1 else f"c * {eff[-1]}")
            off = " + ".join(t for t in (base if base != "0" else "", col) if t) or "0"
            scalar = row_scalar_leaf(lf, shape)
            loads.append((f"l{i}", low.storage[lf.value], off, scalar))
            (leaf_row if scalar else leaf_full)[lf] = f"l{i}" if scalar else f"l{i}[j]"
        kinds = {s.name: s.kind for s in prog.steps}
        refs = {s: (f"v_{s}[j]" if k == "full" else f"s_{s}") for s, k in kinds.items()}
        body = []
        for s in prog.steps:
            code = _code(s.expr, {**leaf_full, **leaf_row}, refs)
            body.append((s.kind, s.name, code, s.reduce))
        stores = [(low.storage[v], prog.step(s).name, kinds[s]) for v, s in prog.outputs.items()]
        name = f"{self.prefix}_g{gid}_row"
        source = self.env.get_template("row.cu.j2").render(
            name=name, block=block, team=team, n=n, per=per, guard=n % team != 0, decls=decls, loads=loads,
            body=body, stores=stores, rows=rows)
        launch = (f"{name}<<<{-(-rows // (block // team))}, {block}, 0, stream>>>({', '.join(args)});\n"
                  "SC_CUDA_CHECK(cudaGetLastError());")
        return _Kernel(source, launch, decls)

    def gemm(self, g: Gemm) -> str:
        # Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T = B^T A^T: cuBLAS's first operand
        # is B (as B^T, [N x K]), its second A (as A^T, [K x M]), ldc = N.
        op_b, ld_b = ("CUBLAS_OP_T", g.k) if g.b_trans else ("CUBLAS_OP_N", g.n)
        op_a, ld_a = ("CUBLAS_OP_T", g.m) if g.a_trans else ("CUBLAS_OP_N", g.k)
        if g.batch == 1:
            return (f"SC_CUBLAS_CHECK(cublasSgemm(blas, {op_b}, {op_a}, {g.n}, {g.m}, {g.k}, &kOne, a.{g.b}, {ld_b}, "
                    f"a.{g.a}, {ld_a}, &kZero, a.{g.out}, {g.n}));")
        return (f"SC_CUBLAS_CHECK(cublasSgemmStridedBatched(blas, {op_b}, {op_a}, {g.n}, {g.m}, {g.k}, &kOne, "
                f"a.{g.b}, {ld_b}, {g.stride_b}LL, a.{g.a}, {ld_a}, {g.stride_a}LL, &kZero, a.{g.out}, {g.n}, "
                f"{g.stride_c}LL, {g.batch}));")


def split_cuda(cuda_src: str) -> tuple[str, str]:
    """(everything before the entry point, the entry point): the tests compile several programs'
    bodies in one translation unit (their namespaces differ), without their ``forward``."""
    head, _, entry = cuda_src.partition(ENTRY_MARK)
    return head, entry


def _signature(task: Task, method: str) -> ast.arguments | None:
    try:
        tree = ast.parse(task.source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    args = item.args
                    for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
                        if a is not None:
                            a.annotation = None
                    args.defaults = [d if isinstance(d, ast.Constant) else ast.Constant(None) for d in args.defaults]
                    args.kw_defaults = [d if d is None or isinstance(d, ast.Constant) else ast.Constant(None)
                                        for d in args.kw_defaults]
                    return args
    return None


def _access(key: str, kind: str) -> str:
    parts = key.split(".")
    if all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        return "self." + key
    return f"self.get_{'parameter' if kind == 'parameter' else 'buffer'}({key!r})"


def _module_lines(graph: OpGraph) -> list[str]:
    """__init__ statements that rebuild the reference's parameter and buffer tree (same
    state_dict keys and shapes, so the reference's weights load into it)."""
    lines, made = [], {""}
    for p in graph.placeholders:
        if p.kind not in ("parameter", "buffer"):
            continue
        *path, leaf_name = p.target.split(".")
        for i in range(len(path)):
            sub = ".".join(path[: i + 1])
            if sub not in made:
                parent = ".".join(path[:i])
                owner = f"self.get_submodule({parent!r})" if parent else "self"
                lines.append(f"{owner}.add_module({path[i]!r}, nn.Module())")
                made.add(sub)
        owner = f"self.get_submodule({'.'.join(path)!r})" if path else "self"
        shape = ", ".join(str(d) for d in p.meta.shape)  # type: ignore[union-attr]
        if p.kind == "parameter":
            lines.append(f"{owner}.register_parameter({leaf_name!r}, nn.Parameter(torch.zeros({shape})))")
        else:
            lines.append(f"{owner}.register_buffer({leaf_name!r}, torch.zeros({shape}))")
    return lines


def generate(task: Task, graph: OpGraph, groups: list[FusionGroup], options: CodegenOptions | None = None) -> str:
    """The candidate program (Python source) for ``task``; raises :class:`Unsupported` saying why not."""
    options = options or CodegenOptions()
    low = lower(graph, groups, options)
    digest = hashlib.sha256((graph.model_dump_json() + options.model_dump_json()).encode()).hexdigest()[:12]
    prefix = f"sc{digest}"
    emitter = _Emitter(low, options, prefix)
    kernels, launches = [], []
    for lg in low.groups:
        head = f"// group {lg.group.id} ({lg.group.kind}): {lg.describe}"
        if lg.kind == "alias":
            launches.append(head + " -- no launch")
            continue
        text = [head]
        if lg.gemm is not None:
            text.append(emitter.gemm(lg.gemm))
        if lg.program is not None and (lg.kind != "gemm" or lg.program.steps):
            k = emitter.row(lg.group.id, lg.program) if lg.kind == "row" else emitter.pointwise(lg.group.id,
                                                                                               lg.program)
            kernels.append(k.source)
            text.append(k.launch)
        launches.append("\n".join(text))
    inputs = [(v, i, s) for v, i, s in low.args]
    low.outputs.sort(key=lambda o: graph.outputs.index(o[0]))
    cuda_src = emitter.env.get_template("program.cu.j2").render(
        ns=prefix, task=task.name, options=options.model_dump(), blas=low.uses_blas, kernels=kernels,
        launches=launches, args=inputs, intermediates=low.intermediates, outputs=low.outputs,
        entry_mark=ENTRY_MARK, prelude=emitter.env.get_template("prelude.cu.j2").render())
    ret = "torch::Tensor" if len(low.outputs) == 1 else "std::vector<torch::Tensor>"
    cpp_src = ("#include <torch/extension.h>\n#include <vector>\n"
               f"{ret} forward({', '.join(f'torch::Tensor {i}' for _, i, _ in inputs)});\n")
    name = "stitchcuda_offline_" + hashlib.sha256((cuda_src + cpp_src).encode()).hexdigest()[:16]
    init_args = _signature(task, "__init__")
    fwd_args = _signature(task, "forward")
    entry_inputs = [p for p in graph.placeholders if p.kind == "input"]
    fwd_names = [a.arg for a in fwd_args.args[1:]] if fwd_args is not None and not fwd_args.vararg else []
    if len(fwd_names) != len(entry_inputs) or any(x in ("self", "_ext", "torch", "nn") for x in fwd_names):
        fwd_names = [_ident(p.name) for p in entry_inputs]
    by_name = dict(zip((p.name for p in entry_inputs), fwd_names, strict=True))
    call_args = []
    for p in graph.placeholders:
        call_args.append(f"{by_name[p.name]}.contiguous()" if p.kind == "input" else _access(p.target, p.kind))
    if "'''" in cuda_src:
        raise Unsupported("generated CUDA contains a triple quote")
    return emitter.env.get_template("module.py.j2").render(
        task=task.name, options=options.model_dump(), name=name, cuda_src=cuda_src, cpp_src=cpp_src,
        blas=low.uses_blas, init_args=ast.unparse(init_args) if init_args is not None else "self, *args, **kwargs",
        fwd_args=", ".join(["self", *fwd_names]), init_lines=_module_lines(graph), call_args=call_args,
        multi=len(low.outputs) > 1, groups=[f"group {lg.group.id} ({lg.group.kind}): {lg.describe}"
                                            for lg in low.groups])
