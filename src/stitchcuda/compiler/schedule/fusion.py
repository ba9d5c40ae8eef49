"""Fusion groups: which operators of the captured graph become one kernel (or one library call).

The offline Planner decides the groups; the offline Coder generates one kernel (or library call
plus fused epilogue) per group.

Note: how ``fuse`` groups a graph
---------------------------------
The graph is cut the way a CUDA engineer rewriting the whole forward would cut it, in phases
over the nodes in graph order; a node belongs to the first group that claims it:

1. ``attention`` (attention_phase.py): ``matmul/bmm -> (elementwise: scale, mask) -> softmax(last dim) -> matmul/bmm``
   chains with single consumers become one flash-attention style group; elementwise producers of
   its operands (a query scale, the mask's preparation) and the view/copy chain that lays out its
   output (``transpose -> reshape``) join it. ``scaled_dot_product_attention`` is one such group.
2. ``recurrent``: every ``lstm_cell`` / ``gru_cell`` (one time step; the note says whether the input
   GEMMs of all steps can be batched) and every whole-sequence ``lstm`` / ``gru`` is its own group.
3. ``gemm`` / ``conv``: a GEMM-like or convolution anchor absorbs the single-consumer elementwise
   chain after it (activations, residual adds, scales, casts; eval-mode ``batch_norm``, a
   per-channel affine, is folded there too unless ``fold_batch_norm=False``), passing through
   layout-preserving views (reshape, unsqueeze, ...) of contiguous values. Where that chain's only
   reader is a row reduction, the chain (all but a first activation) is left to phase 4.
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

The operator classes a node's role comes from are ops.py's; the dataflow facts and the DAG-keeping
bookkeeping of groups are grouping.py's. This module decides what joins what.
"""

from __future__ import annotations

import functools
from typing import Any

from stitchcuda.compiler.capture.graph import OpGraph
from stitchcuda.compiler.ir.data_movement import CAT_OPS
from stitchcuda.compiler.ir.expr import numel
from stitchcuda.compiler.ir.group import FusionGroup, GroupKind
from stitchcuda.compiler.ir.ops import (
    CONV_OPS,
    FAMILY_OPS,
    LAYOUT_VIEWS,
    RECURRENT_OPS,
    RECURRENT_SEQUENCE_OPS,
    norm_dim,
    reduce_geometry,
    short,
    stat_shapes,
)
from stitchcuda.compiler.ir.typed import claims
from stitchcuda.compiler.schedule.attention_phase import AttentionPhase
from stitchcuda.compiler.schedule.roles import op_role as op_role
from stitchcuda.compiler.schedule.roles import row_lowerable as row_lowerable

# Activations cuBLASLt's and CUTLASS's epilogues apply as they write a product (lower_gemm.py).
LIBRARY_ACTIVATIONS = frozenset({"aten.relu", "aten.gelu", "aten.silu", "aten.sigmoid"})


# the group kind of a node lowered on its own, by its role
_ALONE: dict[str, GroupKind] = {"gemm": "gemm", "conv": "conv", "recurrent": "recurrent", "attention": "attention",
                                "reduce": "row_reduce", "elementwise": "elementwise", "view": "data_movement",
                                "const": "data_movement", "copy": "data_movement"}


# -- the fuser ---------------------------------------------------------------------------------------

class _Fuser(AttentionPhase):
    def __init__(self, graph: OpGraph, fold_batch_norm: bool):
        super().__init__(graph)
        self.fold = fold_batch_norm
        self.role = {n.name: op_role(n, fold_batch_norm, self._first_shape(n)) for n in graph.nodes}
        for n in graph.nodes:  # integer/bool work, casts, constants the fused kernels cannot take
            if claims(n, lambda v: self.meta[v].dtype if self.meta.get(v) is not None else None,
                      lambda v: [self.node[u] for u in self.consumers.get(v, [])]):
                self.role[n.name] = "other"
            elif n.op in FAMILY_OPS and self.role[n.name] == "reduce" and any(
                    self.meta.get(v) is not None and self.meta[v].dtype != "float32" for v in self.reads[n.name]):
                self.role[n.name] = "other"  # a reduction of integers or a mask: its family lowering, typed
        self.strides = self.value_strides({n for n, role in self.role.items() if role == "view"})

    def is_dm(self, name: str) -> bool:
        return self.role[name] in ("view", "const", "copy")

    # -- groups


    # -- phase 0: nodes lowered on their own

    def isolated(self, names: frozenset[str]) -> None:
        """Each node of ``names`` a sealed group of its own: nothing fuses into it, no view attaches to
        it (a view it reads is materialised by a group of its own where it must be)."""
        for n in self.nodes:
            if n.name not in names:
                continue
            role = self.role[n.name]
            kind: GroupKind = _ALONE.get(role, "other")
            if role == "reduce" and reduce_geometry(n, self._first_shape(n) or []) is None:
                kind = "other"
            gid = self.new(kind, None if kind in ("elementwise", "data_movement") else n.name, [n.name])
            if gid is None:  # cannot happen: a single node never closes a cycle
                raise RuntimeError(f"fusion: {n.name} could not be placed")
            self.seal(gid)
            if role == "attention":
                self.groups[gid].roles = {"sdpa": n.name}
            self.groups[gid].notes.append("lowered on its own: a fused group with it did not lower")

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
            steps = self._epilogue(n.name)
            if steps and all(len(step) == 1 for step in steps) and self._feeds_rows(steps[-1][0]):
                # A row kernel reads the result: it applies the chain as it loads its rows (one pass
                # over the product fewer), all but an activation the library's epilogue takes.
                steps = steps[:1] if self.node[steps[0][0]].op in LIBRARY_ACTIVATIONS else []
            for step in steps:
                if not self.add(gid, step):
                    break

    def _epilogue(self, anchor: str) -> list[list[str]]:
        """The single-consumer elementwise chain after a GEMM or convolution, each step an op and
        the layout-preserving views before it."""
        size = numel(self.out_shape(anchor) or ())
        tail, pending, steps = anchor, [], []
        while True:
            users = self.users(tail)
            if len(users) != 1 or not self.free(users[0]):
                return steps
            c = users[0]
            if self.node[c].op in LAYOUT_VIEWS and self.free_view(c) and len(self.values[c]) == 1 \
                    and numel(self.out_shape(c) or ()) == size:
                pending.append(c)
                tail = c
                continue
            if self.role[c] != "elementwise" or numel(self.out_shape(c) or ()) != size:
                return steps
            steps.append([*pending, c])
            pending, tail = [], c

    def _feeds_rows(self, value: str) -> bool:
        """``value``'s one reader is a free row reduction of it (a norm over the last dims, a softmax,
        a sum or max over rows; phase 4 then takes its producers)."""
        shape, users = self.out_shape(value), self.users(value)
        if len(users) != 1 or self.returned_from(value) or not shape:
            return False
        u = self.node[users[0]]
        return self.role[u.name] == "reduce" and self.free(u.name) and self.reads[u.name][:1] == [value] \
            and u.op not in ("aten.group_norm", "aten.batch_norm") and reduce_geometry(u, shape) is not None

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
            # elementwise producers of full rows, and embedding lookups (BERT's sum of embeddings
            # before its first norm: the row kernel reads the tables through the token ids)
            self.absorb_producers(gid, lambda p: self.role[p] == "elementwise" or self._lookup(p), full=full, expose=True)
            stats = stat_shapes(geo)
            self.grow(gid, lambda c, i=gid, g=geo, f=full, st=stats: self._row_ok(c, i, g, f, st))
            self.groups[gid].notes.append(self._row_note(gid, geo))

    def _lookup(self, name: str) -> bool:
        """An ``embedding`` of a float table read by one group: a gather the reading kernel makes."""
        node = self.node[name]
        return node.op == "aten.embedding" and len(node.out) == 1 and node.out[0].dtype == "float32" and \
            len(self.users(name)) == 1 and not self.returned_from(name)

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
            dim = norm_dim(int(self.node[c].args[1]), len(full))
            return self.producer.get(src) in members and self.shape(src) == full and \
                geo[1] == (dim,) and shape in stats
        if self.node[c].op in LAYOUT_VIEWS and self.free_view(c):
            return shape == full or shape in stats
        return False


    def _row_note(self, gid: int, geo: Any) -> str:
        shape, dims, extra = geo
        length = numel([shape[d] for d in dims])
        reductions = [m for m in self._ordered(gid) if self.role[m] == "reduce"]
        what = ", ".join(short(self.node[m].op) for m in reductions)
        if extra.startswith("groups"):
            rows = f"{shape[0]}×{extra.split('=')[1]} groups of {length // int(extra.split('=')[1] or 1)}"
        elif extra == "channels":
            rows = f"{shape[1] if len(shape) > 1 else 1} channels of {length} (batch statistics)"
        else:
            count = numel(list(shape)) // max(length, 1)
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
            self.absorb_producers(gid, lambda p: self.role[p] == "elementwise" or self._read_in_place(p))
            self.grow(gid, lambda c, s=shape: self.role[c] == "elementwise" and self.out_shape(c) == s)
            self.absorb_producers(gid, lambda p: self.role[p] == "elementwise" or self._read_in_place(p))
            self.groups[gid].notes.append(f"{len(self.groups[gid].members)} elementwise op(s) in one pass over "
                                          f"{numel(shape)} elements")

    def _read_in_place(self, name: str) -> bool:
        """A float concatenation the elementwise kernel reading it can read piece by piece (a rotary
        embedding's ``rotate_half``): none of its pieces is elementwise work (a piece is a read)."""
        node = self.node[name]
        return node.op == "aten.cat" and len(node.out) == 1 and node.out[0].dtype == "float32" and \
            all(self.role.get(self.producer.get(v, ""), "") != "elementwise" for v in self.reads[name])

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
            joins = functools.partial(self._joins_data_movement, gid)
            while True:
                before = len(self.groups[gid].members)
                self.grow(gid, joins)
                self.absorb_producers(gid, joins)
                if len(self.groups[gid].members) == before:
                    break

    def _joins_data_movement(self, gid: int, name: str) -> bool:
        """Whether ``name`` may join data-movement group ``gid``: no view of a concatenation the group
        itself lays out (its lowering reads views through a buffer's strides; the concatenation's
        value is no buffer there), so a view of one starts a group of its own, which reads it laid out."""
        if not self.is_dm(name):
            return False
        members = self.groups[gid].members
        if self.role[name] == "view":
            return not any(p in members and self.node[p].op in CAT_OPS for p in self.preds[name])
        return self.node[name].op not in CAT_OPS or not any(
            u in members and self.role[u] == "view" for u in self.users(name))

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


def fuse(graph: OpGraph, *, fold_batch_norm: bool = True, isolate: frozenset[str] = frozenset()) -> list[FusionGroup]:
    """Cut the graph into fusion groups (see the note at the top of this module), in execution order.

    Every node lands in exactly one group; a group's inputs are placeholders or outputs of earlier
    groups. ``fold_batch_norm=False`` keeps eval-mode batch_norm as its own row_reduce group instead
    of folding it into the producing convolution's epilogue. Each node of ``isolate`` is a group of
    its own that nothing joins (the compiler's answer to a fused group that did not lower).
    """
    fuser = _Fuser(graph, fold_batch_norm)
    fuser.isolated(isolate)
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
