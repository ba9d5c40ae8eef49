"""Fusion groups: which operators of the captured graph become one kernel (or one library call).

The offline Planner decides the groups; the offline Coder generates one kernel (or library call
plus fused epilogue) per group.

Note: how ``fuse`` groups a graph
---------------------------------
The graph is cut the way a CUDA engineer rewriting the whole forward would cut it, in phases
over the nodes in graph order; a node belongs to the first group that claims it:

1. ``attention``: ``matmul/bmm -> (elementwise: scale, mask) -> softmax(last dim) -> matmul/bmm``
   chains with single consumers become one flash-attention style group; elementwise producers of
   its operands (a query scale, the mask's preparation) and the view/copy chain that lays out its
   output (``transpose -> reshape``) join it. ``scaled_dot_product_attention`` is one such group.
2. ``recurrent``: every ``lstm_cell`` / ``gru_cell`` (one time step; the note says whether the input
   GEMMs of all steps can be batched) and every whole-sequence ``lstm`` / ``gru`` is its own group.
3. ``gemm`` / ``conv``: a GEMM-like or convolution anchor absorbs the single-consumer elementwise
   chain after it (activations, residual adds, scales, casts; eval-mode ``batch_norm``, a
   per-channel affine, is folded there too unless ``fold_batch_norm=False``), passing through
   layout-preserving views (reshape, unsqueeze, ...) of contiguous values.
4. ``row_reduce``: a reduction or normalisation over rows (softmax, log_softmax, layer_norm,
   group_norm, mean/sum/amax over trailing dims, training-mode batch_norm) absorbs elementwise
   producers of full row shape (a residual add it then also writes out), and every following
   elementwise op, ``gather`` along the row, or further reduction over the same rows: so
   ``x*x -> mean -> +eps -> rsqrt -> x*r*w`` (RMSNorm) or layer_norm -> softmax -> rms chains
   become one row kernel.
5. ``elementwise``: leftover elementwise ops, connected ones merged into one pass.
6. ``other``: operators no phase fuses (pooling, upsampling, ...), one node per group.
7. Free views (strided reinterpretations: transpose, permute, select, split, expand, unsqueeze,
   reshape of a viewable tensor, ...) and constants (``new_zeros``) are attached to the one group
   that reads them (listed in ``views``, said in ``note``).
8. ``data_movement``: the rest of the shape/copy ops (cat, stack, embedding, index, reshapes that
   must copy, views several groups read or the forward returns), connected ones merged.

Every merge is checked so that the groups, as units, still form a DAG; the groups are returned in
a topological order that follows the graph's order where it can. A value read outside its group
(or returned) is in the group's ``outputs``: a fused epilogue only ever runs through values with
one consumer, while the row kernels may expose an intermediate (the residual stream) they write.
"""

from __future__ import annotations

import heapq
from typing import Any, Literal

from pydantic import BaseModel, Field

from stitchcuda.compiler.graph import Node, OpGraph

GroupKind = Literal["gemm", "conv", "row_reduce", "elementwise", "recurrent", "attention", "data_movement", "other"]


class FusionGroup(BaseModel):
    id: int
    kind: GroupKind
    anchor: str | None = Field(None, description="the node that defines the group: linear, conv2d, softmax, "
                                                 "layer_norm, lstm_cell, ...; None for pure elementwise chains")
    epilogue: list[str] = Field([], description="elementwise nodes fused after the anchor, in graph order")
    nodes: list[str] = Field(description="every node of the group, in graph order")
    inputs: list[str] = Field([], description="graph values the group reads from outside itself")
    outputs: list[str] = Field([], description="values of the group read by other groups or returned")
    note: str = ""
    prologue: list[str] = Field([], description="nodes fused before the anchor (elementwise producers, a "
                                                "recurrent cell's input concat), in graph order")
    views: list[str] = Field([], description="nodes that move no data: views read through strides, "
                                             "constants such as new_zeros")
    roles: dict[str, str] = Field({}, description="named parts of a pattern: attention's qk, scale, mask, "
                                                  "softmax, pv")


# -- operator classes -------------------------------------------------------------------------------

GEMM_OPS = {"aten.linear", "aten.matmul", "aten.bmm", "aten.mm", "aten.addmm", "aten.baddbmm", "aten.addbmm"}
CONV_OPS = {"aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.conv_transpose1d", "aten.conv_transpose2d",
            "aten.conv_transpose3d", "aten.convolution", "aten._convolution"}
RECURRENT_OPS = {"aten.lstm_cell", "aten.gru_cell", "aten.rnn_tanh_cell", "aten.rnn_relu_cell"}
RECURRENT_SEQUENCE_OPS = {"aten.lstm", "aten.gru", "aten.rnn_tanh", "aten.rnn_relu"}  # whole nn.LSTM/GRU/RNN
SDPA_OPS = {"aten.scaled_dot_product_attention", "aten._scaled_dot_product_flash_attention",
            "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention"}
SOFTMAX_OPS = {"aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax"}
NORM_OPS = {"aten.layer_norm", "aten.rms_norm", "aten.group_norm", "aten.batch_norm"}
SUM_OPS = {"aten.mean", "aten.sum", "aten.amax", "aten.amin", "aten.logsumexp", "aten.var", "aten.std",
           "aten.prod", "aten.linalg_vector_norm", "aten.norm"}
ELEMENTWISE_OPS = {
    "aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.div", "aten.neg", "aten.abs", "aten.pow", "aten.sqrt",
    "aten.rsqrt", "aten.reciprocal", "aten.square", "aten.exp", "aten.exp2", "aten.expm1", "aten.log",
    "aten.log1p", "aten.log2", "aten.sin", "aten.cos", "aten.erf", "aten.sign", "aten.floor", "aten.ceil",
    "aten.round", "aten.relu", "aten.relu6", "aten.gelu", "aten.silu", "aten.sigmoid", "aten.tanh",
    "aten.hardtanh", "aten.hardswish", "aten.hardsigmoid", "aten.leaky_relu", "aten.elu", "aten.selu",
    "aten.celu", "aten.softplus", "aten.mish", "aten.clamp", "aten.clamp_min", "aten.clamp_max",
    "aten.maximum", "aten.minimum", "aten.where", "aten.masked_fill", "aten.bitwise_not", "aten.bitwise_and",
    "aten.bitwise_or", "aten.logical_not", "aten.logical_and", "aten.logical_or", "aten.eq", "aten.ne",
    "aten.lt", "aten.le", "aten.gt", "aten.ge", "aten.lerp", "aten.addcmul", "aten.addcdiv", "aten.dropout",
    "aten._to_copy", "aten.to", "aten.type_as", "aten.fill",
}
# Views: no data moves when the consumer reads through strides.
VIEW_OPS = {"aten.reshape", "aten.view", "aten._unsafe_view", "aten.flatten", "aten.unflatten", "aten.transpose",
            "aten.t", "aten.permute", "aten.select", "aten.slice", "aten.narrow", "aten.split",
            "aten.split_with_sizes", "aten.chunk", "aten.unbind", "aten.unsqueeze", "aten.squeeze",
            "aten.expand", "aten.expand_as", "aten.alias", "aten.detach", "aten.view_as", "aten.movedim",
            "aten.as_strided"}
# Views that keep a contiguous tensor contiguous (an epilogue may run through them).
LAYOUT_VIEWS = {"aten.reshape", "aten.view", "aten._unsafe_view", "aten.flatten", "aten.unflatten",
                "aten.unsqueeze", "aten.squeeze", "aten.alias", "aten.detach", "aten.view_as"}
CONST_OPS = {"aten.new_zeros", "aten.new_ones", "aten.new_full", "aten.new_empty", "aten.zeros", "aten.ones",
             "aten.full", "aten.empty", "aten.zeros_like", "aten.ones_like", "aten.full_like", "aten.empty_like",
             "aten.scalar_tensor", "aten.arange"}
COPY_OPS = {"aten.cat", "aten.concat", "aten.stack", "aten.clone", "aten.contiguous", "aten.copy", "aten.index",
            "aten.index_select", "aten.gather", "aten.embedding", "aten.repeat", "aten.roll", "aten.flip",
            "aten.constant_pad_nd", "aten.pad", "aten.tril", "aten.triu", "aten.scatter", "aten.index_put"}

# What the fused lowerings (lower_*.py) take (a family lowering takes the rest, and the cases of
# these they cannot: see row_lowerable).
KNOWN_FUSED = (GEMM_OPS | CONV_OPS | RECURRENT_OPS
               | RECURRENT_SEQUENCE_OPS | SDPA_OPS | SOFTMAX_OPS | NORM_OPS | SUM_OPS | ELEMENTWISE_OPS | VIEW_OPS
               | CONST_OPS | {"aten.max_pool2d", "aten.avg_pool2d", "aten.cat", "aten.stack", "aten.embedding",
                              "aten.gather", "aten.index", "aten.clone", "aten.contiguous"})

Role = Literal["gemm", "conv", "attention", "reduce", "recurrent", "elementwise", "view", "const", "copy", "other"]


MAX_ROW = 32768  # the longest row the fused row kernel keeps in registers


def row_lowerable(node: Node, in_shape: list[int] | None) -> bool:
    """Whether the fused row kernel takes this reduction: over trailing dims, rows of at most
    ``MAX_ROW`` elements. Anything else goes to its family lowering (any dims, any length)."""
    if in_shape is None:
        return True
    geo = reduce_geometry(node, in_shape)
    if geo is None:
        return True
    shape, dims, extra = geo
    rank = len(shape)
    if node.op == "aten.group_norm":
        groups = int(node.args[1]) if len(node.args) > 1 else 1
        return rank >= 2 and shape[1] % groups == 0 and _numel(shape[1:]) // groups <= MAX_ROW
    if extra:
        return True
    if not dims:
        return True
    from stitchcuda.compiler.expr import ROW_OPS

    if node.op in SUM_OPS and (node.op not in ROW_OPS or list(dims) != [rank - 1]):
        return False  # the row kernel reduces the last dim alone, by sum, mean or amax
    if list(dims) != list(range(rank - len(dims), rank)):
        return False
    return _numel([shape[d] for d in dims]) <= MAX_ROW


def _numel(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def op_role(node: Node, fold_batch_norm: bool = True, in_shape: list[int] | None = None) -> Role:
    """What kind of work a node is, for fusion (``in_shape``: its first input's shape, when known)."""
    from stitchcuda.compiler.expr import POOL_OPS, pool_fusable
    from stitchcuda.compiler.families import FAMILIES

    op = node.op
    if op in FAMILIES and (op not in KNOWN_FUSED or not row_lowerable(node, in_shape)
                           or (op in POOL_OPS and not pool_fusable(node, in_shape))):
        return "other"  # its family lowering, one group of its own
    if op in GEMM_OPS:
        return "gemm"
    if op in CONV_OPS:
        return "conv"
    if op in RECURRENT_OPS or op in RECURRENT_SEQUENCE_OPS:
        return "recurrent"
    if op in SDPA_OPS:
        return "attention"
    if op == "aten.batch_norm":
        training = bool(node.args[5]) if len(node.args) > 5 else False
        return "elementwise" if fold_batch_norm and not training else "reduce"
    if op in SOFTMAX_OPS or op in NORM_OPS or op in SUM_OPS:
        return "reduce" if len(node.out) == 1 else "other"
    if op in ELEMENTWISE_OPS:
        return "elementwise" if len(node.out) == 1 else "other"
    if op in VIEW_OPS:
        return "view"
    if op in CONST_OPS:
        return "const"
    if op in COPY_OPS:
        return "copy"
    return "other"


def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _dims(value: Any, rank: int) -> list[int]:
    if isinstance(value, int):
        return [_norm_dim(value, rank)]
    return sorted(_norm_dim(int(d), rank) for d in (value or []))


def reduce_geometry(node: Node, in_shape: list[int]) -> tuple[tuple[int, ...], tuple[int, ...], str] | None:
    """(input shape, reduced dims, extra) of a row reduction; equal geometries share rows."""
    rank = len(in_shape)
    op, args = node.op, node.args
    if op in SOFTMAX_OPS:
        dims = _dims(args[1] if len(args) > 1 else node.kwargs.get("dim", -1), rank)
    elif op in ("aten.layer_norm", "aten.rms_norm"):
        dims = list(range(rank - len(args[1]), rank))
    elif op == "aten.group_norm":
        return tuple(in_shape), tuple(range(1, rank)), f"groups={args[1]}"
    elif op == "aten.batch_norm":
        return tuple(in_shape), tuple(d for d in range(rank) if d != 1), "channels"
    elif op in SUM_OPS:
        at = 2 if op in ("aten.linalg_vector_norm", "aten.norm") else 1  # dims come after ord / p there
        whole = op in ("aten.var", "aten.std") and node.overload == "default"  # (self, unbiased)
        raw = None if whole else args[at] if len(args) > at else node.kwargs.get("dim")
        dims = list(range(rank)) if raw is None or raw == [] else _dims(raw, rank)
    else:
        return None
    return tuple(in_shape), tuple(dims), ""


def stat_shapes(geometry: tuple[tuple[int, ...], tuple[int, ...], str]) -> list[list[int]]:
    """Shapes of per-row values (the reduced dims kept as 1, or dropped)."""
    shape, dims, extra = geometry
    if extra:
        return []
    kept = [1 if i in dims else s for i, s in enumerate(shape)]
    dropped = [s for i, s in enumerate(shape) if i not in dims]
    return [kept, dropped]


def reshape_strides(shape: list[int], strides: list[int], new_shape: list[int]) -> list[int] | None:
    """Strides of ``reshape(new_shape)`` as a view, or None when the reshape has to copy."""
    if not shape:
        return _contiguous(new_shape)
    numel = 1
    for s in shape:
        numel *= s
    if numel == 0:
        return _contiguous(new_shape)
    new = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    base = strides[-1]
    tensor_numel, view_numel = 1, 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        # A chunk of dims that is contiguous in memory ends where the next dim's stride breaks it.
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new[view_d] = view_numel * base
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base = strides[d - 1]
                tensor_numel, view_numel = 1, 1
    return new if view_d == -1 else None


def _contiguous(shape: list[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return list(reversed(strides))


def short(op: str) -> str:
    return op.split(".", 1)[-1]


# -- the fuser ---------------------------------------------------------------------------------------

class _Group:
    def __init__(self, kind: GroupKind, anchor: str | None):
        self.kind: GroupKind = kind
        self.anchor = anchor
        self.members: set[str] = set()
        self.roles: dict[str, str] = {}
        self.notes: list[str] = []
        self.layout: list[str] = []  # nodes whose layout change the group's kernel writes directly


class _Fuser:
    def __init__(self, graph: OpGraph, fold_batch_norm: bool):
        self.graph = graph
        self.fold = fold_batch_norm
        self.nodes = graph.nodes
        self.node = {n.name: n for n in graph.nodes}
        self.index = {n.name: i for i, n in enumerate(graph.nodes)}
        self.placeholders = {p.name for p in graph.placeholders}
        self.returned = set(graph.outputs)
        self.values: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
        self.producer: dict[str, str] = {n.name: n.name for n in graph.nodes}
        self.meta: dict[str, Any] = {p.name: p.meta for p in graph.placeholders}
        for value, (src, i) in graph.getitems.items():
            self.producer[value] = src
            self.values[src].append(value)
            self.meta[value] = self.node[src].out[i] if i < len(self.node[src].out) else None
        for n in graph.nodes:
            if not self.values[n.name]:
                self.values[n.name] = [n.name]
            self.meta[n.name] = n.out[0] if n.out else None
        self.reads: dict[str, list[str]] = {}
        self.consumers: dict[str, list[str]] = {}
        for n in graph.nodes:
            reads = list(dict.fromkeys(v for v in n.inputs() if v in self.producer or v in self.placeholders))
            self.reads[n.name] = reads
            for v in reads:
                self.consumers.setdefault(v, []).append(n.name)
        self.preds = {n.name: sorted({self.producer[v] for v in self.reads[n.name] if v in self.producer},
                                     key=self.index.__getitem__) for n in graph.nodes}
        self.role = {n.name: op_role(n, fold_batch_norm, self._first_shape(n)) for n in graph.nodes}
        from stitchcuda.compiler.families.layout_typed import claims  # integer/bool work, casts, constants

        for n in graph.nodes:
            if claims(n, lambda v: self.meta[v].dtype if self.meta.get(v) is not None else None,
                      lambda v: [self.node[u] for u in self.consumers.get(v, [])]):
                self.role[n.name] = "other"
        self.strides = self._strides()
        self.owner: dict[str, int] = {}
        self.groups: dict[int, _Group] = {}

    # -- values and shapes

    def _first_shape(self, n: Node) -> list[int] | None:
        first = next(iter(n.inputs()), None)
        meta = self.meta.get(first) if first else None
        return list(meta.shape) if meta is not None else None

    def shape(self, value: str) -> list[int] | None:
        meta = self.meta.get(value)
        return list(meta.shape) if meta is not None else None

    def out_shape(self, name: str) -> list[int] | None:
        return self.shape(self.values[name][0]) if self.values[name] else None

    def users(self, name: str) -> list[str]:
        """Nodes reading any value of node ``name``."""
        found: list[str] = []
        for v in self.values[name]:
            found.extend(self.consumers.get(v, []))
        return list(dict.fromkeys(found))

    def returned_from(self, name: str) -> bool:
        return any(v in self.returned for v in self.values[name])

    def _strides(self) -> dict[str, list[int] | None]:
        """Strides of every value when every kernel writes contiguous outputs; None: not a view."""
        strides: dict[str, list[int] | None] = {}
        for name, meta in self.meta.items():
            if meta is not None and name in self.placeholders:
                strides[name] = _contiguous(meta.shape)
        for n in self.nodes:
            for v in self.values[n.name]:
                meta = self.meta.get(v)
                strides[v] = _contiguous(meta.shape) if meta is not None else None
            if self.role[n.name] == "view":
                src = self.reads[n.name][0] if self.reads[n.name] else None
                for v in self.values[n.name]:
                    strides[v] = self._view_strides(n, src, strides.get(src) if src else None, v)
        return strides

    def _view_strides(self, n: Node, src: str | None, st: list[int] | None, value: str) -> list[int] | None:
        shape, new = (self.shape(src) if src else None), self.shape(value)
        if st is None or shape is None or new is None:
            return None
        op, args = n.op, n.args
        rank = len(shape)
        try:
            if op in ("aten.transpose",):
                a, b = _norm_dim(args[1], rank), _norm_dim(args[2], rank)
                out = list(st)
                out[a], out[b] = out[b], out[a]
                return out
            if op == "aten.t":
                return list(reversed(st))
            if op == "aten.permute":
                return [st[_norm_dim(d, rank)] for d in args[1]]
            if op in ("aten.select", "aten.unbind"):
                d = _norm_dim(args[1] if len(args) > 1 else 0, rank)
                return st[:d] + st[d + 1:]
            if op in ("aten.slice", "aten.narrow", "aten.split", "aten.split_with_sizes", "aten.chunk"):
                if op == "aten.slice" and len(args) > 4 and args[4] not in (None, 1):
                    d = _norm_dim(args[1], rank)
                    return [s * int(args[4]) if i == d else s for i, s in enumerate(st)]
                return list(st)
            if op in ("aten.alias", "aten.detach"):
                return list(st)
            if op in ("aten.expand", "aten.expand_as"):
                lead = len(new) - rank
                return [0] * lead + [0 if shape[i] == 1 and new[lead + i] != 1 else st[i] for i in range(rank)]
            if op == "aten.as_strided":
                return [int(s) for s in args[2]]
        except (IndexError, TypeError, ValueError):
            return None
        return reshape_strides(shape, st, new)  # reshape, view, flatten, unsqueeze, squeeze, ...

    def free_view(self, name: str) -> bool:
        return self.role[name] == "view" and all(self.strides.get(v) is not None for v in self.values[name])

    def is_dm(self, name: str) -> bool:
        return self.role[name] in ("view", "const", "copy")

    # -- groups

    def new(self, kind: GroupKind, anchor: str | None, members: list[str]) -> int | None:
        gid = len(self.groups)
        group = _Group(kind, anchor)
        self.groups[gid] = group
        if not self.add(gid, members):
            del self.groups[gid]
            return None
        return gid

    def add(self, gid: int, names: list[str]) -> bool:
        """Put unclaimed nodes into a group when the groups stay a DAG; False (and nothing changed) if not."""
        names = [n for n in dict.fromkeys(names) if self.owner.get(n) != gid]
        if any(n in self.owner for n in names):
            return False
        for n in names:
            self.owner[n] = gid
        if self._acyclic():
            self.groups[gid].members.update(names)
            return True
        for n in names:
            del self.owner[n]
        return False

    def _acyclic(self) -> bool:
        unit = {n.name: self.owner.get(n.name, -1 - i) for i, n in enumerate(self.nodes)}
        succ: dict[int, set[int]] = {}
        indeg: dict[int, int] = {u: 0 for u in unit.values()}
        for n in self.nodes:
            b = unit[n.name]
            for p in self.preds[n.name]:
                a = unit[p]
                if a != b and b not in succ.setdefault(a, set()):
                    succ[a].add(b)
                    indeg[b] += 1
        ready = [u for u, d in indeg.items() if d == 0]
        seen = 0
        while ready:
            u = ready.pop()
            seen += 1
            for w in succ.get(u, ()):
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
        return seen == len(indeg)

    def free(self, name: str) -> bool:
        return name not in self.owner

    def group_values(self, gid: int) -> set[str]:
        return {v for n in self.groups[gid].members for v in self.values[n]}

    # -- phase 1: attention

    def attention(self) -> None:
        for n in self.nodes:
            if self.role[n.name] == "attention" and self.free(n.name):
                gid = self.new("attention", n.name, [n.name])
                if gid is not None:
                    self.groups[gid].roles = {"sdpa": n.name}
                    causal = n.kwargs.get("is_causal") or (len(n.args) > 5 and n.args[5] is True)
                    self.groups[gid].notes.append(
                        f"{short(n.op)}{' (causal)' if causal else ''} as one flash-attention style kernel")
        for s in self.nodes:
            if s.op not in SOFTMAX_OPS or s.op.endswith("log_softmax") or not self.free(s.name):
                continue
            shape = self.out_shape(s.name)
            geo = reduce_geometry(s, self.shape(self.reads[s.name][0]) or []) if self.reads[s.name] else None
            if shape is None or geo is None or geo[1] != (len(shape) - 1,):
                continue
            chain: list[str] = []
            cur = self.producer.get(self.reads[s.name][0])
            while cur is not None and self.free(cur) and self.role[cur] == "elementwise" \
                    and len(self.users(cur)) == 1 and not self.returned_from(cur):
                chain.insert(0, cur)
                main = [v for v in self.reads[cur] if self.shape(v) == self.out_shape(cur)]
                cur = self.producer.get(main[0]) if main else None
            if cur is None or self.node[cur].op not in ("aten.matmul", "aten.bmm") or not self.free(cur) \
                    or len(self.users(cur)) != 1 or self.returned_from(cur):
                continue
            qk = cur
            pv_users = self.users(s.name)
            if len(pv_users) != 1 or self.returned_from(s.name):
                continue
            pv = pv_users[0]
            if self.node[pv].op not in ("aten.matmul", "aten.bmm") or self.reads[pv][:1] != [s.name] \
                    or not self.free(pv):
                continue
            gid = self.new("attention", s.name, [qk, *chain, s.name, pv])
            if gid is None:
                continue
            group = self.groups[gid]
            group.roles = {"qk": qk, "softmax": s.name, "pv": pv}
            for c in chain:
                op = self.node[c].op
                if op in ("aten.mul", "aten.div") and "scale" not in group.roles:
                    group.roles["scale"] = c
                elif op in ("aten.masked_fill", "aten.where", "aten.add") and "mask" not in group.roles:
                    group.roles["mask"] = c
            self.absorb_producers(gid, lambda p: self.role[p] == "elementwise")
            for p in (qk, pv):  # a scaled query or key: the scale moves into the kernel
                for v in self.reads[p]:
                    q = self.producer.get(v)
                    if q and self.free(q) and self.role[q] == "elementwise" and self.users(q) == [p]:
                        self.add(gid, [q])
                    if q and self.owner.get(q) == gid and self.node[q].op in ("aten.mul", "aten.div"):
                        group.roles.setdefault("scale", q)
            # The output's layout change (transpose -> reshape) is written by the kernel directly.
            tail, path = pv, []
            while len(self.users(tail)) == 1 and not self.returned_from(tail):
                nxt = self.users(tail)[0]
                if not self.free(nxt) or self.role[nxt] not in ("view", "copy") or \
                        self.node[nxt].op not in VIEW_OPS | {"aten.clone", "aten.contiguous"}:
                    break
                path.append(nxt)
                tail = nxt
            if any(not self.free_view(p) for p in path) and self.add(gid, path):
                group.layout = path
                group.notes.append(f"writes its output directly in the layout of {path[-1]} "
                                   f"{self.out_shape(path[-1])} ({' -> '.join(short(self.node[p].op) for p in path)})")
            scale = group.roles.get("scale")
            group.notes.insert(0, "Q·Kᵀ -> " + (f"scale ({short(self.node[scale].op)}) -> " if scale else "")
                               + ("mask -> " if "mask" in group.roles else "")
                               + "softmax -> ·V as one flash-attention style kernel: the "
                               f"{self.out_shape(s.name)} scores never reach memory")

    def absorb_producers(self, gid: int, ok: Any, full: list[int] | None = None, expose: bool = False) -> None:
        """Pull in unclaimed producers (recursively) that ``ok`` accepts; without ``expose`` only those
        whose every reader is in the group."""
        changed = True
        while changed:
            changed = False
            members = sorted(self.groups[gid].members, key=self.index.__getitem__)
            for m in members:
                for p in self.preds[m]:
                    if not self.free(p) or not ok(p) or (full is not None and self.out_shape(p) != full):
                        continue
                    inside = all(self.owner.get(u) == gid for u in self.users(p)) and not self.returned_from(p)
                    if (inside or expose) and self.add(gid, [p]):
                        changed = True

    # -- phase 2: recurrent cells

    def recurrent(self) -> None:
        cells = [n for n in self.nodes if self.role[n.name] == "recurrent" and n.op in RECURRENT_OPS]
        by_weight: dict[str, list[str]] = {}
        for n in cells:
            by_weight.setdefault(str(n.args[2]) if len(n.args) > 2 else n.name, []).append(n.name)
        ancestors = self._ancestors() if cells else {}
        for n in self.nodes:
            if self.role[n.name] != "recurrent" or not self.free(n.name):
                continue
            gid = self.new("recurrent", n.name, [n.name])
            if gid is None:
                continue
            where = f" [{n.module}]" if n.module else ""
            if n.op in RECURRENT_SEQUENCE_OPS:
                self.groups[gid].notes.append(
                    f"the whole {short(n.op)} sequence{where} (every layer and time step): per layer, the input "
                    "GEMM of all steps batched into one GEMM, then one fused step kernel per time step "
                    "(h·W_hhᵀ plus the gates), or a persistent kernel keeping W_hh on chip")
                continue
            weight = str(n.args[2]).lstrip("%") if len(n.args) > 2 else "?"
            steps = by_weight.get(str(n.args[2]) if len(n.args) > 2 else n.name, [n.name])
            x = self.producer.get(self.reads[n.name][0]) if self.reads[n.name] else None
            sibling = {self.index[c] for c in steps}
            dependent = x is not None and (x in steps or any((ancestors[x] >> i) & 1 for i in sibling))
            layered = x is not None and (self.role[x] == "recurrent" or any(
                (ancestors[x] >> self.index[c]) & 1 for c in self.node if self.role[c] == "recurrent"))
            gates = {"aten.lstm_cell": "4 gates'", "aten.gru_cell": "3 gates'"}.get(n.op, "")
            text = (f"one time step ({steps.index(n.name) + 1}/{len(steps)}) of {short(n.op)}{where}, "
                    f"weights {weight}: h·W_hhᵀ and the {gates} nonlinearities fused in the step kernel")
            if dependent:
                text += "; its input depends on the recurrence, so the input GEMM stays in the step"
            elif layered:
                text += (f"; its input comes from another recurrent layer: run layer by layer, and the input "
                         f"GEMMs x_t·W_ihᵀ of all {len(steps)} steps become one GEMM once that layer has run")
            else:
                text += (f"; the input GEMMs x_t·W_ihᵀ of all {len(steps)} steps do not depend on the "
                         "recurrence and can be batched into one GEMM before the loop")
            self.groups[gid].notes.append(text)

    def _ancestors(self) -> dict[str, int]:
        anc: dict[str, int] = {}
        for n in self.nodes:
            bits = 0
            for p in self.preds[n.name]:
                bits |= anc[p] | (1 << self.index[p])
            anc[n.name] = bits
        return anc

    # -- phase 3: GEMM and convolution epilogues

    def anchors(self) -> None:
        for n in self.nodes:
            role = self.role[n.name]
            if role not in ("gemm", "conv") or not self.free(n.name):
                continue
            gid = self.new("gemm" if role == "gemm" else "conv", n.name, [n.name])
            if gid is None:
                continue
            numel = self._numel(self.out_shape(n.name))
            tail, pending = n.name, []
            while True:
                users = self.users(tail)
                if len(users) != 1 or not self.free(users[0]):
                    break
                c = users[0]
                if self.node[c].op in LAYOUT_VIEWS and self.free_view(c) and len(self.values[c]) == 1 \
                        and self._numel(self.out_shape(c)) == numel:
                    pending.append(c)
                    tail = c
                    continue
                if self.role[c] != "elementwise" or self._numel(self.out_shape(c)) != numel:
                    break
                if not self.add(gid, [*pending, c]):
                    break
                pending, tail = [], c

    @staticmethod
    def _numel(shape: list[int] | None) -> int:
        n = 1
        for d in shape or []:
            n *= d
        return n

    # -- phase 4: row reductions and normalisations

    def rows(self) -> None:
        for n in self.nodes:
            if self.role[n.name] != "reduce" or not self.free(n.name) or not self.reads[n.name]:
                continue
            full = self.shape(self.reads[n.name][0])
            geo = reduce_geometry(n, full or [])
            if full is None or geo is None:
                continue
            gid = self.new("row_reduce", n.name, [n.name])
            if gid is None:
                continue
            self.absorb_producers(gid, lambda p: self.role[p] == "elementwise", full=full, expose=True)
            stats = stat_shapes(geo)
            self.grow(gid, lambda c, i=gid, g=geo, f=full, st=stats: self._row_ok(c, i, g, f, st))
            self.groups[gid].notes.append(self._row_note(gid, geo))

    def _row_ok(self, c: str, gid: int, geo: Any, full: list[int], stats: list[list[int]]) -> bool:
        role, shape = self.role[c], self.out_shape(c)
        members = self.groups[gid].members
        if role == "elementwise":
            return shape == full or shape in stats
        if role == "reduce":
            src = self.reads[c][0] if self.reads[c] else None
            return src is not None and self.producer.get(src) in members and \
                reduce_geometry(self.node[c], self.shape(src) or []) == geo
        if self.node[c].op == "aten.gather":
            src = self.reads[c][0]
            dim = _norm_dim(int(self.node[c].args[1]), len(full))
            return self.producer.get(src) in members and self.shape(src) == full and \
                geo[1] == (dim,) and shape in stats
        if self.node[c].op in LAYOUT_VIEWS and self.free_view(c):
            return shape == full or shape in stats
        return False

    def grow(self, gid: int, ok: Any) -> None:
        """Add, in graph order, unclaimed readers of the group's values that ``ok`` accepts."""
        rejected: set[str] = set()
        while True:
            members = self.groups[gid].members
            candidates = sorted({u for m in members for u in self.users(m)
                                 if self.free(u) and u not in rejected}, key=self.index.__getitem__)
            for c in candidates:
                if ok(c) and self.add(gid, [c]):
                    break
                rejected.add(c)
            else:
                return

    def _row_note(self, gid: int, geo: Any) -> str:
        shape, dims, extra = geo
        length = self._numel([shape[d] for d in dims])
        reductions = [m for m in self._ordered(gid) if self.role[m] == "reduce"]
        what = ", ".join(short(self.node[m].op) for m in reductions)
        if extra.startswith("groups"):
            rows = f"{shape[0]}×{extra.split('=')[1]} groups of {length // int(extra.split('=')[1] or 1)}"
        elif extra == "channels":
            rows = f"{shape[1] if len(shape) > 1 else 1} channels of {length} (batch statistics)"
        else:
            count = self._numel(list(shape)) // max(length, 1)
            rows = f"{count} row{'s' if count != 1 else ''} of {length}"
            if dims and dims[-1] != len(shape) - 1:
                rows += " (strided rows)"
        return f"{rows}: {what} in one row kernel (warp/block per row, the row kept on chip)"

    # -- phase 5: elementwise chains

    def elementwise(self) -> None:
        for n in self.nodes:
            if self.role[n.name] != "elementwise" or not self.free(n.name):
                continue
            gid = self.new("elementwise", None, [n.name])
            if gid is None:
                continue
            shape = self.out_shape(n.name)
            self.absorb_producers(gid, lambda p: self.role[p] == "elementwise")
            self.grow(gid, lambda c, s=shape: self.role[c] == "elementwise" and self.out_shape(c) == s)
            self.absorb_producers(gid, lambda p: self.role[p] == "elementwise")
            self.groups[gid].notes.append(f"{len(self.groups[gid].members)} elementwise op(s) in one pass over "
                                          f"{self._numel(shape)} elements")

    # -- phase 6: free views and constants join their one reader

    def attach(self) -> None:
        for n in reversed(self.nodes):
            name = n.name
            if not self.free(name) or self.returned_from(name):
                continue
            users = self.users(name)
            owners = {self.owner.get(u) for u in users}
            if not users or None in owners or len(owners) != 1:
                continue
            gid = owners.pop()
            role = self.role[name]
            if (role == "view" and self.free_view(name)) or role == "const":
                self.add(gid, [name])  # type: ignore[arg-type]

    # -- phase 7: data movement

    def data_movement(self) -> None:
        for n in self.nodes:
            if not self.free(n.name) or not self.is_dm(n.name):
                continue
            gid = self.new("data_movement", None, [n.name])
            if gid is None:
                continue
            while True:
                before = len(self.groups[gid].members)
                self.grow(gid, self.is_dm)
                self.absorb_producers(gid, self.is_dm)
                if len(self.groups[gid].members) == before:
                    break

    def others(self) -> None:
        """Operators no phase fuses (pooling, ...): one group each, before views attach to them."""
        for n in self.nodes:
            if self.free(n.name) and not self.is_dm(n.name):
                self.new("other", n.name, [n.name])

    def rest(self) -> None:
        for n in self.nodes:
            if self.free(n.name):
                kind: GroupKind = "elementwise" if self.role[n.name] == "elementwise" else "other"
                gid = self.new(kind, n.name if kind == "other" else None, [n.name])
                if gid is None:  # cannot happen: a single node never closes a cycle
                    raise RuntimeError(f"fusion: {n.name} could not be placed")

    # -- records

    def _ordered(self, gid: int) -> list[str]:
        return sorted(self.groups[gid].members, key=self.index.__getitem__)

    def records(self) -> list[FusionGroup]:
        order = self._topological()
        out: list[FusionGroup] = []
        for new_id, gid in enumerate(order):
            group = self.groups[gid]
            members = self._ordered(gid)
            inside = set(members)
            produced = {v for m in members for v in self.values[m]}
            inputs = list(dict.fromkeys(v for m in members for v in self.reads[m] if v not in produced))
            outputs = [v for m in members for v in self.values[m]
                       if v in self.returned or any(u not in inside for u in self.consumers.get(v, []))]
            views = [m for m in members if self.role[m] == "const" or m in group.layout
                     or (self.role[m] == "view" and self.free_view(m))]
            pattern = {group.roles.get(k) for k in ("qk", "pv")}
            anchor_at = self.index[group.anchor] if group.anchor else -1
            body = [m for m in members if m not in views and m != group.anchor and m not in pattern]
            prologue = [m for m in body if group.anchor and self.index[m] < anchor_at]
            epilogue = [m for m in body if group.anchor and self.index[m] > anchor_at]
            notes = list(group.notes)
            if group.kind in ("gemm", "conv"):
                notes.insert(0, self._anchor_note(group.anchor or "", epilogue))
            if group.kind == "data_movement":
                notes.append(self._dm_note(members, views))
            if group.kind == "other" and group.anchor:
                notes.append(f"{short(self.node[group.anchor].op)}: its own kernel")
            attached = [v for v in views if group.kind != "data_movement" and v not in group.layout]
            if attached:
                notes.append("no-copy views/constants attached (read through strides): "
                             + ", ".join(f"{v} ({short(self.node[v].op)})" for v in attached[:6])
                             + (f" and {len(attached) - 6} more" if len(attached) > 6 else ""))
            exposed = [v for v in outputs if v not in self.values.get(members[-1], [])]
            if exposed and group.kind in ("gemm", "conv", "row_reduce", "attention"):
                notes.append("also writes " + ", ".join(exposed) + " (read by other groups)")
            out.append(FusionGroup(id=new_id, kind=group.kind, anchor=group.anchor, epilogue=epilogue,
                                   nodes=members, inputs=inputs, outputs=outputs, note="; ".join(notes),
                                   prologue=prologue, views=views, roles=dict(group.roles)))
        self._cross_notes(out)
        return out

    def _anchor_note(self, anchor: str, epilogue: list[str]) -> str:
        n = self.node[anchor]
        ops = [short(self.node[e].op) for e in epilogue]
        text = short(n.op) + (f" [{n.module}]" if n.module else "")
        if n.op in CONV_OPS and len(n.args) > 1:
            w = self.shape(self.reads[anchor][1]) if len(self.reads[anchor]) > 1 else None
            at = 8 if n.op in ("aten.convolution", "aten._convolution") else 6  # convNd, conv_transposeNd: 6
            groups = n.args[at] if len(n.args) > at else 1
            if w:
                text += f" kernel {'x'.join(str(d) for d in w[2:])}"
            if isinstance(groups, int) and groups > 1:
                cin = (self.shape(self.reads[anchor][0]) or [0, 0])[1]
                text += " depthwise" if groups == cin else f" groups={groups}"
            text += ", " + {3: "NCL", 5: "NCDHW"}.get(len(w) if w else 4, "NCHW")
        if n.op == "aten.linear" and len(n.args) > 2 and n.args[2] is not None:
            ops.insert(0, "bias")
        if ops:
            text += " with epilogue " + " -> ".join(ops)
            if "batch_norm" in ops:
                text += " (eval batch_norm folded into a per-channel scale/shift)"
        return text

    def _dm_note(self, members: list[str], views: list[str]) -> str:
        copies = [m for m in members if m not in views]
        if not copies:
            readers = {u for m in members for u in self.users(m) if u not in members}
            return "views only: no kernel, an alias of its input" + \
                (" read through strides by several groups" if len({self.owner[u] for u in readers}) > 1 else "")
        ops = list(dict.fromkeys(short(self.node[m].op) for m in copies))
        text = f"copy kernel: {', '.join(ops)}"
        if any(o in ("cat", "stack", "concat") for o in ops):
            text += " (producers could write their slices of the result directly)"
        readers = {u for m in members for u in self.users(m) if u not in members}
        if readers and all(self.role[u] in ("recurrent", "gemm") for u in readers):
            text += "; its only readers are GEMM-like (" + ", ".join(sorted(readers)[:3]) + \
                "): they could read the parts directly (split-K) instead of a copy"
        return text

    def _cross_notes(self, out: list[FusionGroup]) -> None:
        """Batchable GEMMs: groups sharing a weight, or reading the same input."""
        by_weight: dict[str, list[FusionGroup]] = {}
        by_input: dict[str, list[FusionGroup]] = {}
        for g in out:
            if g.kind != "gemm" or g.anchor is None or self.node[g.anchor].op != "aten.linear":
                continue
            reads = self.reads[g.anchor]
            if len(reads) > 1 and reads[1] in self.placeholders:
                by_weight.setdefault(reads[1], []).append(g)
            if reads:
                by_input.setdefault(reads[0], []).append(g)
        for weight, gs in by_weight.items():
            if len(gs) > 1:
                for g in gs:
                    g.note += f"; one of {len(gs)} GEMMs with weight {weight}: batchable into one GEMM"
        for value, gs in by_input.items():
            if len(gs) > 1 and len({self.reads[g.anchor][1] for g in gs if g.anchor}) > 1:
                ids = ", ".join(f"#{g.id}" for g in gs)
                for g in gs:
                    g.note += f"; groups {ids} read the same input {value}: one GEMM over concatenated weights"

    def _topological(self) -> list[int]:
        succ: dict[int, set[int]] = {gid: set() for gid in self.groups}
        indeg = {gid: 0 for gid in self.groups}
        for n in self.nodes:
            b = self.owner[n.name]
            for p in self.preds[n.name]:
                a = self.owner[p]
                if a != b and b not in succ[a]:
                    succ[a].add(b)
                    indeg[b] += 1
        first = {gid: min(self.index[m] for m in g.members) for gid, g in self.groups.items()}
        ready = [(first[g], g) for g, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            _, gid = heapq.heappop(ready)
            order.append(gid)
            for w in succ[gid]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(ready, (first[w], w))
        if len(order) != len(self.groups):
            raise RuntimeError("fusion: the groups do not form a DAG")  # every merge is checked: a bug
        return order


def fuse(graph: OpGraph, *, fold_batch_norm: bool = True) -> list[FusionGroup]:
    """Cut the graph into fusion groups (see the note at the top of this module), in execution order.

    Every node lands in exactly one group; a group's inputs are placeholders or outputs of earlier
    groups. ``fold_batch_norm=False`` keeps eval-mode batch_norm as its own row_reduce group instead
    of folding it into the producing convolution's epilogue.
    """
    fuser = _Fuser(graph, fold_batch_norm)
    fuser.attention()
    fuser.recurrent()
    fuser.anchors()
    fuser.rows()
    fuser.elementwise()
    fuser.others()
    fuser.attach()
    fuser.data_movement()
    fuser.rest()
    return fuser.records()
