"""Lowering a whole graph: its fusion groups in dependency order, each through the one registry
(registry.py) to a fused group lowering (lower_*.py) or to its operator's family lowering
(families/), every problem collected before giving up; and the checks on the graph's values
(entry arguments, dtypes) that hold for every lowering."""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import MAX_CONSTANT, Node, OpGraph
from stitchcuda.compiler.ir.data_movement import DATA_OPS, GATHER_OPS, POOL_OPS, pool_fusable
from stitchcuda.compiler.ir.expr import (
    IDENTITY,
    VIEWS,
    Expr,
    Program,
    Step,
    Unsupported,
    contiguous_strides,
    view_expr,
)
from stitchcuda.compiler.ir.formulas import COMPARISONS, MASK_OPS, ROW_OPS, is_pointwise
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import C_TYPES, CELLS, CONV_OPS, GROUP_LOWERED, SPLITS, ZEROS

# every lowering registers as its module is imported: the families, then the fused ones
from stitchcuda.compiler.lowering import (  # noqa: F401  (importing registers)
    families,
    lower_attention,
    lower_conv,
    lower_pointwise,
    lower_rows,
)
from stitchcuda.compiler.lowering.concat_plan import ConcatWrite, plan_concats
from stitchcuda.compiler.lowering.families.state import BufferUpdate, write_backs
from stitchcuda.compiler.lowering.gemm_calls import BATCH_PTRS, tiny, uses_batch_ptrs
from stitchcuda.compiler.lowering.hoist import hoist, static_values
from stitchcuda.compiler.lowering.kernel_call import Strided
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lower_gemm import library_way, reserve_scratch
from stitchcuda.compiler.lowering.lower_recurrent import batch_recurrent_inputs
from stitchcuda.compiler.lowering.lower_sequence import SEQUENCES
from stitchcuda.compiler.lowering.lowered import PLAIN_GEMM_OPS, CodegenOptions, Lowered, Lowering, to_ident
from stitchcuda.compiler.lowering.output_views import plan_output_views
from stitchcuda.compiler.lowering.registry import OPERATORS, group_lowering_for
from stitchcuda.compiler.lowering.siblings import merge_siblings

# names the entry point's own code uses (forward_impl's locals, the kernels' index variables) and C++
# keywords that are valid Python names: an argument named so gets a prefix
_RESERVED = {"a", "P", "opts", "device", "guard", "i", "c", "j", "k", "t", "o", "row", "base", "stream", "blas",
             "kOne", "kZero", "auto", "new", "delete", "this", "int", "float", "double", "long", "char", "bool",
             "void", "const", "template", "typename", "namespace", "struct", "union", "switch", "case", "default",
             "goto", "register", "static", "extern", "signed", "unsigned", "short", "volatile", "inline",
             "operator", "private", "public", "protected", "virtual", "friend", "sizeof", "typedef", "enum",
             "explicit", "mutable", "export", "throw", "catch", "true", "false", "nullptr", "using", "do"}


def _arg_ident(name: str) -> str:
    text = to_ident(name)
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
        self.cx = LowerContext(graph, options)
        self.problems: list[str] = []
        self.failing_ops: set[str] = set()
        self.failed: list[tuple[str, ...]] = []  # the nodes of each group that did not lower
        self.order, self.owner = _group_order(graph, groups)
        self.counters = self._counters()
        self._check_placeholders()
        self.concats = plan_concats(self.cx, groups, self.owner)
        plan_output_views(self.cx, groups, self.owner)

    def _check_placeholders(self) -> None:
        """Entry arguments are the placeholders some node reads (an unread buffer such as BatchNorm's
        ``num_batches_tracked`` lives in the module only); non-float32 ones may only feed masks."""
        cx = self.cx
        read = {i for n in cx.graph.nodes for i in n.inputs()}
        for p in cx.graph.placeholders:
            if p.name not in read:
                continue
            if p.kind == "constant" and p.target not in cx.graph.constants:
                raise Unsupported(f"lifted tensor constant {p.name}: a tensor the forward makes with more than "
                                  f"{MAX_CONSTANT} elements or no values at capture; the program cannot recreate it")
            if p.meta is None:
                raise Unsupported(f"forward argument {p.name} is not a tensor")
            if p.meta.dtype not in C_TYPES:
                raise Unsupported(f"{p.kind} {p.name} has dtype {p.meta.dtype}")
            ident = _arg_ident(p.name)
            cx.out.args.append((p.name, ident, list(p.meta.shape)))
            cx.out.storage[p.name] = ident
            if p.meta.dtype != "float32":
                cx.out.ctypes[ident] = C_TYPES[p.meta.dtype]
        known = PLAIN_GEMM_OPS | CONV_OPS | ROW_OPS | {"aten.group_norm"} | VIEWS | SPLITS | set(CELLS) | ZEROS | DATA_OPS
        by_family = {n for g in self.order if self._family_node(g) is not None for n in g.nodes}
        for n in cx.graph.nodes:
            if n.name in by_family:
                continue  # a family lowering reads and writes any dtype it knows and names what it does not
            if len(n.out) != 1 and n.op not in SPLITS | set(CELLS) | set(SEQUENCES):
                raise Unsupported(f"{n.name} ({n.op}) has {len(n.out)} outputs; only single-output operators and "
                                  "splits are supported")
            if not (n.op in known or is_pointwise(n.op)):
                continue  # the group lowering names the operator
            for i in n.inputs():
                meta = cx.graph.meta(i)
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
        for name, (src, _) in cx.graph.getitems.items():
            if cx.nodes[src].op not in SPLITS | set(CELLS) | set(OPERATORS) | set(SEQUENCES):
                raise Unsupported(f"multi-output operator {src} ({cx.nodes[src].op}) read through {name}")
        for o in cx.graph.outputs:
            if o not in cx.nodes and o not in cx.graph.getitems:  # a multi-output family op's output
                raise Unsupported(f"the forward returns {o}, an argument, not a computed value")

    def lower(self) -> Lowering:
        cx = self.cx
        batch_recurrent_inputs(cx)
        for g in self.order:
            try:
                lowered = self._lower_group(g)
                cx.out.groups.extend(lowered if isinstance(lowered, list) else [lowered])
            except Unsupported as exc:
                ops = list(dict.fromkeys(cx.nodes[n].op for n in g.nodes))
                self.failing_ops.update(ops)
                self.failed.append(tuple(g.nodes))
                self.problems.append(f"group {g.id} ({g.kind}: {', '.join(ops)}): {exc}")
                try:  # keep going so that every problem is listed
                    for v in cx.outputs_of(g):
                        cx.buffer(v)
                except Unsupported as more:  # the group's outputs cannot even be stored: say so, go on
                    self.problems.append(f"group {g.id}: {more}")
        self._write_back()
        return cx.out

    def _counters(self) -> dict[str, tuple[str, int]]:
        """The ``stitchcuda.int_add`` nodes that only step a buffer for its write-back (BatchNorm's
        ``num_batches_tracked += 1``): node -> (buffer, step). The state update adds the step in
        place at the end, so they launch nothing of their own."""
        cx = self.cx
        found = {}
        for value, buffer in cx.graph.mutations.items():
            node = cx.nodes.get(value)
            if node is not None and node.op == "stitchcuda.int_add" and node.args[0] == "%" + buffer \
                    and value not in cx.graph.outputs and set(cx.users.get(value, [])) == {"<buffer write-back>"}:
                found[value] = (buffer, int(node.args[1]))
        return found

    def _write_back(self) -> None:
        """Buffers the forward mutates (BatchNorm's running statistics) get their new values last,
        all of them in one launch per element type."""
        cx = self.cx
        updates = []
        for value, buffer in cx.graph.mutations.items():
            if buffer not in cx.out.storage or (value not in cx.out.storage and value not in self.counters):
                self.problems.append(f"buffer {buffer}: its new value {value} is not computed")
                continue
            meta, bmeta = cx.graph.meta(value), cx.graph.meta(buffer)
            if meta is None or bmeta is None:
                self.problems.append(f"buffer {buffer}: no tensor metadata")
                continue
            shape, bshape = tuple(meta.shape), tuple(bmeta.shape)
            dst = Strided(f"a.{cx.out.storage[buffer]}", C_TYPES.get(bmeta.dtype, "?"), bshape, contiguous_strides(bshape))
            if value in self.counters:
                updates.append(BufferUpdate(dst, buffer, step=self.counters[value][1]))
            else:
                src = Strided(f"a.{cx.out.storage[value]}", C_TYPES.get(meta.dtype, "?"), shape, contiguous_strides(shape))
                updates.append(BufferUpdate(dst, buffer, value=src))
        try:
            calls = write_backs(updates)
        except Unsupported as exc:
            self.problems.append(str(exc))
            return
        for call in calls:
            cx.out.groups.append(Lowered(FusionGroup(id=-1, kind="other", nodes=[]), "kernel", call=call,
                                         describe=call.describe))

    def _lower_group(self, g: FusionGroup) -> Lowered | list[Lowered]:
        cx = self.cx
        nodes = [cx.nodes[n] for n in g.nodes]
        family = self._family_node(g)
        if family is not None and family.name in self.counters:
            buffer, step = self.counters[family.name]
            return Lowered(g, "alias", describe=f"{family.name}: {buffer} += {step}, in the state update at the end")
        if family is not None:
            return self._lower_family(g, nodes, family)
        if len(nodes) == 1 and nodes[0].name in self.concats:
            return self._lower_concat(g, nodes[0], self.concats[nodes[0].name])
        if all(n.op in VIEWS | SPLITS | IDENTITY for n in nodes) and any(
                cx.graph.meta(v).dtype != "float32" for v in cx.outputs_of(g)):  # type: ignore[union-attr]
            return self._materialise_typed(g, nodes)
        for n in nodes:
            if n.op not in GROUP_LOWERED and not (n.op in ZEROS and g.kind == "recurrent"):
                raise Unsupported(f"{n.name}: operator {n.op}.{n.overload} is not supported by the offline Coder")
        mark = cx.out.mark()
        try:
            return self._lower_fused(g, nodes)
        except Unsupported:
            if len(nodes) != 1 or nodes[0].op not in OPERATORS or nodes[0].name in cx.out.layouts:
                raise  # (a family kernel writes a buffer of its own, not a slice of another)
            cx.out.undo(mark)  # the fused attempt's buffers go with it
            return self._lower_family(g, nodes, nodes[0])  # one operator: its own lowering takes any instance

    def _lower_concat(self, g: FusionGroup, node: Node, runs: list[ConcatWrite]) -> Lowered:
        """A planned concatenation: one copy of each run of its new pieces into its slice of the
        shared buffer; an alias of the buffer where its producers wrote every piece in place."""
        cx = self.cx
        if not runs:
            return Lowered(g, "alias", describe=f"{node.name}: its pieces were written into its buffer by their kernels")
        arg = cx.arg({}, f"{node.name} ({node.op})")
        parts = []
        for k, run in enumerate(runs):
            if len(run.pieces) == 1:
                e = arg("%" + run.pieces[0])
            else:
                meta = cx.graph.meta(node.name).model_copy(update={"shape": list(run.shape)})  # type: ignore[union-attr]
                e = cx.data_expr(node.model_copy(update={"args": [["%" + p for p in run.pieces], run.dim],
                                                         "out": [meta]}), arg)
            ident = f"{to_ident(node.name)}__new{k}"
            prog = Program("pointwise", run.shape, steps=[Step(ident, "full", e)])
            prog.outputs[node.name] = ident
            prog.output_shapes[node.name] = run.shape
            prog.write_strides[node.name] = (run.strides, run.offset)
            parts.append(Lowered(g, "pointwise", program=prog,
                                 describe=f"{', '.join(run.pieces)} into {node.name}'s slice of a growing buffer"))
        return parts[0] if len(parts) == 1 else Lowered(g, "sequence", parts=parts,
                                                        describe=" -> ".join(p.describe for p in parts))

    def _lower_fused(self, g: FusionGroup, nodes: list[Node]) -> Lowered:
        return group_lowering_for(g, nodes).lower(self.cx, g, nodes)

    def _materialise_typed(self, g: FusionGroup, nodes: list[Node]) -> list[Lowered]:
        """Views of an integer or bool value read by other groups: an alias where the view is its
        buffer, else one exact typed copy kernel per output (the fused kernels compute in float)."""
        cx = self.cx
        env: dict[str, Expr] = {}
        for n in nodes:
            if n.op in SPLITS:
                cx.split(n, env)
            else:
                x = cx.arg(env, f"{n.name} ({n.op})")(n.args[0])
                env[n.name] = x if n.op in IDENTITY else view_expr(n, x)
        out: list[Lowered] = []
        for v in cx.outputs_of(g):
            e = env[v]
            if e.op == "leaf" and e.leaf.contiguous and v not in cx.graph.outputs:  # type: ignore[union-attr]
                cx.out.storage[v] = cx.out.storage[e.leaf.value]  # type: ignore[union-attr]
                out.append(Lowered(g, "alias", describe=f"{v} is a view of {e.leaf.value}"))  # type: ignore[union-attr]
                continue
            meta = cx.graph.meta(v)
            copy = Node(name=v, op="aten.clone", args=["%" + v], out=[meta])  # type: ignore[list-item]
            call = OPERATORS["aten.clone"](_FamilyContext(cx, env, copy), copy)
            out.append(Lowered(g, "kernel", call=call, describe=f"{v}: a {meta.dtype} copy through strides"))  # type: ignore[union-attr]
        return out

    def _family_node(self, g: FusionGroup) -> Node | None:
        """The one operator a group hands to its family lowering (views before it fold into its reads)."""
        cx = self.cx
        nodes = [cx.nodes[n] for n in g.nodes]
        family = [n for n in nodes if n.op in OPERATORS  # a pooling pool_expr takes stays a strided-read kernel
                  and not (n.op in POOL_OPS and pool_fusable(n, cx.shape(n.args[0][1:])))]
        if (g.kind == "other" or (g.kind == "data_movement" and len(nodes) == 1)) and len(family) == 1 and all(n is family[0] or n.op in VIEWS | SPLITS for n in nodes):
            return family[0]
        return None

    def _lower_family(self, g: FusionGroup, nodes: list[Node], node: Node) -> Lowered:
        """One operator through its family lowering; the views before it are folded into its reads."""
        cx = self.cx
        env: dict[str, Expr] = {}
        for n in nodes:
            if n is node:
                continue
            if n.op in SPLITS:
                cx.split(n, env)
            else:
                env[n.name] = view_expr(n, cx.arg(env, f"{n.name} ({n.op})")(n.args[0]))
        call = OPERATORS[node.op](_FamilyContext(cx, env, node), node)
        if call.library == "cudnn":
            cx.out.uses_dnn = True
        return Lowered(g, "kernel", call=call, describe=call.describe or short_op(node))


def short_op(node: Node) -> str:
    return node.op.split(".", 1)[-1]


class _FamilyContext:
    """The lowerer as a family lowering sees it (:class:`stitchcuda.compiler.lowering.families.FamilyContext`)."""

    def __init__(self, cx: LowerContext, env: dict[str, Expr], node: Node):
        self._cx, self._env, self._node = cx, env, node
        self.block = cx.options.block

    def read(self, arg: Any) -> Strided:
        where = f"{self._node.name} ({self._node.op})"
        e = self._cx.arg(self._env, where)(arg)
        if e.op != "leaf" or e.leaf is None or not e.leaf.plain:  # type: ignore[union-attr]
            raise Unsupported(f"{where}: operand {arg!r} is not a tensor in memory")
        lf = e.leaf
        store = self._cx.out.storage
        ident = store[lf.value]
        meta = self._cx.graph.meta(lf.value)
        ctype = C_TYPES.get(meta.dtype if meta else "float32")
        if ctype is None:
            raise Unsupported(f"{where}: operand {arg!r} has dtype {meta.dtype if meta else '?'}")
        return Strided(f"a.{ident}", ctype, tuple(lf.shape), tuple(lf.strides), lf.offset)

    def write(self, value: str, dtype: str = "float32") -> Strided:
        if dtype not in C_TYPES:
            raise Unsupported(f"{self._node.name} ({self._node.op}) computes {dtype}")
        ident = self._cx.buffer(value)
        if dtype != "float32":
            self._cx.out.ctypes[ident] = C_TYPES[dtype]
        shape = self._cx.shape(value)
        return Strided(f"a.{ident}", C_TYPES[dtype], shape, contiguous_strides(shape))

    def outputs(self, node: Node) -> list[str | None]:
        if len(node.out) == 1 and not any(src == node.name for src, _ in self._cx.graph.getitems.values()):
            return [node.name]
        found: list[str | None] = [None] * len(node.out)
        for name, (src, index) in self._cx.graph.getitems.items():
            if src == node.name:
                found[index] = name
        return found

    def kernel_name(self, node: Node, what: str) -> str:
        return f"k_{to_ident(node.name)}_{what}"  # the program's namespace keeps it apart from others


def lower(graph: OpGraph, groups: list[FusionGroup], options: CodegenOptions | None = None) -> Lowering:
    """Lower every group, raising :class:`Unsupported` with all the problems found."""
    lowerer = _Lowerer(graph, groups, options or CodegenOptions())
    low = lowerer.lower()
    if lowerer.problems:
        raise Unsupported("; ".join(lowerer.problems), frozenset(lowerer.failing_ops), tuple(lowerer.failed))
    gemms = [x.gemm for g in low.groups for x in g.launches() if x.gemm is not None]
    table = low.machine.table.label
    for lg in low.groups:  # the products placed where they were made (lower_gemm.place_product)
        placed = [x.gemm for x in lg.launches() if x.gemm is not None and x.gemm.placed]
        if ways := [way for g in placed if (way := library_way(g))]:
            lg.describe += f" [{len(ways)} of its products via {', '.join(dict.fromkeys(ways))}]"
        if placed:
            lg.describe += (f" [cost model, {table}: its {len(placed)} products "
                            f"{sum(g.estimate.ms for g in placed):.3f} ms est.]")
    low.estimates = [g.estimate for g in gemms if g.estimate is not None] + \
        [c.estimate for c in low.convs if c.estimate is not None]
    for gemm in gemms:
        if uses_batch_ptrs(gemm):
            reserve_scratch(low, BATCH_PTRS, 6 * gemm.outer * gemm.batch)
    low.uses_blas = any(g.lt is None and g.cutlass is None and g.split is None and not tiny(g) for g in gemms)
    if lowerer.cx.options.pack_weights:
        hoist(low, static_values(graph))
    merge_siblings(low)
    return low


def supported(graph: OpGraph, groups: list[FusionGroup]) -> list[str]:
    """The reasons the offline Coder cannot generate this graph (empty when it can)."""
    try:
        lowerer = _Lowerer(graph, groups, CodegenOptions())
    except Unsupported as exc:
        return [str(exc)]
    lowerer.lower()
    return lowerer.problems
