"""The bookkeeping under the fuser: a captured graph's dataflow, and a partition of its nodes into
groups that stays a DAG.

:class:`Dataflow` answers who produces and who reads each value, its shape, and the strides of a
view when every kernel writes contiguous outputs. :class:`Grouping` adds the groups: a node joins
a group only when the groups, as units, still form a DAG (a merge that would close a cycle is
refused and changes nothing), and they come out in a topological order that follows the graph's
order where it can. What to group is fusion.py's decision.
"""

from __future__ import annotations

import heapq
from typing import Any

from stitchcuda.compiler.capture.graph import Node, OpGraph
from stitchcuda.compiler.ir.expr import contiguous_strides, reshape_strides
from stitchcuda.compiler.ir.group import GroupKind
from stitchcuda.compiler.ir.ops import norm_dim


class Group:
    """A group being formed: its members, and what the fuser learned about it on the way."""

    def __init__(self, kind: GroupKind, anchor: str | None):
        self.kind: GroupKind = kind
        self.anchor = anchor
        self.members: set[str] = set()
        self.roles: dict[str, str] = {}
        self.notes: list[str] = []
        self.layout: list[str] = []  # nodes whose layout change the group's kernel writes directly


class Dataflow:
    """Who produces and reads each value of ``graph``, and its shape."""

    def __init__(self, graph: OpGraph):
        self.graph = graph
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

    def value_strides(self, views: set[str]) -> dict[str, list[int] | None]:
        """Strides of every value when every kernel writes contiguous outputs and the nodes in
        ``views`` move no data (None: a view whose strides are not known)."""
        strides: dict[str, list[int] | None] = {}
        for name, meta in self.meta.items():
            if meta is not None and name in self.placeholders:
                strides[name] = list(contiguous_strides(meta.shape))
        for n in self.nodes:
            for v in self.values[n.name]:
                meta = self.meta.get(v)
                strides[v] = list(contiguous_strides(meta.shape)) if meta is not None else None
            if n.name in views:
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
                a, b = norm_dim(args[1], rank), norm_dim(args[2], rank)
                out = list(st)
                out[a], out[b] = out[b], out[a]
                return out
            if op == "aten.t":
                return list(reversed(st))
            if op == "aten.permute":
                return [st[norm_dim(d, rank)] for d in args[1]]
            if op in ("aten.select", "aten.unbind"):
                d = norm_dim(args[1] if len(args) > 1 else 0, rank)
                return st[:d] + st[d + 1:]
            if op in ("aten.slice", "aten.narrow", "aten.split", "aten.split_with_sizes", "aten.chunk"):
                if op == "aten.slice" and len(args) > 4 and args[4] not in (None, 1):
                    d = norm_dim(args[1], rank)
                    return [s * int(args[4]) if i == d else s for i, s in enumerate(st)]
                return list(st)
            if op == "aten.unfold":  # windows of size args[2] every args[3] along a dim, as a new last dim
                d = norm_dim(args[1], rank)
                return st[:d] + [st[d] * int(args[3])] + st[d + 1:] + [st[d]]
            if op in ("aten.alias", "aten.detach"):
                return list(st)
            if op in ("aten.expand", "aten.expand_as"):
                lead = len(new) - rank
                return [0] * lead + [0 if shape[i] == 1 and new[lead + i] != 1 else st[i] for i in range(rank)]
            if op in ("aten.as_strided", "stitchcuda.buffer_view"):
                return [int(s) for s in args[2]]
        except (IndexError, TypeError, ValueError):
            return None
        return reshape_strides(shape, st, new)  # reshape, view, flatten, unsqueeze, squeeze, ...


class Grouping(Dataflow):
    """Groups of nodes (``owner``: node -> group id) that, as units, always form a DAG."""

    def __init__(self, graph: OpGraph):
        super().__init__(graph)
        self.owner: dict[str, int] = {}
        self.groups: dict[int, Group] = {}
        self.sealed: set[int] = set()
        # A topological order of the units (a group, or a node in none), kept across merges, so that
        # a merge checks only the units between its parts in that order (Pearce and Kelly's dynamic
        # topological sort): a cycle through the merged unit can pass through no other unit.
        self.position: dict[int | str, int] = {n.name: i for i, n in enumerate(self.nodes)}
        self.at: list[int | str | None] = [n.name for n in self.nodes]  # position -> unit
        self.succs: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for p in self.preds[n.name]:
                self.succs[p].append(n.name)

    def seal(self, gid: int) -> None:
        """Nothing joins group ``gid`` any more (a node the compiler lowers on its own)."""
        self.sealed.add(gid)

    def new(self, kind: GroupKind, anchor: str | None, members: list[str]) -> int | None:
        gid = len(self.groups)
        group = Group(kind, anchor)
        self.groups[gid] = group
        if not self.add(gid, members):
            del self.groups[gid]
            return None
        return gid

    def add(self, gid: int, names: list[str]) -> bool:
        """Put unclaimed nodes into a group when the groups stay a DAG; False (and nothing changed) if not."""
        names = [n for n in dict.fromkeys(names) if self.owner.get(n) != gid]
        if any(n in self.owner for n in names) or (names and gid in self.sealed):
            return False
        if not names:
            return True
        order = self._merged_order(gid, names)
        if order is None:
            return False
        spots, order = order
        for spot in spots:  # the window's slots, refilled in the new order (the merged unit takes one)
            self.at[spot] = None
        for n in names:
            self.owner[n] = gid
            del self.position[n]
        self.groups[gid].members.update(names)
        for unit, spot in order.items():
            self.position[unit] = spot
            self.at[spot] = unit
        return True

    def _unit(self, name: str) -> int | str:
        return self.owner.get(name, name)

    def _unit_members(self, unit: int | str) -> set[str] | list[str]:
        return self.groups[unit].members if isinstance(unit, int) else [unit]

    def _merged_order(self, gid: int, names: list[str]) -> tuple[list[int], dict[int | str, int]] | None:
        """The slots of the units between the parts of group ``gid`` plus ``names``, and their new
        positions once the parts are one unit; None when that unit would close a cycle. Only units positioned between the
        parts can lie on a cycle through them; those the parts reach move after the merged unit."""
        parts: list[int | str] = list(names) + ([gid] if gid in self.position else [])
        spots = [self.position[u] for u in parts]
        lo, hi = min(spots), max(spots)
        inside = set(parts)
        reached: list[int | str] = []
        seen: set[int | str] = set()
        stack = list(parts)
        while stack:
            unit = stack.pop()
            for m in self._unit_members(unit):
                for s in self.succs[m]:
                    nxt = self._unit(s)
                    if nxt in inside:
                        if unit not in inside:
                            return None  # out of the merged unit and back in: a cycle
                        continue
                    if nxt in seen or not lo < self.position[nxt] < hi:
                        continue
                    seen.add(nxt)
                    reached.append(nxt)
                    stack.append(nxt)
        window = [u for u in self.at[lo:hi + 1] if u is not None]
        slots = [self.position[u] for u in window]
        rest = [u for u in window if u not in inside and u not in seen]
        after = sorted(reached, key=self.position.__getitem__)
        return slots, dict(zip([*rest, gid, *after], slots, strict=False))

    def free(self, name: str) -> bool:
        return name not in self.owner

    def group_values(self, gid: int) -> set[str]:
        return {v for n in self.groups[gid].members for v in self.values[n]}

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

    def _ordered(self, gid: int) -> list[str]:
        return sorted(self.groups[gid].members, key=self.index.__getitem__)

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
