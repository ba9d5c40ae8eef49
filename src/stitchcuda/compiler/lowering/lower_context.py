"""The state the fused lowerings share while a graph is lowered: the graph, the program lowered
so far (buffers and which value lives where), and how a group's operands read as IR expressions."""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import Node, OpGraph
from stitchcuda.compiler.ir.data_movement import GATHER_OPS, POOL_OPS, cat_expr, gather_expr, pool_expr
from stitchcuda.compiler.ir.expr import Expr, Leaf, Unsupported, leaf
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import C_TYPES, SPLITS
from stitchcuda.compiler.lowering.cost import this_machine
from stitchcuda.compiler.lowering.lowered import CodegenOptions, Lowering, to_ident


class LowerContext:
    """What every lowering of a group reads and extends; one per lowering of a graph."""

    def __init__(self, graph: OpGraph, options: CodegenOptions):
        self.graph, self.options = graph, options
        self.nodes = {n.name: n for n in graph.nodes}
        try:
            machine = this_machine(options.gpu)
        except ValueError as exc:
            raise Unsupported(str(exc)) from None
        self.out = Lowering(graph=graph, machine=machine)
        self.users = graph.users()
        for value in graph.mutations:  # written back into a module buffer after the forward
            self.users.setdefault(graph.getitems.get(value, (value, 0))[0], []).append("<buffer write-back>")
            self.users.setdefault(value, []).append("<buffer write-back>")
        # recurrent cells whose x.W_ih^T is one GEMM for all steps (lower_recurrent.batch_recurrent_inputs):
        # cell -> (all-steps gate buffer, t, x, W_ih)
        self.batched: dict[str, tuple[str, int, str, Any]] = {}

    def shape(self, value: str) -> tuple[int, ...]:
        meta = self.graph.meta(value)
        if meta is None:
            raise Unsupported(f"{value} has no tensor shape")
        return tuple(meta.shape)

    def outputs_of(self, group: FusionGroup) -> list[str]:
        inside = set(group.nodes)
        outs = []
        for n in group.nodes:
            if n in self.graph.outputs or any(u not in inside for u in self.users.get(n, [])):
                if self.nodes[n].op in SPLITS:
                    raise Unsupported(f"{n} ({self.nodes[n].op}) is read outside its group")
                if self.nodes[n].out[0].dtype not in C_TYPES:
                    raise Unsupported(f"{n} ({self.nodes[n].op}) of dtype {self.nodes[n].out[0].dtype} is read "
                                      "outside its group")
                outs.append(n)
        return outs

    def split(self, n: Node, env: dict[str, Expr]) -> None:
        """A split/chunk/unbind: each getitem becomes a slice (or select) of the input's read."""
        x = self.arg(env, f"{n.name} ({n.op})")(n.args[0])
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

    def data_expr(self, n: Node, arg: Any) -> Expr:
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

    def buffer(self, value: str) -> str:
        """Give a group output its buffer: a fresh output tensor or a cached intermediate."""
        if value in self.out.storage:
            return self.out.storage[value]
        ident = ("o_" if value in self.graph.outputs else "b_") + to_ident(value)
        taken = set(self.out.storage.values())
        while ident in taken:
            ident += "_"
        self.out.storage[value] = ident
        meta = self.graph.meta(value)
        if meta is not None and meta.dtype != "float32" and meta.dtype in C_TYPES:
            self.out.ctypes[ident] = C_TYPES[meta.dtype]  # an index, a position, a mask between groups
        if value in self.graph.outputs:
            self.out.outputs.append((value, ident, list(self.shape(value))))
        else:
            self.out.intermediates.append((ident, list(self.shape(value))))
        return ident

    def scratch(self, value: str, shape: Any) -> str:
        """A buffer of the program's own for a value the graph does not name (a library call's raw
        result, a patch copy): ``b_<value>``, registered as an intermediate of ``shape``."""
        ident = f"b_{to_ident(value)}"
        self.out.intermediates.append((ident, list(shape)))
        self.out.storage[value] = ident
        return ident

    def arg(self, env: dict[str, Expr], where: str):
        def resolve(a: Any) -> Expr:
            if isinstance(a, str) and a.startswith("%"):
                name = a[1:]
                if name in env:
                    return env[name]
                if name not in self.out.storage:
                    raise Unsupported(f"{where}: {name} is read before it is computed")
                if name in self.out.layouts:  # a part of another value's buffer
                    strides, offset = self.out.layouts[name]
                    return leaf(name, self.shape(name), strides, offset)
                return leaf(name, self.shape(name))
            if isinstance(a, bool) or not isinstance(a, (int, float)):
                raise Unsupported(f"{where}: unsupported operand {a!r}")
            return Expr("const", const=float(a))
        return resolve
