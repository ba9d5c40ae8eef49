"""Fusion's first phase: attention. ``matmul/bmm -> (elementwise: scale, mask; reshapes of the
scores) -> softmax(last dim) -> matmul/bmm`` chains become one group, with what its lowering
(lowering/lower_attention.py) reads through strides: views, constant scales, the operands'
``contiguous()`` copies and the layout change of its output. The operands' own work (a rotary
embedding) stays outside, for the prologue's elementwise group.
"""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.ir.ops import SOFTMAX_OPS, VIEW_OPS, reduce_geometry, short
from stitchcuda.compiler.schedule.grouping import Grouping


def _constant_scale(n: Any) -> bool:
    """``x * c`` or ``x / c`` for a nonzero number ``c``: what the attention kernel folds into its GEMM's alpha."""
    return n.op in ("aten.mul", "aten.div") and len(n.args) == 2 and isinstance(n.args[1], (int, float)) \
        and not isinstance(n.args[1], bool) and n.args[1] != 0


class AttentionPhase(Grouping):
    """The attention phase of the fuser (fusion._Fuser, which sets ``role`` and ``strides``)."""

    role: dict[str, str]
    strides: dict[str, Any]

    def free_view(self, name: str) -> bool:
        return self.role[name] == "view" and all(self.strides.get(v) is not None for v in self.values[name])

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
            # scale and mask, and the reshapes a shifted-window mask is added through
            while cur is not None and self.free(cur) and (self.role[cur] == "elementwise" or self._reshape(cur)) \
                    and len(self.users(cur)) == 1 and not self.returned_from(cur):
                chain.insert(0, cur)
                main = self.reads[cur][:1] if self._reshape(cur) else \
                    [v for v in self.reads[cur] if self.shape(v) == self.out_shape(cur)]
                cur = self.producer.get(main[0]) if main else None
            if chain and self._reshape(chain[0]):
                continue  # the kernel writes Q.K^T's own shape
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
            # the operands' own work (a rotary embedding of Q and K) stays out: the kernel reads the
            # products' operands through views and constant scales only (lower_attention.py)
            apart = self._operand_work(gid, qk, pv)
            self.absorb_producers(gid, lambda p, apart=apart: self.role[p] == "elementwise" and p not in apart)
            for path in self._operand_copies(qk, pv):  # each with the views between it and the group
                if all(self.free(n) or self.owner.get(n) == gid for n in path):
                    self.add(gid, path)
            for p in (qk, pv):  # a scaled query or key: the scale moves into the kernel
                for v in self.reads[p]:
                    q = self.producer.get(v)
                    if q and self.free(q) and self.role[q] == "elementwise" and self.users(q) == [p] \
                            and q not in apart:
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

    def _reshape(self, name: str) -> bool:
        """A view that only regroups dims (a row kernel over a contiguous buffer reads it as is)."""
        return self.role[name] == "view" and self.node[name].op in ("aten.view", "aten.reshape", "aten._unsafe_view")

    def _operand_copies(self, qk: str, pv: str) -> list[list[str]]:
        """The ``contiguous()`` copies on the products' operand paths (Whisper's heads split with
        ``.transpose(1, 2).contiguous()``) that only strides separate from the product, each with the
        nodes between it and the product: the kernel's batched GEMMs read the strided view itself.
        Past a reshape only where it regroups batch dims (repeat_kv's ``expand`` then ``reshape``:
        the GEMMs keep the expanded dims apart)."""
        found: list[list[str]] = []
        pending = [(v, []) for p in (qk, pv) for v in self.reads[p]]
        while pending:
            value, path = pending.pop()
            q = self.producer.get(value)
            if q is None or len(self.users(q)) != 1 or self.returned_from(q):
                continue
            if self.node[q].op == "aten.clone" and self.role[q] == "copy":
                found.append([q, *path])
            elif (self.role[q] == "view" and (not self._reshape(q) or self._batch_regroup(q))) \
                    or _constant_scale(self.node[q]):
                pending.extend((v, [q, *path]) for v in self.reads[q][:1])
        return found

    def _batch_regroup(self, name: str) -> bool:
        """A reshape that keeps the last two dims: it regroups a product's batch dims only."""
        src = self.shape(self.reads[name][0]) if self.reads[name] else None
        out = self.out_shape(name)
        return src is not None and out is not None and len(src) >= 2 and len(out) >= 2 and src[-2:] == out[-2:]

    def _operand_work(self, gid: int, qk: str, pv: str) -> set[str]:
        """The elementwise nodes on the products' operand paths (through views and constant scales)
        that are more than a constant scale: the attention kernel cannot take them."""
        apart: set[str] = set()
        seen: set[str] = set()
        pending = [v for p in (qk, pv) for v in self.reads[p]]
        while pending:
            q = self.producer.get(pending.pop())
            if q is None or q in seen or self.owner.get(q) == gid:
                continue
            seen.add(q)
            if self.role[q] == "view" or _constant_scale(self.node[q]):
                pending.extend(self.reads[q])
            elif self.role[q] == "elementwise":
                apart.add(q)
        return apart
