"""The offline Coder: (task, OpGraph, fusion groups) -> one complete candidate program.

Each fusion group is lowered to the IR of :mod:`stitchcuda.compiler.expr` and then to CUDA:

- ``gemm`` (anchor ``aten.linear`` / ``mm`` / ``matmul`` / ``bmm`` / ``addmm``): a true-fp32
  ``cublasSgemm`` / ``cublasSgemmStridedBatched`` (``CUBLAS_DEFAULT_MATH``, no TF32) with the
  row-major trick (C^T = B^T A^T), then one fused epilogue kernel for bias + the epilogue chain
  (skipped when there is neither);
- ``elementwise`` / ``data_movement``: one pointwise kernel evaluating the fused expression
  (broadcasts, views and transposes are index arithmetic; a float4 path when the shapes allow
  it and the pointers are aligned); a group that only reshapes a contiguous buffer is an alias;
  ``cat`` / ``stack`` are index arithmetic in that kernel (each piece read only over its range of the
  output), ``embedding`` / ``gather`` / ``index.Tensor`` are reads at ``index * stride`` from int64
  index buffers, bounds-checked (an index out of range gives NaN, never a stray read);
- ``row_reduce``: one row kernel (a warp per row for short rows, a block per row otherwise) that
  keeps the row in registers, reduces with warp shuffles in fp32 (two-pass variance) and
  applies the absorbed prologue and epilogue; a ``gather`` of one element per row from a row it
  computes (log_softmax -> gather -> neg) is a pick-by-column reduction in the same kernel;
- ``attention`` (explicit Q.K^T -> scale/mask -> softmax -> P.V): Q.K^T as a strided-batched SGEMM
  over the projection's buffer (split/reshape/transpose views become leading dimensions and batch
  strides; batch dims that do not fold are a host loop of calls) into a scores buffer, one row
  kernel in place over it (a bool mask read by index as 0/1), and P.V as a strided-batched SGEMM
  written straight into the layout of the views after it;
- ``recurrent`` (``aten.lstm_cell`` / ``aten.gru_cell``, one time step): x.W_ih^T and h.W_hh^T as
  SGEMMs into gate buffers (the second skipped for a zero initial state), then one pointwise gate
  kernel writing h' (and c').

Placeholders no node reads are not entry arguments; non-float32 ones (bool masks) are passed with
their own element type and may only feed mask operators. Non-persistent buffers are recreated in
``ModelNew.__init__`` from the reference's values (a fill, a triangle of ones, a short literal).

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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

from stitchcuda.compiler.expr import (
    COMPARISONS,
    DATA_OPS,
    GATHER_OPS,
    IDENTITY,
    MASK_OPS,
    POOL_OPS,
    ROW_OPS,
    VIEWS,
    Expr,
    Leaf,
    Program,
    Step,
    Unsupported,
    broadcast,
    c_float,
    cat_expr,
    const,
    contiguous_strides,
    gather_expr,
    is_pointwise,
    leaf,
    numel,
    op,
    pick_steps,
    pointwise_expr,
    pool_expr,
    pool_fusable,
    ref,
    reshape_strides,
    row_scalar_leaf,
    row_steps,
    view_expr,
)
from stitchcuda.compiler.families import FAMILIES, KernelCall, Strided
from stitchcuda.compiler.fusion import FusionGroup
from stitchcuda.compiler.graph import Node, OpGraph
from stitchcuda.compiler.pymodule import REFERENCE_CLASS, reference_init_source
from stitchcuda.task.record import Task

__all__ = ["CodegenOptions", "Unsupported", "generate", "lower", "supported", "split_cuda"]

TEMPLATES = Path(__file__).parent / "templates"
GEMM_OPS = {"aten.linear", "aten.mm", "aten.matmul", "aten.bmm", "aten.addmm"}
SPLITS = {"aten.split", "aten.split_with_sizes", "aten.chunk", "aten.unbind"}  # multi-output views
CONVS = {"aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.conv_transpose1d", "aten.conv_transpose2d",
         "aten.conv_transpose3d", "aten.convolution", "aten._convolution"}
CELLS = {"aten.lstm_cell": 4, "aten.gru_cell": 3}  # recurrent cells -> gates per hidden unit
ZEROS = {"aten.new_zeros", "aten.zeros", "aten.zeros_like", "aten.full"}  # initial states
C_TYPES = {"float32": "float", "bool": "bool", "int64": "int64_t", "int32": "int32_t"}
TORCH_TYPES = {"float": "at::kFloat", "bool": "at::kBool", "int64_t": "at::kLong", "int32_t": "at::kInt"}
RESHAPES = {"aten.view", "aten.reshape", "aten._unsafe_view", "aten.flatten", "aten.unsqueeze", "aten.squeeze"}
ENTRY_MARK = "// ---- stitchcuda entry point ----"
MAX_ROW = 32768


class CodegenOptions(BaseModel):
    """Variants the tuner can try."""

    graph: bool = Field(True, description="replay the forward from a CUDA graph (captured per argument pointers)")
    tf32: bool = Field(False, description="TF32 tensor cores in cuBLAS and cuDNN (only where the tolerance allows: "
                                          "--tolerance paper)")
    cublaslt: bool = Field(True, description="single GEMMs with a bias (and ReLU / tanh-GELU) through cuBLASLt, the "
                                             "bias and activation applied in its epilogue")
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
    ld_a: int = 0  # leading dimensions (row strides) of strided views; 0: the dense default
    ld_b: int = 0
    ld_c: int = 0
    outer: int = 1  # a second batch dimension that does not merge with the first: a host loop of calls
    outer_a: int = 0
    outer_b: int = 0
    outer_c: int = 0
    alpha: float = 1.0  # C = alpha * A.B: a constant scale of an operand folded into the call
    lt: int | None = None  # index of its cuBLASLt descriptors, when it runs through cuBLASLt
    epilogue: Literal["", "BIAS", "RELU_BIAS", "GELU_BIAS"] = ""  # cuBLASLt epilogue (bias over n)
    bias: str = ""  # the bias buffer (+ offset), for an epilogue with a bias


@dataclass
class Conv:
    """One convolution through cuDNN, float32 NC(D)HW: 2-d (and 1-d, as 2-d with H = 1) with 4-d
    descriptors, 3-d with Nd ones. ``transposed``: a transposed convolution, run as cuDNN's
    backward-data of the convolution whose weight it holds ([c_in, c_out/groups, *kernel])."""

    index: int  # names the descriptors in the generated Program
    n: int
    c: int  # input channels
    k: int  # output channels
    size: tuple[int, ...]  # the input's spatial dims: (H, W) or (D, H, W)
    out_size: tuple[int, ...]  # what cuDNN writes (one more than the output where 'same' padding is uneven)
    kernel: tuple[int, ...]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    transposed: bool
    x: str  # buffer identifiers
    weight: str
    out: str = ""
    chunks: int = 1  # calls over equal batch slices: cuDNN's descriptors count elements in int

    # the 2-d names of the last two spatial dims: input H x W, output P x Q, filter R x S
    @property
    def h(self) -> int:
        return self.size[-2]

    @property
    def w(self) -> int:
        return self.size[-1]

    @property
    def p(self) -> int:
        return self.out_size[-2]

    @property
    def q(self) -> int:
        return self.out_size[-1]

    @property
    def r(self) -> int:
        return self.kernel[-2]

    @property
    def s(self) -> int:
        return self.kernel[-1]


@dataclass
class Lowered:
    group: FusionGroup
    kind: Literal["gemm", "conv", "pointwise", "row", "alias", "sequence", "kernel"]
    program: Program | None = None
    call: KernelCall | None = None  # a family lowering's kernels and launch
    gemm: Gemm | None = None
    conv: Conv | None = None
    describe: str = ""
    parts: list[Lowered] = field(default_factory=list)  # a "sequence": GEMMs and kernels launched in order

    def launches(self) -> list[Lowered]:
        """The launchable pieces in order (the group itself unless it is a sequence)."""
        return [x for p in self.parts for x in p.launches()] if self.kind == "sequence" else [self]


@dataclass
class Lowering:
    """Everything ``generate`` renders: buffers, lowered groups in launch order."""

    graph: OpGraph
    args: list[tuple[str, str, list[int]]] = field(default_factory=list)  # (value, identifier, shape): entry args
    ctypes: dict[str, str] = field(default_factory=dict)  # identifier -> C element type, where not float
    intermediates: list[tuple[str, list[int]]] = field(default_factory=list)  # (identifier, shape)
    outputs: list[tuple[str, str, list[int]]] = field(default_factory=list)  # (value, identifier, shape)
    storage: dict[str, str] = field(default_factory=dict)  # graph value -> buffer identifier
    groups: list[Lowered] = field(default_factory=list)
    uses_blas: bool = False
    uses_dnn: bool = False  # a family lowering calls cuDNN
    convs: list[Conv] = field(default_factory=list)
    lt_gemms: list[Gemm] = field(default_factory=list)


# ----------------------------------------------------------------------------- lowering

def _ident(name: str) -> str:
    text = re.sub(r"\W", "_", name)
    return text if text and not text[0].isdigit() else "v_" + text


# names the entry point's own code uses (forward_impl's locals, the kernels' index variables) and C++
# keywords that are valid Python names: an argument named so gets a prefix
_RESERVED = {"a", "P", "opts", "device", "guard", "i", "c", "j", "k", "t", "o", "row", "base", "stream", "blas",
             "kOne", "kZero", "auto", "new", "delete", "this", "int", "float", "double", "long", "char", "bool",
             "void", "const", "template", "typename", "namespace", "struct", "union", "switch", "case", "default",
             "goto", "register", "static", "extern", "signed", "unsigned", "short", "volatile", "inline",
             "operator", "private", "public", "protected", "virtual", "friend", "sizeof", "typedef", "enum",
             "explicit", "mutable", "export", "throw", "catch", "true", "false", "nullptr", "using", "do"}


def _arg_ident(name: str) -> str:
    text = _ident(name)
    return "in_" + text if text in _RESERVED else text


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
        self.failing_ops: set[str] = set()
        self.order, self.owner = _group_order(graph, groups)
        for value in graph.mutations:  # written back into a module buffer after the forward
            self.users.setdefault(graph.getitems.get(value, (value, 0))[0], []).append("<buffer write-back>")
            self.users.setdefault(value, []).append("<buffer write-back>")
        self._check_placeholders()

    # values -----------------------------------------------------------------
    def _check_placeholders(self) -> None:
        """Entry arguments are the placeholders some node reads (an unread buffer such as BatchNorm's
        ``num_batches_tracked`` lives in the module only); non-float32 ones may only feed masks."""
        read = {i for n in self.graph.nodes for i in n.inputs()}
        for p in self.graph.placeholders:
            if p.name not in read:
                continue
            if p.kind == "constant":
                raise Unsupported(f"lifted tensor constant {p.name}: the generated module cannot recreate it")
            if p.meta is None:
                raise Unsupported(f"forward argument {p.name} is not a tensor")
            if p.meta.dtype not in C_TYPES:
                raise Unsupported(f"{p.kind} {p.name} has dtype {p.meta.dtype}")
            ident = _arg_ident(p.name)
            self.out.args.append((p.name, ident, list(p.meta.shape)))
            self.out.storage[p.name] = ident
            if p.meta.dtype != "float32":
                self.out.ctypes[ident] = C_TYPES[p.meta.dtype]
        known = GEMM_OPS | CONVS | ROW_OPS | {"aten.group_norm"} | VIEWS | SPLITS | set(CELLS) | ZEROS | DATA_OPS
        by_family = {n for g in self.order if self._family_node(g) is not None for n in g.nodes}
        for n in self.graph.nodes:
            if n.name in by_family:
                continue  # a family lowering reads and writes any dtype it knows and names what it does not
            if len(n.out) != 1 and n.op not in SPLITS | set(CELLS):
                raise Unsupported(f"{n.name} ({n.op}) has {len(n.out)} outputs; only single-output operators and "
                                  "splits are supported")
            if not (n.op in known or is_pointwise(n.op)):
                continue  # the group lowering names the operator
            for i in n.inputs():
                meta = self.graph.meta(i)
                if meta is not None and meta.dtype != "float32" and n.op not in MASK_OPS | VIEWS | GATHER_OPS \
                        and not (meta.dtype == "bool" and (n.op in COMPARISONS or n.op == "aten.mul")) and not (
                        n.op == "aten.alias" or n.op == "aten.clone"):
                    raise Unsupported(f"{n.name} ({n.op}) reads {i} of dtype {meta.dtype}; only masks may be "
                                      "other than float32")
            if n.op not in VIEWS | {"aten.alias", "aten.clone"} and (
                    any(o.dtype not in ("float32", "bool") for o in n.out)
                    or (n.out[0].dtype == "bool" and n.op not in ("aten.bitwise_not", "aten.logical_not")
                        and n.op not in COMPARISONS and n.op != "aten.isnan")):
                raise Unsupported(f"{n.name} ({n.op}) computes {n.out[0].dtype}; only float32 values and bool "
                                  "masks are supported")
        for name, (src, _) in self.graph.getitems.items():
            if self.nodes[src].op not in SPLITS | set(CELLS) | set(FAMILIES):
                raise Unsupported(f"multi-output operator {src} ({self.nodes[src].op}) read through {name}")
        for o in self.graph.outputs:
            if o not in self.nodes and o not in self.graph.getitems:  # a multi-output family op's output
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
                if self.nodes[n].op in SPLITS:
                    raise Unsupported(f"{n} ({self.nodes[n].op}) is read outside its group")
                if self.nodes[n].out[0].dtype != "float32":
                    raise Unsupported(f"{n} ({self.nodes[n].op}) of dtype {self.nodes[n].out[0].dtype} is read "
                                      "outside its group")
                outs.append(n)
        return outs

    def _split(self, n: Node, env: dict[str, Expr]) -> None:
        """A split/chunk/unbind: each getitem becomes a slice (or select) of the input's read."""
        x = self._arg(env, f"{n.name} ({n.op})")(n.args[0])
        if x.op != "leaf" or not x.leaf.plain:  # type: ignore[union-attr]
            raise Unsupported(f"{n.name} ({n.op}): a split of a computed value")
        lf: Leaf = x.leaf  # type: ignore[assignment]
        dim = (n.args[1] if n.op == "aten.unbind" else n.args[2] if len(n.args) > 2 else 0) % len(lf.shape)
        start = 0
        for name, (src, index) in self.graph.getitems.items():
            if src != n.name:
                continue
            shape = list(lf.shape)
            strides = list(lf.strides)
            if n.op == "aten.unbind":
                env[name] = leaf(lf.value, shape[:dim] + shape[dim + 1:], strides[:dim] + strides[dim + 1:],
                                 lf.offset + index * strides[dim])
                continue
            sizes = [o.shape[dim] for o in n.out]
            start = sum(sizes[:index])
            shape[dim] = sizes[index]
            env[name] = leaf(lf.value, shape, strides, lf.offset + start * strides[dim])

    def _data_expr(self, n: Node, arg: Any) -> Expr:
        """A concatenation or a gather of reads; a gather's indices must be int buffers, its table float32."""
        if n.op in GATHER_OPS:
            a = n.args
            table, indices = a[0], [a[1]] if n.op == "aten.embedding" else [a[2]] if n.op == "aten.gather" \
                else [x for x in (a[1] if len(a) > 1 and isinstance(a[1], list) else []) if x is not None]
            for value, allowed, what in [(table, ("float32",), "table"), *((i, ("int64", "int32"), "index")
                                                                          for i in indices)]:
                meta = self.graph.meta(value[1:]) if isinstance(value, str) and value.startswith("%") else None
                if meta is None or meta.dtype not in allowed:
                    raise Unsupported(f"{n.name} ({n.op}): {what} {value!r} of dtype "
                                      f"{meta.dtype if meta else 'unknown'} (expected {' or '.join(allowed)})")
            return gather_expr(n, arg)
        if n.op in POOL_OPS:
            return pool_expr(n, arg)
        return cat_expr(n, arg)

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
    def _batch_recurrent_inputs(self) -> None:
        """Cells that read x[t] of one forward argument for every t with the same input weight:
        x.W_ih^T for all steps is one GEMM ([T*B, I] . [I, gates*H], emitted before the first
        step), and each step's gate kernel reads its slice; only h.W_hh^T stays per step."""
        found: dict[tuple[str, Any, str], list[tuple[int, Node]]] = {}
        entry = {v for v, _, _ in self.out.args}
        for n in self.graph.nodes:
            a = n.args
            if n.op not in CELLS or not (isinstance(a[0], str) and a[0].startswith("%")):
                continue
            sel = self.nodes.get(a[0][1:])
            if sel is None or sel.op != "aten.select" or not isinstance(sel.args[0], str):
                continue
            x = sel.args[0][1:]
            if x not in entry or len(self.shape(x)) != 3 or sel.args[1] % 3 != 0:
                continue
            found.setdefault((x, a[2], n.op), []).append((sel.args[2] % self.shape(x)[0], n))
        for (x, w, _cell_op), steps in found.items():
            t_all = self.shape(x)[0]
            if len(steps) < 2 or sorted(t for t, _ in steps) != list(range(t_all)):
                continue
            value = f"{x}__{_ident(str(w))}__gi_all"
            for t, n in steps:
                self.batched[n.name] = (value, t, x, w)

    def lower(self) -> Lowering:
        self.batched: dict[str, tuple[str, int, str, Any]] = {}  # cell -> (all-steps gate buffer, t, x, W_ih)
        self._batch_recurrent_inputs()
        for g in self.order:
            try:
                self.out.groups.append(self._lower_group(g))
            except Unsupported as exc:
                ops = list(dict.fromkeys(self.nodes[n].op for n in g.nodes))
                self.failing_ops.update(ops)
                self.problems.append(f"group {g.id} ({g.kind}: {', '.join(ops)}): {exc}")
                try:  # keep going so that every problem is listed
                    for v in self._outputs_of(g):
                        self._buffer(v)
                except Unsupported as more:  # the group's outputs cannot even be stored: say so, go on
                    self.problems.append(f"group {g.id}: {more}")
        self._write_back()
        return self.out

    def _write_back(self) -> None:
        """Buffers the forward mutates (BatchNorm's running statistics) get their new values last."""
        from stitchcuda.compiler.families.state import write_back

        for value, buffer in self.graph.mutations.items():
            if buffer not in self.out.storage or value not in self.out.storage:
                self.problems.append(f"buffer {buffer}: its new value {value} is not computed")
                continue
            meta, bmeta = self.graph.meta(value), self.graph.meta(buffer)
            if meta is None or bmeta is None:
                self.problems.append(f"buffer {buffer}: no tensor metadata")
                continue
            ctype, shape = C_TYPES.get(meta.dtype, "?"), tuple(meta.shape)
            src = Strided(f"a.{self.out.storage[value]}", ctype, shape, contiguous_strides(shape))
            dst = Strided(f"a.{self.out.storage[buffer]}", C_TYPES.get(bmeta.dtype, "?"), tuple(bmeta.shape),
                          contiguous_strides(tuple(bmeta.shape)))
            try:
                call = write_back(src, dst, buffer)
            except Unsupported as exc:
                self.problems.append(str(exc))
                continue
            self.out.groups.append(Lowered(FusionGroup(id=-1, kind="other", nodes=[]), "kernel", call=call,
                                           describe=call.describe))

    def _lower_group(self, g: FusionGroup) -> Lowered:
        nodes = [self.nodes[n] for n in g.nodes]
        family = self._family_node(g)
        if family is not None:
            return self._lower_family(g, nodes, family)
        for n in nodes:
            if not (n.op in GEMM_OPS or n.op in CONVS or n.op in ROW_OPS or n.op == "aten.group_norm" or n.op in VIEWS or n.op in SPLITS or is_pointwise(n.op)
                    or n.op in CELLS or n.op in DATA_OPS or (n.op in ZEROS and g.kind == "recurrent")):
                raise Unsupported(f"{n.name}: operator {n.op}.{n.overload} is not supported by the offline Coder")
        if g.kind == "attention":
            return self._lower_attention(g, nodes)
        if any(n.op in CELLS for n in nodes):
            return self._lower_recurrent(g, nodes)
        convs = [n for n in nodes if n.op in CONVS]
        if convs:
            return self._lower_conv(g, nodes, convs)
        gemms = [n for n in nodes if n.op in GEMM_OPS]
        if gemms:
            return self._lower_gemm(g, nodes, gemms)
        if nodes[0].op == "aten.group_norm":
            return self._lower_group_norm(g, nodes)
        if any(n.op in ROW_OPS for n in nodes):
            return self._lower_row(g, nodes)
        return self._lower_pointwise(g, nodes)

    def _family_node(self, g: FusionGroup) -> Node | None:
        """The one operator a group hands to its family lowering (views before it fold into its reads)."""
        nodes = [self.nodes[n] for n in g.nodes]
        family = [n for n in nodes if n.op in FAMILIES  # a pooling pool_expr takes stays a strided-read kernel
                  and not (n.op in POOL_OPS and pool_fusable(n, self.shape(n.args[0][1:])))]
        if g.kind == "other" and len(family) == 1 and all(n is family[0] or n.op in VIEWS | SPLITS for n in nodes):
            return family[0]
        return None

    def _lower_family(self, g: FusionGroup, nodes: list[Node], node: Node) -> Lowered:
        """One operator through its family lowering; the views before it are folded into its reads."""
        env: dict[str, Expr] = {}
        for n in nodes:
            if n is node:
                continue
            if n.op in SPLITS:
                self._split(n, env)
            else:
                env[n.name] = view_expr(n, self._arg(env, f"{n.name} ({n.op})")(n.args[0]))
        call = FAMILIES[node.op](_FamilyContext(self, env, node), node)
        if call.library == "cudnn":
            self.out.uses_dnn = True
        return Lowered(g, "kernel", call=call, describe=call.describe or short_op(node))

    def _lower_pointwise(self, g: FusionGroup, nodes: list[Node], env: dict[str, Expr] | None = None,
                         program: Program | None = None) -> Lowered:
        env = dict(env or {})
        steps = program.steps if program else []
        for n in nodes:
            arg = self._arg(env, f"{n.name} ({n.op})")
            if n.op in SPLITS:
                self._split(n, env)
            elif n.op in VIEWS:
                env[n.name] = view_expr(n, arg(n.args[0]))
            else:
                e = self._data_expr(n, arg) if n.op in DATA_OPS else pointwise_expr(n, arg)
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
            if n.op not in VIEWS and n.op not in SPLITS:
                raise Unsupported(f"{n.name} ({n.op}) before the matrix product (only views may feed it)")
            if n.op in SPLITS:
                self._split(n, env)
            else:
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
        epilogue = nodes[nodes.index(anchor) + 1:]
        value = anchor
        if bias is not None and self.options.cublaslt:
            value, epilogue, bias = self._lt_epilogue(g, gemm, anchor, epilogue, bias)
        if gemm.lt is not None and not epilogue:  # bias (+ activation) in cuBLASLt's epilogue: no kernel
            gemm.out = self._buffer(value.name)
            return Lowered(g, "gemm", gemm=gemm, describe=self._describe_gemm(anchor, gemm))
        if bias is None and not epilogue:
            gemm.out = self._buffer(anchor.name)
            return Lowered(g, "gemm", gemm=gemm, describe=self._describe_gemm(anchor, gemm))
        low, gemm.out = self._with_epilogue(g, value, epilogue, bias, env)
        low.kind, low.gemm = "gemm", gemm
        low.describe = self._describe_gemm(anchor, gemm) + " + epilogue " + self._epilogue_text(bias, epilogue)
        return low

    def _lt_epilogue(self, g: FusionGroup, gemm: Gemm, anchor: Node, epilogue: list[Node],
                     bias: Expr) -> tuple[Node, list[Node], Expr | None]:
        """Move the bias, and a ReLU or tanh-GELU right after it, into a cuBLASLt epilogue where the
        GEMM is a single one and the bias a packed vector over its columns; returns (the node whose
        value the GEMM now writes, the rest of the epilogue, the bias still to add or None)."""
        lf = bias.leaf if bias.op == "leaf" else None
        if gemm.batch != 1 or gemm.outer != 1 or gemm.alpha != 1.0 or lf is None or not lf.plain \
                or bias.shape[-1:] != (gemm.n,) or numel(bias.shape) != gemm.n or lf.strides[-1] != 1:
            return anchor, epilogue, bias
        value, kind = anchor, "BIAS"
        if epilogue:
            first = epilogue[0]
            approx = first.kwargs.get("approximate", first.args[1] if len(first.args) > 1 else "none")
            act = "RELU_BIAS" if first.op == "aten.relu" else "GELU_BIAS" if (
                first.op == "aten.gelu" and approx == "tanh") else None
            alone = self.users.get(anchor.name, []) == [first.name] and anchor.name not in self.graph.outputs
            if act and alone and first.args[0] == "%" + anchor.name:
                value, kind, epilogue = first, act, epilogue[1:]
        gemm.epilogue, gemm.lt = kind, len(self.out.lt_gemms)  # type: ignore[assignment]
        gemm.bias = self.out.storage[lf.value] + (f" + {lf.offset}" if lf.offset else "")
        self.out.lt_gemms.append(gemm)
        return value, epilogue, None

    @staticmethod
    def _epilogue_text(bias: Expr | None, epilogue: list[Node]) -> str:
        return ", ".join(([f"bias {bias.leaf.value}"] if bias is not None and bias.leaf else [])  # type: ignore[union-attr]
                         + [f"{n.op}" for n in epilogue]) or "copy"

    def _with_epilogue(self, g: FusionGroup, anchor: Node, epilogue: list[Node], bias: Expr | None,
                       env: dict[str, Expr]) -> tuple[Lowered, str]:  # anchor: the node the library call computes
        """The anchor (a library call) writes its raw result into a group output of its shape (or a
        scratch buffer), and one pointwise kernel applies bias + the epilogue in place there;
        returns (that kernel, the buffer the library call must write)."""
        out_shape = self.shape(anchor.name)
        outs = self._outputs_of(g)
        raw_target = next((v for v in outs if self.shape(v) == out_shape), None)
        if raw_target is None:
            raw = f"b_{_ident(anchor.name)}__raw"
            self.out.intermediates.append((raw, list(out_shape)))
        else:
            raw = self._buffer(raw_target)
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
        return self._lower_pointwise(g, epilogue, env, program), raw

    def _lower_conv(self, g: FusionGroup, nodes: list[Node], convs: list[Node]) -> Lowered:
        """A 1-, 2- or 3-d convolution (or transposed convolution) through cuDNN into the group's
        output buffer, then one pointwise kernel for bias + the epilogue (eval batch norm,
        activations, residual adds) in place."""
        if len(convs) != 1:
            raise Unsupported(f"{len(convs)} convolutions in one group")
        anchor = convs[0]
        where = f"{anchor.name} ({anchor.op})"
        env: dict[str, Expr] = {}
        for n in nodes[:nodes.index(anchor)]:
            if n.op not in VIEWS:
                raise Unsupported(f"{n.name} ({n.op}) before the convolution (only views may feed it)")
            env[n.name] = view_expr(n, self._arg(env, n.name)(n.args[0]))
        arg = self._arg(env, where)
        x, w = arg(anchor.args[0]), arg(anchor.args[1])
        for e, what in ((x, "input"), (w, "weight")):
            if e.op != "leaf" or not e.leaf.contiguous or not e.leaf.plain:  # type: ignore[union-attr]
                raise Unsupported(f"{where}: the {what} is not a contiguous buffer (shape {list(e.shape)})")
        out_shape = self.shape(anchor.name)
        geo = conv_geometry(anchor, x.shape, w.shape, out_shape)

        def buf(e: Expr) -> str:
            lf: Leaf = e.leaf  # type: ignore[assignment]
            return self.out.storage[lf.value] + (f" + {lf.offset}" if lf.offset else "")

        conv = Conv(index=len(self.out.convs), n=geo.n, c=geo.c, k=geo.k, size=geo.size, out_size=geo.out_size,
                    kernel=geo.kernel, pad=geo.pad, stride=geo.stride, dilation=geo.dilation, groups=geo.groups,
                    transposed=geo.transposed, x=buf(x), weight=buf(w), chunks=geo.chunks)
        self.out.convs.append(conv)
        bias_arg = anchor.args[2] if len(anchor.args) > 2 else anchor.kwargs.get("bias")
        bias: Expr | None = None
        spatial = len(out_shape) - (2 if geo.batched else 1)
        if bias_arg is not None:
            b = arg(bias_arg)
            if b.op != "leaf" or b.shape != (geo.k,):
                raise Unsupported(f"{where}: bias of shape {list(b.shape)}")
            lf: Leaf = b.leaf  # type: ignore[assignment]
            bias = leaf(lf.value, (geo.k,) + (1,) * spatial, (lf.strides[0],) + (0,) * spatial, lf.offset)
        epilogue = nodes[nodes.index(anchor) + 1:]
        dims = len(geo.kernel) - (1 if geo.one_d else 0)
        text = (f"{'transposed ' if geo.transposed else ''}conv{dims}d {anchor.module or anchor.name}: "
                f"{list(x.shape)} -> {list(out_shape)}, {'x'.join(map(str, w.shape[2:]))} filter, "
                f"stride {list(geo.stride[-dims:])}, padding {geo.padding_text}"
                + (f", dilation {list(geo.dilation[-dims:])}" if set(geo.dilation) != {1} else "")
                + (f", groups {geo.groups}" if geo.groups > 1 else "") + " via cuDNN")
        if any(geo.trim):  # uneven 'same' padding: cuDNN writes one more row where it is, the epilogue drops it
            wide = (geo.n, geo.k, *geo.out_size)
            conv.out = f"b_{_ident(anchor.name)}__wide"
            self.out.intermediates.append((conv.out, list(wide)))
            self.out.storage[f"{anchor.name}__wide"] = conv.out
            st = contiguous_strides(wide)
            lead = st[:2] if geo.batched else st[1:2]  # an input without its batch dim: N = 1, dropped
            value = leaf(f"{anchor.name}__wide", out_shape, (*lead, *st[len(st) - spatial:]),
                         sum(t * s for t, s in zip(geo.trim, st[2:], strict=True)))
            steps = [] if bias is None else [Step(_ident(anchor.name), "full", Expr("add", (value, bias),
                                                                                     shape=tuple(out_shape)))]
            env[anchor.name] = ref(_ident(anchor.name), out_shape) if bias is not None else value
            low = self._lower_pointwise(g, epilogue, env, Program("pointwise", out_shape, steps=steps))
        elif bias is None and not epilogue:
            conv.out = self._buffer(anchor.name)
            return Lowered(g, "conv", conv=conv, describe=text)
        else:
            low, conv.out = self._with_epilogue(g, anchor, epilogue, bias, env)
        low.kind, low.conv = "conv", conv
        low.describe = text + " + epilogue " + self._epilogue_text(bias, epilogue)
        return low

    def _describe_gemm(self, anchor: Node, gemm: Gemm) -> str:
        return (f"{anchor.op} {anchor.module or anchor.name}: {gemm.outer * gemm.batch} x [{gemm.m} x {gemm.k}] . "
                f"[{gemm.k} x {gemm.n}] via "
                + (f"cuBLASLt (epilogue {gemm.epilogue.lower().replace('_', ' + ')})" if gemm.lt is not None else
                   f"cublasSgemm{'StridedBatched' if gemm.batch > 1 else ''}")
                + (f" ({gemm.outer} calls)" if gemm.outer > 1 else ""))

    def _operand(self, e: Expr, where: str, what: str) -> tuple[str, tuple[int, ...], bool]:
        """(buffer, logical shape, stored transposed) for a GEMM operand read."""
        if e.op != "leaf":
            raise Unsupported(f"{where}: {what} operand is computed inside the group")
        lf: Leaf = e.leaf  # type: ignore[assignment]
        if not lf.plain:
            raise Unsupported(f"{where}: {what} operand {lf.value} is gathered or concatenated inside the group")
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

    def _strided_gemm(self, where: str, lhs: Expr, rhs: Expr, out: str, out_shape: tuple[int, ...],
                      out_strides: tuple[int, ...]) -> Gemm:
        """A (batched) product of two strided views into a strided output: every matrix must have
        unit stride along its rows or its columns, and the batch dimensions must fold into at most
        two (one strided-batched call, or a host loop of them over the second)."""
        mats: list[Leaf] = []
        for e, what in ((lhs, "left"), (rhs, "right")):
            if e.op != "leaf" or len(e.shape) < 2 or not e.leaf.plain:  # type: ignore[union-attr]
                raise Unsupported(f"{where}: {what} operand is computed inside the group or not a matrix")
            mats.append(e.leaf)  # type: ignore[arg-type]
        a, b = mats
        (m, k), (k2, n) = a.shape[-2:], b.shape[-2:]
        if k != k2 or tuple(out_shape[-2:]) != (m, n):
            raise Unsupported(f"{where}: shapes {list(a.shape)} . {list(b.shape)} -> {list(out_shape)}")

        def layout(strides: tuple[int, ...], rows: int, cols: int, what: str) -> tuple[bool, int]:
            r, c = strides[-2], strides[-1]
            if c == 1 and (r >= cols or rows == 1):
                return False, max(r, cols)
            if r == 1 and (c >= rows or cols == 1):
                return True, max(c, rows)
            raise Unsupported(f"{where}: {what} matrix with strides {list(strides[-2:])} has no unit stride")

        a_t, ld_a = layout(a.strides, m, k, "left")
        b_t, ld_b = layout(b.strides, k, n, "right")
        c_t, ld_c = layout(out_strides, m, n, "output")
        if c_t and m > 1:
            raise Unsupported(f"{where}: the output would be written transposed")
        batch = tuple(out_shape[:-2])
        per = [Leaf(x.value, x.shape[:-2], x.strides[:-2]).effective_strides(batch) for x in (a, b)]
        dims = [[d, sa, sb, sc] for d, sa, sb, sc in zip(batch, *per, out_strides[:-2], strict=True) if d != 1]
        merged: list[list[int]] = []
        for d in dims:
            if merged and all(merged[-1][i] == d[0] * d[i] for i in (1, 2, 3)):
                merged[-1] = [merged[-1][0] * d[0], *d[1:]]
            else:
                merged.append(d)
        if len(merged) > 2:
            raise Unsupported(f"{where}: batch dimensions {list(batch)} fold into {len(merged)} strided ones")
        inner = merged[-1] if merged else [1, 0, 0, 0]
        outer = merged[0] if len(merged) == 2 else [1, 0, 0, 0]
        buf = self.out.storage[a.value] + (f" + {a.offset}" if a.offset else "")
        bbuf = self.out.storage[b.value] + (f" + {b.offset}" if b.offset else "")
        return Gemm(inner[0], m, n, k, buf, bbuf, a_t, b_t, out=out, stride_a=inner[1], stride_b=inner[2],
                    stride_c=inner[3], ld_a=ld_a, ld_b=ld_b, ld_c=ld_c, outer=outer[0], outer_a=outer[1],
                    outer_b=outer[2], outer_c=outer[3])

    def _lower_recurrent(self, g: FusionGroup, nodes: list[Node]) -> Lowered:
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
        for n in nodes:
            if n is cell:
                break
            if n.op in ZEROS:
                value = float(n.args[1]) if n.op == "aten.full" else 0.0
                env[n.name] = Expr("const", const=value, shape=self.shape(n.name))
            elif n.op in SPLITS:
                self._split(n, env)
            elif n.op in VIEWS:
                env[n.name] = view_expr(n, self._arg(env, n.name)(n.args[0]))
            else:
                raise Unsupported(f"{n.name} ({n.op}) before the cell")
        if nodes[-1] is not cell:
            raise Unsupported(f"{nodes[-1].name} ({nodes[-1].op}) after the cell")
        arg = self._arg(env, where)
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
        if cell.name in self.batched:
            value, t, x_all, _ = self.batched[cell.name]
            steps_all, b_all, i_all = self.shape(x_all)
            if value not in self.out.storage:  # the first step: one GEMM for every step's x[t].W_ih^T
                wt = Leaf(w_ih.leaf.value, (w_ih.shape[1], w_ih.shape[0]),  # type: ignore[union-attr]
                          (w_ih.leaf.strides[1], w_ih.leaf.strides[0]))  # type: ignore[union-attr]
                gemm = self._gemm_shape(cell, leaf(x_all, (steps_all * b_all, i_all)),
                                        Expr("leaf", leaf=wt, shape=wt.shape))
                gemm.out = f"b_{_ident(value)}"
                self.out.intermediates.append((gemm.out, [steps_all, b_all, width]))
                self.out.storage[value] = gemm.out
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
            gemm = self._gemm_shape(cell, lhs, Expr("leaf", leaf=wt, shape=wt.shape))
            value = f"{cell.name}__{tag}"
            gemm.out = f"b_{_ident(value)}"
            self.out.intermediates.append((gemm.out, [batch, width]))
            self.out.storage[value] = gemm.out
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
            steps.append(Step(f"{_ident(cell.name)}__{name}", "full", e))
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
        readers = {i: n.name for n in self.graph.nodes if n.name not in inside for i in n.inputs()}
        for name, (src, index) in self.graph.getitems.items():
            if src == cell.name and (name in readers or name in self.graph.outputs):
                prog.outputs[name] = results[index].ref
                prog.output_shapes[name] = self.shape(name)
                self._buffer(name)
        if len(cell.out) == 1 and (cell.name in readers or cell.name in self.graph.outputs):  # gru_cell: h' only
            prog.outputs[cell.name] = results[0].ref
            prog.output_shapes[cell.name] = self.shape(cell.name)
            self._buffer(cell.name)
        if not prog.outputs:
            raise Unsupported(f"{where}: nothing reads its outputs")
        for s in prog.steps:
            for lf in s.expr.leaves():
                lf.effective_strides(prog.shape)
        parts.append(Lowered(g, "pointwise", program=prog, describe=f"{cell.op} gates over [{batch} x {hidden}]"))
        return Lowered(g, "sequence", parts=parts, describe=f"{cell.op} {cell.module}: " + ", ".join(
            p.describe.split(": ", 1)[-1] for p in parts))

    def _lower_attention(self, g: FusionGroup, nodes: list[Node]) -> Lowered:
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
        env: dict[str, Expr] = {}
        scale: dict[str, float] = {}  # values that are a view of a buffer times a constant
        for n in before:
            if n.op in SPLITS:
                self._split(n, env)
            elif n.op in VIEWS or n.op in IDENTITY:
                env[n.name] = view_expr(n, self._arg(env, n.name)(n.args[0])) if n.op in VIEWS else \
                    self._arg(env, n.name)(n.args[0])
                src = n.args[0][1:] if isinstance(n.args[0], str) else ""
                if src in scale:
                    scale[n.name] = scale[src]
            elif n.op in ("aten.mul", "aten.div") and len(n.args) == 2 and isinstance(n.args[1], (int, float)) \
                    and not isinstance(n.args[1], bool) and n.args[1] != 0:
                env[n.name] = self._arg(env, n.name)(n.args[0])  # the constant goes into the GEMM's alpha
                factor = float(n.args[1]) if n.op == "aten.mul" else 1.0 / float(n.args[1])
                scale[n.name] = scale.get(n.args[0][1:], 1.0) * factor if isinstance(n.args[0], str) else factor
            else:
                raise Unsupported(f"{n.name} ({n.op}) before Q.K^T (only views and constant scales may feed it)")
        for n in (qk, pv):
            if n.op not in ("aten.matmul", "aten.bmm") or n.kwargs:
                raise Unsupported(f"{n.name} ({n.op}) as an attention product")
        inside = set(names)
        for n in [qk, *middle, pv, *after[:-1]]:
            if n.name in self.graph.outputs or any(u not in inside for u in self.users.get(n.name, [])):
                raise Unsupported(f"{n.name} ({n.op}) is used outside the attention group")
        # Q.K^T into a contiguous scores buffer, then the row kernel in place over it
        s_shape = self.shape(qk.name)
        scores = f"b_{_ident(qk.name)}"
        self.out.intermediates.append((scores, list(s_shape)))
        self.out.storage[qk.name] = scores
        arg = self._arg(env, f"{qk.name} ({qk.op})")
        g_qk = self._strided_gemm(f"{qk.name} ({qk.op})", arg(qk.args[0]), arg(qk.args[1]), scores, s_shape,
                                  contiguous_strides(s_shape))
        for operand in qk.args[:2]:
            g_qk.alpha *= scale.get(operand[1:], 1.0) if isinstance(operand, str) else 1.0
        if any(v in scale for n in middle + [pv] for v in n.inputs()):
            raise Unsupported("a scaled value is read after Q.K^T")
        parts = [Lowered(g, "gemm", gemm=g_qk, describe=self._describe_gemm(qk, g_qk))]
        p_value = qk.name
        if middle:
            p_value = middle[-1].name
            if pv.args[0] != "%" + p_value:
                raise Unsupported(f"{pv.name}: its left operand is not the softmax {p_value}")
            self.out.storage[p_value] = scores  # the row kernel reads its row whole before writing it back
            row = self._lower_row(g, middle, env, outs=[p_value])
            parts.append(row)
        # P.V: the views after it, inverted, give its output strides in the group output's buffer
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
        shape = self.shape(final)
        strides = contiguous_strides(shape)
        for n in reversed(chain):
            inp = self.shape(n.args[0][1:])
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
        out = self._buffer(final)
        arg = self._arg(env, f"{pv.name} ({pv.op})")
        lhs = leaf(p_value, s_shape) if middle else leaf(qk.name, s_shape)
        g_pv = self._strided_gemm(f"{pv.name} ({pv.op})", lhs, arg(pv.args[1]), out, self.shape(pv.name), strides)
        parts.append(Lowered(g, "gemm", gemm=g_pv, describe=self._describe_gemm(pv, g_pv)))
        return Lowered(g, "sequence", parts=parts, describe=" -> ".join(
            ["Q.K^T (batched GEMM)"] + (["row kernel (" + ", ".join(n.op for n in middle if n.op not in VIEWS)
                                         + ")"] if middle else []) + [f"P.V (batched GEMM) into {final}"]))

    def _lower_group_norm(self, g: FusionGroup, nodes: list[Node]) -> Lowered:
        """Group norm of a [N, C, *spatial] buffer and the pointwise chain after it, in two kernels:
        a row kernel over the N x G groups (each row the C/G channels x spatial elements of one
        group, two-pass variance) writing mean and 1/std per group, then one pointwise kernel over
        the buffer seen as [N, G, C/G, S] (so the group and channel of an element are plain
        coordinates) normalising, applying the per-channel affine and the rest of the chain."""
        gn = nodes[0]
        where = f"{gn.name} ({gn.op})"
        a = list(gn.args) + [None] * (5 - len(gn.args))
        x = self._arg({}, where)(a[0])
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
        p = _ident(gn.name)
        stats = Program("row", rows, steps=[
            Step(f"{p}__sum", "reduce", xr, "sum"),
            Step(f"{p}__mean", "scalar", op("div", ref(f"{p}__sum", stat), const(cg * spatial))),
            Step(f"{p}__sq", "reduce", op("square", op("sub", xr, ref(f"{p}__mean", stat))), "sum"),
            Step(f"{p}__rstd", "scalar", op("rsqrt", op("add", op("div", ref(f"{p}__sq", stat),
                                                                    const(cg * spatial)), const(eps)))),
        ])
        for part in ("mean", "rstd"):
            value, ident = f"{gn.name}__{part}", f"b_{p}__{part}"
            self.out.intermediates.append((ident, [n_, groups]))
            self.out.storage[value] = ident
            stats.outputs[value] = f"{p}__{part}"
            stats.output_shapes[value] = (n_, groups)
        # kernel 2: normalise + affine + the chain, over [N, G, C/G, S]
        shape = (n_, groups, cg, spatial)
        per_group = {part: leaf(f"{gn.name}__{part}", (n_, groups, 1, 1), (groups, 1, 0, 0)) for part in
                     ("mean", "rstd")}
        y = op("mul", op("sub", leaf(src, shape), per_group["mean"]), per_group["rstd"])
        arg = self._arg({}, where)
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
            e = self._arg(env, where)(v)
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
            steps.append(Step(_ident(n.name), "full", e))
            env[n.name] = ref(_ident(n.name), shape)
        prog = Program("pointwise", shape, steps=steps)
        for v in self._outputs_of(g):
            if self.shape(v) != full:
                raise Unsupported(f"{v}: an output of shape {list(self.shape(v))} after the group norm")
            e = env[v]
            if e.op != "ref":
                steps.append(Step(_ident(v) + "__out", "full", e))
                e = ref(_ident(v) + "__out", shape)
            prog.outputs[v] = e.ref
            prog.output_shapes[v] = shape
            self._buffer(v)
        if not prog.outputs:
            raise Unsupported("the group produces nothing that is used")
        parts = [Lowered(g, "row", program=stats, describe=f"group statistics over {n_ * groups} rows of "
                                                            f"{cg * spatial}"),
                 Lowered(g, "pointwise", program=prog, describe=f"normalise + affine + "
                                                                f"{', '.join(n.op for n in nodes[1:]) or 'copy'}")]
        return Lowered(g, "sequence", parts=parts, describe=f"group_norm ({groups} groups): " + " -> ".join(
            x.describe for x in parts))

    def _merge_trailing(self, nodes: list[Node], env: dict[str, Expr]) -> tuple[list[Node], dict[str, tuple]]:
        """A mean / sum / amax over several trailing dimensions of a buffer (e.g. a spatial mean of
        NCHW over H and W) becomes a reduction over the last dimension of a merged view of it."""
        merged: dict[str, tuple] = {}
        out = []
        for n in nodes:
            a = n.args
            x_name = a[0][1:] if a and isinstance(a[0], str) and a[0].startswith("%") else None
            dims = a[1] if len(a) > 1 else None
            if (n.op in ("aten.mean", "aten.sum", "aten.amax") and x_name and isinstance(dims, list) and len(dims) > 1
                    and x_name not in env and x_name in self.out.storage):
                x_shape = self.shape(x_name)
                rank, k = len(x_shape), len(dims)
                if sorted(d % rank for d in dims) == list(range(rank - k, rank)):
                    new_shape = tuple(x_shape[:rank - k]) + (numel(x_shape[rank - k:]),)
                    tmp = f"{n.name}__rows"
                    env[tmp] = leaf(x_name, new_shape)  # the buffer is contiguous: any reshape is a view
                    merged[tmp] = new_shape
                    n = n.model_copy(update={"args": ["%" + tmp, [-1], *a[2:]]})
            out.append(n)
        return out, merged

    def _lower_row(self, g: FusionGroup, nodes: list[Node], env: dict[str, Expr] | None = None,
                   outs: list[str] | None = None) -> Lowered:
        env = dict(env or {})
        nodes, merged = self._merge_trailing(nodes, env)
        shape = max([self.shape(n.name) for n in nodes] + [merged.get(n.args[0][1:]) or self.shape(n.args[0][1:])
                                                           for n in nodes if n.op in ROW_OPS
                     and isinstance(n.args[0], str) and n.args[0].startswith("%")], key=numel)
        if not shape:
            raise Unsupported("a row reduction over a 0-d value")
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
            arg = self._arg(env, f"{n.name} ({n.op})")
            if n.op in SPLITS:
                self._split(n, env)
                continue
            out = self.shape(n.name)
            if n.op in VIEWS:
                x = arg(n.args[0])
                if x.op == "ref" and kinds.get(x.ref) == "scalar" and n.op in RESHAPES and numel(out) == rows:
                    env[n.name] = ref(x.ref, out)  # one value per row either way: a reshape of nothing
                    squeezed[x.ref] = squeezed.get(x.ref, False) or out[-1:] not in ((1,), ())
                else:
                    env[n.name] = view_expr(n, x)
                continue
            if n.op == "aten.gather" and arg(n.args[0]).op == "ref":
                steps = pick_steps(n, arg(n.args[0]), arg(n.args[2]), shape)
                for s in steps:
                    s.name = _ident(s.name)
                    kinds[s.name] = "scalar"
                prog.steps += steps
                env[n.name] = ref(steps[-1].name, out)
                continue
            if n.op in ROW_OPS:
                steps = row_steps(n, arg, shape)
                for s in steps:
                    s.name = _ident(s.name)
                    kinds[s.name] = "scalar" if s.kind in ("scalar", "reduce") else "full"
                prog.steps += steps
                env[n.name] = ref(steps[-1].name, out)
                continue
            e = self._data_expr(n, arg) if n.op in DATA_OPS else pointwise_expr(n, arg)
            if e.op in ("leaf", "ref", "const"):
                env[n.name] = e
                continue
            kind = kind_of(e)
            if kind == "scalar" and out[-1:] not in ((1,), ()) and n_col > 1 and numel(out) != rows:
                raise Unsupported(f"{n.name}: shape {list(out)} neither a row nor a per-row value")
            name = _ident(n.name)
            prog.steps.append(Step(name, kind, e))  # type: ignore[arg-type]
            kinds[name] = kind
            squeezed[name] = kind == "scalar" and out[-1:] not in ((1,), ())
            env[n.name] = ref(name, out)
        for s in prog.steps:
            if s.kind == "reduce" and kind_of(s.expr) != "full":
                raise Unsupported(f"{s.name}: reduction of a per-row value")
        outs = self._outputs_of(g) if outs is None else outs
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


def short_op(node: Node) -> str:
    return node.op.split(".", 1)[-1]


class _FamilyContext:
    """The lowerer as a family lowering sees it (:class:`stitchcuda.compiler.families.FamilyContext`)."""

    def __init__(self, lowerer: _Lowerer, env: dict[str, Expr], node: Node):
        self._low, self._env, self._node = lowerer, env, node
        self.block = lowerer.options.block

    def read(self, arg: Any) -> Strided:
        where = f"{self._node.name} ({self._node.op})"
        e = self._low._arg(self._env, where)(arg)
        if e.op != "leaf" or e.leaf is None or not e.leaf.plain:  # type: ignore[union-attr]
            raise Unsupported(f"{where}: operand {arg!r} is not a tensor in memory")
        lf = e.leaf
        store = self._low.out.storage
        ident = store[lf.value]
        meta = self._low.graph.meta(lf.value)
        ctype = C_TYPES.get(meta.dtype if meta else "float32")
        if ctype is None:
            raise Unsupported(f"{where}: operand {arg!r} has dtype {meta.dtype if meta else '?'}")
        return Strided(f"a.{ident}", ctype, tuple(lf.shape), tuple(lf.strides), lf.offset)

    def write(self, value: str, dtype: str = "float32") -> Strided:
        if dtype not in C_TYPES:
            raise Unsupported(f"{self._node.name} ({self._node.op}) computes {dtype}")
        ident = self._low._buffer(value)
        if dtype != "float32":
            self._low.out.ctypes[ident] = C_TYPES[dtype]
        shape = self._low.shape(value)
        return Strided(f"a.{ident}", C_TYPES[dtype], shape, contiguous_strides(shape))

    def outputs(self, node: Node) -> list[str | None]:
        if len(node.out) == 1 and not any(src == node.name for src, _ in self._low.graph.getitems.values()):
            return [node.name]
        found: list[str | None] = [None] * len(node.out)
        for name, (src, index) in self._low.graph.getitems.items():
            if src == node.name:
                found[index] = name
        return found

    def kernel_name(self, node: Node, what: str) -> str:
        return f"k_{_ident(node.name)}_{what}"  # the program's namespace keeps it apart from others


def lower(graph: OpGraph, groups: list[FusionGroup], options: CodegenOptions | None = None) -> Lowering:
    """Lower every group, raising :class:`Unsupported` with all the problems found."""
    lowerer = _Lowerer(graph, groups, options or CodegenOptions())
    low = lowerer.lower()
    if lowerer.problems:
        raise Unsupported("; ".join(lowerer.problems), frozenset(lowerer.failing_ops))
    low.uses_blas = any(x.gemm is not None and x.gemm.lt is None for g in low.groups for x in g.launches())
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
    text = " + ".join(reversed(terms))
    if base:
        text = f"{text} {'+' if base > 0 else '-'} {abs(base)}" if text else str(base)
    return text or "0"


def _coord(shape: tuple[int, ...], dim: int, idx: str) -> str:
    """C expression of the coordinate along ``dim`` of linear index ``idx`` of ``shape``."""
    inner = numel(shape[dim + 1:])
    t = idx if inner == 1 else f"({idx} / {inner})"
    return f"({t} % {shape[dim]})" if numel(shape[:dim]) > 1 else t


def _load(lf: Leaf, low: Lowering, offset: Any, coord: Any) -> str:
    """C expression reading ``lf``: ``offset(leaf)`` gives a read's element offset and ``coord(axis)``
    the output coordinate along an axis counted from the end. Index reads go through
    ``sc_gather_at`` (bounds, wrapping; -1 when out of range) and ``sc_gather_load`` (NaN for -1); a
    guarded piece reads nothing outside its range and is -0.0 there (the identity of the sum)."""
    ptr = low.storage[lf.value]
    if not lf.gathers:
        text = f"{ptr}[{offset(lf)}]"
    else:
        at = f"static_cast<long long>({offset(lf)})"
        for g in lf.gathers:
            k = f"static_cast<long long>({low.storage[g.index.value]}[{offset(g.index)}])"
            at = f"sc_gather_at({at}, {k}, {g.bound}LL, {g.stride}LL, {'true' if g.wrap else 'false'})"
        text = f"sc_gather_load({ptr}, {at})"
    if lf.guard is None:
        return text
    axis, lo, hi = lf.guard
    c = coord(axis)
    cond = f"{c} == {lo}" if hi == lo + 1 else f"{c} < {hi}" if lo == 0 else f"{c} >= {lo}" \
        if hi == lf.shape[axis] else f"{c} >= {lo} && {c} < {hi}"
    return f"(({cond}) ? {text} : -0.0f)"


def _code(e: Expr, leafs: dict[Leaf, str], refs: dict[str, str]) -> str:
    if e.op == "leaf":
        return leafs[e.leaf]  # type: ignore[index]
    if e.op == "const":
        return c_float(e.const)
    if e.op == "ref":
        return refs[e.ref]
    from stitchcuda.compiler.expr import OPS

    return OPS[e.op][0].format(*(_code(a, leafs, refs) for a in e.args))


def _ctype(lf: Leaf, low: Lowering) -> str:
    """The register type of a read: int index values keep their type (only picks read them), the
    rest is float (a bool mask as 0.0f / 1.0f, a gathered value from its float table)."""
    c = low.ctypes.get(low.storage[lf.value], "float")
    return c if lf.plain and c in ("int64_t", "int32_t") else "float"


@dataclass
class _Kernel:
    source: str
    launch: str
    params: list[str]


def _shifts(prog: Program, low: Lowering, writes: list[str]) -> dict[str, int]:
    """Buffers all of whose reads are at affine offsets, the least of them positive: the launch
    passes the pointer advanced by that least offset and the kernel reads relative to it, so
    kernels that differ only in where they read (the steps of a recurrence, say) are the same."""
    offsets: dict[str, set[int]] = {}
    for lf in prog.leaves():
        for x in (lf, *(g.index for g in lf.gathers)):
            buf = low.storage[x.value]
            offsets.setdefault(buf, set()).add(x.offset if x is lf and not lf.gathers else -1)
    return {b: min(o) for b, o in offsets.items() if -1 not in o and min(o) > 0 and b not in writes}


def _shifted(lf: Leaf, low: Lowering, shifts: dict[str, int]) -> Leaf:
    return replace(lf, offset=lf.offset - shifts[low.storage[lf.value]]) if low.storage[lf.value] in shifts else lf


def _params(prog: Program, low: Lowering, writes: list[str],
            shifts: dict[str, int] | None = None) -> tuple[list[str], list[str]]:
    """Kernel parameter declarations and the matching launch arguments (``a.<buffer>``)."""
    reads = list(dict.fromkeys(low.storage[v] for lf in prog.leaves() for v in lf.reads()))
    decls, args = [], []
    for b in reads:
        if b in writes:
            continue
        decls.append(f"const {low.ctypes.get(b, 'float')}* __restrict__ {b}")
        args.append(f"a.{b}" + (f" + {shifts[b]}" if shifts and b in shifts else ""))
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
        self._kernels: dict[str, str] = {}  # normalised source -> the name it was emitted under

    def _dedupe(self, name: str, source: str, decls: list[str]) -> tuple[str, str]:
        """(the kernel name to launch, the source to add: empty when an identical kernel, up to
        its name and parameter names, was emitted already)."""
        key = source.replace(name, "KERNEL")
        for k, d in enumerate(decls):
            key = re.sub(rf"\b{re.escape(d.split()[-1])}\b", f"p{k}", key)
        locals_ = list(dict.fromkeys(re.findall(r"\b[tvs]_\w+", key)))  # step values, named after graph nodes
        for k, tok in enumerate(locals_):
            key = re.sub(rf"\b{re.escape(tok)}\b", f"r{k}", key)
        if key in self._kernels:
            return self._kernels[key], ""
        self._kernels[key] = name
        return name, source

    def pointwise(self, gid: int, prog: Program) -> _Kernel:
        low, block = self.low, self.options.block
        shape = prog.shape
        total = numel(shape)
        writes = list(dict.fromkeys(low.storage[v] for v in prog.outputs))
        shifts = _shifts(prog, low, writes)
        decls, args = _params(prog, low, writes, shifts)
        idx_t = "int" if total < 2**31 - 8 else "long long"
        leaves = prog.leaves()
        leaf_vars = {lf: f"l{i}" for i, lf in enumerate(leaves)}
        refs = {s.name: f"t_{s.name}" for s in prog.steps}
        def offset(x: Leaf) -> str:
            return _offset(x.effective_strides(shape), shape, "i", x.offset)

        moved = {lf: _shifted(lf, low, shifts) for lf in leaves}
        loads = [(leaf_vars[lf], _ctype(lf, low), low.storage[lf.value],
                  _load(moved[lf], low, offset, lambda axis: _coord(shape, len(shape) + axis, "i")),
                  lf.plain and moved[lf].offset == 0 and lf.effective_strides(shape) == contiguous_strides(shape)
                  and low.storage[lf.value] not in low.ctypes) for lf in leaves]
        steps = [(refs[s.name], _code(s.expr, leaf_vars, refs)) for s in prog.steps]
        stores = [(low.storage[v], refs[s]) for v, s in prog.outputs.items()]
        vec = self.options.vector_width == 4 and total % 4 == 0 and total >= 4
        name = f"{self.prefix}_g{gid}_pointwise"
        source = self.env.get_template("pointwise.cu.j2").render(
            name=name, block=block, decls=decls, idx_t=idx_t, total=total, loads=loads, steps=steps,
            stores=stores, vec=vec)
        name, source = self._dedupe(name, source, decls)
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
        shifts = _shifts(prog, low, writes)
        decls, args = _params(prog, low, writes, shifts)
        lead = shape[:-1]
        leaves = prog.leaves()
        loads = []
        leaf_full: dict[Leaf, str] = {}
        leaf_row: dict[Leaf, str] = {}

        def offset(x: Leaf) -> str:
            eff = x.effective_strides(shape)
            base = _offset(eff[:-1], lead, "row", x.offset)
            col = "" if eff[-1] == 0 else ("c" if eff[-1] == 1 else f"c * {eff[-1]}")
            return " + ".join(t for t in (base if base != "0" else "", col) if t) or "0"

        def coord(axis: int) -> str:
            return "c" if axis == -1 else _coord(lead, len(lead) + axis + 1, "row")

        for i, lf in enumerate(leaves):
            scalar = row_scalar_leaf(lf, shape)
            loads.append((f"l{i}", _ctype(lf, low), _load(_shifted(lf, low, shifts), low, offset, coord), scalar))
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
        name, source = self._dedupe(name, source, decls)
        launch = (f"{name}<<<{-(-rows // (block // team))}, {block}, 0, stream>>>({', '.join(args)});\n"
                  "SC_CUDA_CHECK(cudaGetLastError());")
        return _Kernel(source, launch, decls)

    def gemm(self, g: Gemm) -> str:
        if g.lt is not None:
            return lt_launch(g)
        # Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T = B^T A^T: cuBLAS's first operand
        # is B (as B^T, [N x K]), its second A (as A^T, [K x M]), ldc = N.
        # Strided views pass their row stride as the leading dimension; an outer batch dimension
        # that does not fold into the strided batch is a host loop over o, offsetting every pointer.
        op_b, ld_b = ("CUBLAS_OP_T", g.ld_b or g.k) if g.b_trans else ("CUBLAS_OP_N", g.ld_b or g.n)
        op_a, ld_a = ("CUBLAS_OP_T", g.ld_a or g.m) if g.a_trans else ("CUBLAS_OP_N", g.ld_a or g.k)
        ld_c = g.ld_c or g.n

        def ptr(buf: str, step: int) -> str:
            return f"a.{buf}" + (f" + o * {step}LL" if g.outer > 1 and step else "")

        pa, pb, pc = ptr(g.a, g.outer_a), ptr(g.b, g.outer_b), ptr(g.out, g.outer_c)
        one = "&kOne" if g.alpha == 1.0 else "&kAlpha"
        if g.batch == 1:
            call = (f"SC_CUBLAS_CHECK(cublasSgemm(blas, {op_b}, {op_a}, {g.n}, {g.m}, {g.k}, {one}, {pb}, {ld_b}, "
                    f"{pa}, {ld_a}, &kZero, {pc}, {ld_c}));")
        else:
            call = (f"SC_CUBLAS_CHECK(cublasSgemmStridedBatched(blas, {op_b}, {op_a}, {g.n}, {g.m}, {g.k}, {one}, "
                    f"{pb}, {ld_b}, {g.stride_b}LL, {pa}, {ld_a}, {g.stride_a}LL, &kZero, {pc}, {ld_c}, "
                    f"{g.stride_c}LL, {g.batch}));")
        if g.outer > 1:
            call = f"for (int o = 0; o < {g.outer}; ++o) {{\n  {call}\n}}"
        if g.alpha != 1.0:
            call = f"{{\nconst float kAlpha = {c_float(g.alpha)};\n{call}\n}}"
        return call


_CONV_ARGS = ["input", "weight", "bias", "stride", "padding", "dilation", "groups"]  # convNd
_CONV_T_ARGS = ["input", "weight", "bias", "stride", "padding", "output_padding", "groups", "dilation"]
_CONVOLUTION_ARGS = ["input", "weight", "bias", "stride", "padding", "dilation", "transposed", "output_padding",
                     "groups"]  # aten.convolution, aten._convolution (whose further flags change no result)


@dataclass(frozen=True)
class ConvGeometry:
    """A convolution node's arguments as cuDNN takes them: 2 or 3 spatial dims (a 1-d one as 2-d
    with H = 1), symmetric padding."""

    transposed: bool
    batched: bool  # False: the input has no batch dim (N = 1 for cuDNN)
    one_d: bool
    n: int
    c: int
    k: int
    groups: int
    size: tuple[int, ...]
    out_size: tuple[int, ...]  # what cuDNN writes
    kernel: tuple[int, ...]
    pad: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    trim: tuple[int, ...]  # leading rows of cuDNN's output the node's output drops (uneven 'same' padding)
    padding_text: str
    chunks: int  # calls over equal batch slices (what PyTorch does for tensors of 2^31 elements or more)


def conv_geometry(node: Node, x_shape: tuple[int, ...], w_shape: tuple[int, ...],
                  out_shape: tuple[int, ...]) -> ConvGeometry:
    """The convolution ``node`` (any of CONVS) as cuDNN runs it; Unsupported where it cannot."""
    where = f"{node.name} ({node.op}.{node.overload})"
    op = node.op
    names = (_CONVOLUTION_ARGS if op in ("aten.convolution", "aten._convolution") else
             _CONV_T_ARGS if op.startswith("aten.conv_transpose") else _CONV_ARGS)
    a = dict(zip(names, node.args, strict=False))
    a.update({k: v for k, v in node.kwargs.items() if k in names})
    transposed = bool(a.get("transposed", op.startswith("aten.conv_transpose")))
    sp = len(w_shape) - 2
    if sp not in (1, 2, 3) or len(x_shape) not in (sp + 1, sp + 2) or len(out_shape) != len(x_shape):
        raise Unsupported(f"{where}: input {list(x_shape)}, weight {list(w_shape)}, output {list(out_shape)}")
    batched = len(x_shape) == sp + 2

    def ints(v: Any, default: int, what: str) -> tuple[int, ...]:
        v = default if v is None else v
        items = list(v) if isinstance(v, (list, tuple)) else [v]
        items = items * sp if len(items) == 1 else items
        if len(items) != sp or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
            raise Unsupported(f"{where}: {what} {v!r} is not {sp} integers")
        return tuple(items)

    groups = a.get("groups")
    groups = 1 if groups is None else groups
    stride, dilation = ints(a.get("stride"), 1, "stride"), ints(a.get("dilation"), 1, "dilation")
    out_pad = ints(a.get("output_padding"), 0, "output_padding") if transposed else (0,) * sp
    kernel, size, out = tuple(w_shape[2:]), tuple(x_shape[-sp:]), tuple(out_shape[-sp:])
    padding = a.get("padding")
    if padding == "valid":
        left = right = (0,) * sp
    elif padding == "same" and not transposed:
        if set(stride) != {1}:
            raise Unsupported(f"{where}: padding='same' with stride {list(stride)}")
        left = tuple(d * (f - 1) // 2 for d, f in zip(dilation, kernel, strict=True))
        right = tuple(d * (f - 1) - lo for d, f, lo in zip(dilation, kernel, left, strict=True))
    elif isinstance(padding, str):
        raise Unsupported(f"{where}: padding={padding!r}")
    else:
        left = right = ints(padding, 0, "padding")
    c, k = x_shape[-sp - 1], out_shape[-sp - 1]
    if not isinstance(groups, int) or groups < 1 or c % groups or k % groups:
        raise Unsupported(f"{where}: groups={groups!r}")
    if tuple(w_shape[:2]) != ((c, k // groups) if transposed else (k, c // groups)):
        raise Unsupported(f"{where}: weight of shape {list(w_shape)}")
    if transposed:
        expect = tuple((n - 1) * st - 2 * p + d * (f - 1) + op_ + 1
                       for n, st, p, d, f, op_ in zip(size, stride, left, dilation, kernel, out_pad, strict=True))
        # cuDNN runs it as the backward-data of the convolution from our output back to our input
        back = tuple((o + 2 * p - d * (f - 1) - 1) // st + 1
                     for o, st, p, d, f in zip(expect, stride, left, dilation, kernel, strict=True))
        if back != size:
            raise Unsupported(f"{where}: output padding {list(out_pad)} not below stride {list(stride)}")
    else:
        expect = tuple((n + lo + hi - d * (f - 1) - 1) // st + 1
                       for n, lo, hi, d, f, st in zip(size, left, right, dilation, kernel, stride, strict=True))
    if out != expect or (batched and out_shape[0] != x_shape[0]):
        raise Unsupported(f"{where}: output {list(out_shape)}, expected spatial dims {list(expect)}")
    trim = tuple(hi - lo for lo, hi in zip(left, right, strict=True))
    cudnn_out = tuple(o + t for o, t in zip(out, trim, strict=True))
    n = x_shape[0] if batched else 1
    per_sample = max(numel((c, *size)), numel((k, *cudnn_out)))
    if max(per_sample, numel(w_shape)) > 2 ** 31 - 1:  # cuDNN's legacy descriptors count elements in int
        raise Unsupported(f"{where}: one sample's input or output, or the weight, has 2^31 elements or more")
    chunks = next(q for q in range(1, n + 1) if n % q == 0 and n // q * per_sample <= 2 ** 31 - 1)
    one_d = sp == 1

    def two(t: tuple[int, ...], first: int) -> tuple[int, ...]:
        return (first, *t) if one_d else t

    return ConvGeometry(transposed=transposed, batched=batched, one_d=one_d, n=n, c=c, k=k, groups=groups,
                        size=two(size, 1), out_size=two(cudnn_out, 1), kernel=two(kernel, 1), pad=two(right, 0),
                        stride=two(stride, 1), dilation=two(dilation, 1), trim=two(trim, 0),
                        padding_text=repr(padding) if isinstance(padding, str) else str(list(left)), chunks=chunks)


def conv_members(c: Conv) -> list[str]:
    i = c.index
    return [f"cudnnTensorDescriptor_t dnn_x{i} = nullptr, dnn_y{i} = nullptr;",
            f"cudnnFilterDescriptor_t dnn_w{i} = nullptr;",
            f"cudnnConvolutionDescriptor_t dnn_c{i} = nullptr;",
            f"{'cudnnConvolutionBwdDataAlgo_t' if c.transposed else 'cudnnConvolutionFwdAlgo_t'} dnn_algo{i}{{}};",
            f"size_t dnn_bytes{i} = 0;"]


def conv_setup(c: Conv, math: str) -> list[str]:
    """Descriptors and the algorithm (timed by cuDNN at setup, else its heuristics; the first that works under the
    math mode within the workspace limit), once per Program: nothing here runs inside a capture."""
    i, m = c.index, "made->"
    x_dims, y_dims = (c.n // c.chunks, c.c, *c.size), (c.n // c.chunks, c.k, *c.out_size)
    # a transposed convolution is the backward-data of the convolution from its output to its input
    w_dims = (c.c, c.k // c.groups, *c.kernel) if c.transposed else (c.k, c.c // c.groups, *c.kernel)
    pick = "sc_pick_bwd_data" if c.transposed else "sc_pick_fwd"
    if len(c.size) == 2:
        descriptors = [
            f"SC_CUDNN_CHECK(cudnnCreateTensorDescriptor(&{m}dnn_x{i}));",
            f"SC_CUDNN_CHECK(cudnnSetTensor4dDescriptor({m}dnn_x{i}, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, "
            f"{', '.join(map(str, x_dims))}));",
            f"SC_CUDNN_CHECK(cudnnCreateTensorDescriptor(&{m}dnn_y{i}));",
            f"SC_CUDNN_CHECK(cudnnSetTensor4dDescriptor({m}dnn_y{i}, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, "
            f"{', '.join(map(str, y_dims))}));",
            f"SC_CUDNN_CHECK(cudnnCreateFilterDescriptor(&{m}dnn_w{i}));",
            f"SC_CUDNN_CHECK(cudnnSetFilter4dDescriptor({m}dnn_w{i}, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, "
            f"{', '.join(map(str, w_dims))}));",
            f"SC_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&{m}dnn_c{i}));",
            f"SC_CUDNN_CHECK(cudnnSetConvolution2dDescriptor({m}dnn_c{i}, {c.pad[0]}, {c.pad[1]}, {c.stride[0]}, "
            f"{c.stride[1]}, {c.dilation[0]}, {c.dilation[1]}, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));",
        ]
    else:  # 3-d: Nd descriptors, fully packed NCDHW
        nd, sp = len(x_dims), len(c.size)

        def arr(v: Any) -> str:
            return "{" + ", ".join(map(str, v)) + "}"

        descriptors = [
            f"SC_CUDNN_CHECK(cudnnCreateTensorDescriptor(&{m}dnn_x{i}));",
            f"{{ const int dims[{nd}] = {arr(x_dims)}, strides[{nd}] = {arr(contiguous_strides(x_dims))};",
            f"  SC_CUDNN_CHECK(cudnnSetTensorNdDescriptor({m}dnn_x{i}, CUDNN_DATA_FLOAT, {nd}, dims, strides)); }}",
            f"SC_CUDNN_CHECK(cudnnCreateTensorDescriptor(&{m}dnn_y{i}));",
            f"{{ const int dims[{nd}] = {arr(y_dims)}, strides[{nd}] = {arr(contiguous_strides(y_dims))};",
            f"  SC_CUDNN_CHECK(cudnnSetTensorNdDescriptor({m}dnn_y{i}, CUDNN_DATA_FLOAT, {nd}, dims, strides)); }}",
            f"SC_CUDNN_CHECK(cudnnCreateFilterDescriptor(&{m}dnn_w{i}));",
            f"{{ const int dims[{nd}] = {arr(w_dims)};",
            f"  SC_CUDNN_CHECK(cudnnSetFilterNdDescriptor({m}dnn_w{i}, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, {nd}, "
            "dims)); }",
            f"SC_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&{m}dnn_c{i}));",
            f"{{ const int pad[{sp}] = {arr(c.pad)}, stride[{sp}] = {arr(c.stride)}, dilation[{sp}] = "
            f"{arr(c.dilation)};",
            f"  SC_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor({m}dnn_c{i}, {sp}, pad, stride, dilation, "
            "CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT)); }",
        ]
    return [
        *descriptors,
        f"SC_CUDNN_CHECK(cudnnSetConvolutionGroupCount({m}dnn_c{i}, {c.groups}));",
        (f"{m}dnn_algo{i} = {pick}({m}dnn, {m}dnn_w{i}, {m}dnn_x{i}, {m}dnn_c{i}, {m}dnn_y{i}, {math}, "
         f"&{m}dnn_bytes{i});" if c.transposed else
         f"{m}dnn_algo{i} = {pick}({m}dnn, {m}dnn_x{i}, {m}dnn_w{i}, {m}dnn_c{i}, {m}dnn_y{i}, {math}, "
         f"&{m}dnn_bytes{i});"),
        f"dnn_bytes = std::max(dnn_bytes, {m}dnn_bytes{i});",
    ]


def _lt_operands(g: Gemm) -> list[tuple[str, int, int, int, int]]:
    """(buffer, rows, cols, leading dimension, byte alignment) of cuBLASLt's A, B and D: the
    column-major view of the row-major product, C^T = B^T A^T, as in ``_Emitter.gemm``."""
    def align(buf: str) -> int:
        off = int(buf.split(" + ")[1]) if " + " in buf else 0
        a = 256
        while off and (off * 4) % a:
            a //= 2
        return a

    lt_a = (g.b, g.k, g.n, g.ld_b or g.k) if g.b_trans else (g.b, g.n, g.k, g.ld_b or g.n)
    lt_b = (g.a, g.m, g.k, g.ld_a or g.m) if g.a_trans else (g.a, g.k, g.m, g.ld_a or g.k)
    lt_d = (g.out, g.n, g.m, g.ld_c or g.n)
    return [(*x, align(x[0])) for x in (lt_a, lt_b, lt_d)]


def lt_members(g: Gemm) -> list[str]:
    i = g.lt
    return [f"cublasLtMatmulDesc_t lt_desc{i} = nullptr;",
            f"cublasLtMatrixLayout_t lt_a{i} = nullptr, lt_b{i} = nullptr, lt_d{i} = nullptr;",
            f"cublasLtMatmulAlgo_t lt_algo{i}{{}};"]


def lt_setup(g: Gemm, compute: str) -> list[str]:
    """Descriptors, layouts and the heuristic's algorithm, once per Program (never in a capture)."""
    i, m = g.lt, "made->"
    (_, ar, ac, ald, aal), (_, br, bc, bld, bal), (_, dr, dc, dld, dal) = _lt_operands(g)
    op_a = "CUBLAS_OP_T" if g.b_trans else "CUBLAS_OP_N"
    op_b = "CUBLAS_OP_T" if g.a_trans else "CUBLAS_OP_N"
    return [
        f"SC_CUBLAS_CHECK(cublasLtMatmulDescCreate(&{m}lt_desc{i}, {compute}, CUDA_R_32F));",
        f"sc_lt_set(made->lt_desc{i}, CUBLASLT_MATMUL_DESC_TRANSA, {op_a});",
        f"sc_lt_set(made->lt_desc{i}, CUBLASLT_MATMUL_DESC_TRANSB, {op_b});",
        f"sc_lt_set(made->lt_desc{i}, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_{g.epilogue});",
        f"SC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&{m}lt_a{i}, CUDA_R_32F, {ar}, {ac}, {ald}));",
        f"SC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&{m}lt_b{i}, CUDA_R_32F, {br}, {bc}, {bld}));",
        f"SC_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&{m}lt_d{i}, CUDA_R_32F, {dr}, {dc}, {dld}));",
        f"{m}lt_algo{i} = sc_lt_algo({m}lt, {m}lt_desc{i}, {m}lt_a{i}, {m}lt_b{i}, {m}lt_d{i}, {aal}, {bal}, {dal});",
    ]


def lt_launch(g: Gemm) -> str:
    i = g.lt
    return "\n".join([
        "{",
        f"  const float* bias = a.{g.bias};",
        f"  SC_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(P.lt_desc{i}, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, "
        "sizeof(bias)));",
        f"  SC_CUBLAS_CHECK(cublasLtMatmul(P.lt, P.lt_desc{i}, &kOne, a.{g.b}, P.lt_a{i}, a.{g.a}, P.lt_b{i}, &kZero, "
        f"a.{g.out}, P.lt_d{i}, a.{g.out}, P.lt_d{i}, &P.lt_algo{i}, P.lt_workspace_ptr, kLtWorkspaceBytes, stream));",
        "}"])


def conv_launch(c: Conv) -> str:
    i = c.index
    x, out = f"a.{c.x}", f"a.{c.out}"
    if c.chunks > 1:  # one call per batch slice
        x += f" + b * {numel((c.n // c.chunks, c.c, *c.size))}LL"
        out += f" + b * {numel((c.n // c.chunks, c.k, *c.out_size))}LL"
    if c.transposed:  # dx = conv^T(dy): dy is our input, dx our output
        call = (f"SC_CUDNN_CHECK(cudnnConvolutionBackwardData(P.dnn, &kOne, P.dnn_w{i}, a.{c.weight}, P.dnn_x{i}, "
                f"{x}, P.dnn_c{i}, P.dnn_algo{i}, P.dnn_workspace_ptr, P.dnn_bytes{i}, &kZero, P.dnn_y{i}, "
                f"{out}));")
    else:
        call = (f"SC_CUDNN_CHECK(cudnnConvolutionForward(P.dnn, &kOne, P.dnn_x{i}, {x}, P.dnn_w{i}, a.{c.weight}, "
                f"P.dnn_c{i}, P.dnn_algo{i}, P.dnn_workspace_ptr, P.dnn_bytes{i}, &kZero, P.dnn_y{i}, {out}));")
    return call if c.chunks == 1 else f"for (long long b = 0; b < {c.chunks}; ++b) {{\n  {call}\n}}"


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


def generate(task: Task, graph: OpGraph, groups: list[FusionGroup], options: CodegenOptions | None = None) -> str:
    """The candidate program (Python source) for ``task``; raises :class:`Unsupported` saying why not."""
    options = options or CodegenOptions()
    low = lower(graph, groups, options)
    digest = hashlib.sha256((graph.model_dump_json() + options.model_dump_json()).encode()).hexdigest()[:12]
    prefix = f"sc{digest}"
    emitter = _Emitter(low, options, prefix)
    kernels, launches = [], []
    emitted_family: set[str] = set()
    for lg in low.groups:
        head = f"// group {lg.group.id} ({lg.group.kind}): {lg.describe}"
        if lg.kind == "alias":
            launches.append(head + " -- no launch")
            continue
        text = [head]
        for part in lg.launches():
            if part.call is not None:
                for kname, ksource in part.call.kernels.items():
                    if kname not in emitted_family:
                        emitted_family.add(kname)
                        kernels.append(ksource)
                text.append(part.call.launch)
                continue
            if part.gemm is not None:
                text.append(emitter.gemm(part.gemm))
            if part.conv is not None:
                text.append(conv_launch(part.conv))
            if part.program is not None and (part.kind not in ("gemm", "conv") or part.program.steps):
                k = emitter.row(lg.group.id, part.program) if part.kind == "row" else emitter.pointwise(
                    lg.group.id, part.program)
                if k.source:
                    kernels.append(k.source)
                text.append(k.launch)
        launches.append("\n".join(text))
    inputs = [(v, i, s, low.ctypes.get(i, "float")) for v, i, s in low.args]
    low.outputs.sort(key=lambda o: graph.outputs.index(o[0]))
    dnn_math = "CUDNN_TENSOR_OP_MATH" if options.tf32 else "CUDNN_FMA_MATH"
    cuda_src = emitter.env.get_template("program.cu.j2").render(
        ns=prefix, task=task.name, torch_types=TORCH_TYPES, options=options.model_dump(), blas=low.uses_blas,
        blas_math="CUBLAS_TF32_TENSOR_OP_MATH" if options.tf32 else "CUBLAS_DEFAULT_MATH", kernels=kernels,
        dnn=bool(low.convs) or low.uses_dnn, dnn_math=dnn_math, ctypes=low.ctypes, dnn_members=[m for c in low.convs for m in conv_members(c)],
        lt=bool(low.lt_gemms), lt_members=[m for g in low.lt_gemms for m in lt_members(g)],
        lt_setup=[line for g in low.lt_gemms for line in lt_setup(
            g, "CUBLAS_COMPUTE_32F_FAST_TF32" if options.tf32 else "CUBLAS_COMPUTE_32F")],
        dnn_setup=[line for c in low.convs for line in conv_setup(c, dnn_math)],
        launches=launches, args=inputs, intermediates=low.intermediates, outputs=low.outputs,
        entry_mark=ENTRY_MARK, prelude=emitter.env.get_template("prelude.cu.j2").render())
    ret = "at::Tensor" if len(low.outputs) == 1 else "std::vector<at::Tensor>"
    # torch's pybind casters instead of torch/extension.h: the binding compiles in seconds
    cpp_src = ("#include <torch/csrc/utils/pybind.h>\n#include <vector>\n"
               f"{ret} forward({', '.join(f'at::Tensor {i}' for _, i, _, _ in inputs)});\n"
               'PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("forward", &forward, "the whole forward pass"); }\n')
    name = "stitchcuda_offline_" + hashlib.sha256((cuda_src + cpp_src).encode()).hexdigest()[:16]
    fwd_args = _signature(task, "forward")
    entry_inputs = [p for p in graph.placeholders if p.kind == "input"]
    fwd_names = [a.arg for a in fwd_args.args[1:]] if fwd_args is not None and not fwd_args.vararg else []
    if len(fwd_names) != len(entry_inputs) or any(x in ("self", "_ext", "torch", "nn") for x in fwd_names):
        fwd_names = [_ident(p.name) for p in entry_inputs]
    by_name = dict(zip((p.name for p in entry_inputs), fwd_names, strict=True))
    call_args = []
    entry = {v for v, _, _ in low.args}
    for p in graph.placeholders:
        if p.name in entry:
            call_args.append(f"{by_name[p.name]}.contiguous()" if p.kind == "input" else _access(p.target, p.kind))
    if "'''" in cuda_src:
        raise Unsupported("generated CUDA contains a triple quote")
    return emitter.env.get_template("module.py.j2").render(
        task=task.name, options=options.model_dump(), name=name, cuda_src=cuda_src, cpp_src=cpp_src,
        blas=low.uses_blas, lt=bool(low.lt_gemms), dnn=bool(low.convs) or low.uses_dnn,
        reference_init=reference_init_source(task), reference_class=REFERENCE_CLASS,
        fwd_args=", ".join(["self", *fwd_names]), call_args=call_args,
        multi=len(low.outputs) > 1, groups=[f"group {lg.group.id} ({lg.group.kind}): {lg.describe}"
                                            for lg in low.groups])
