"""Typed work, as the IR sees it: which elementwise operators have integer and bool forms (index
math of decompositions, masks, casts), which make constants, and which nodes the fused float32
kernels cannot take, so that scheduling gives them a group of their own and the typed family
lowering (``lowering/families/layout_typed.py``) takes them there.
"""

from __future__ import annotations

from collections.abc import Callable

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.formulas import MASK_OPS, is_pointwise
from stitchcuda.compiler.ir.ops import RECURRENT_OPS, RECURRENT_SEQUENCE_OPS, VIEW_OPS

COMPARE = {"aten.eq": "==", "aten.ne": "!=", "aten.lt": "<", "aten.le": "<=", "aten.gt": ">", "aten.ge": ">="}
LOGICAL = {"aten.logical_and": "&&", "aten.logical_or": "||", "aten.logical_xor": "!="}
BINARY = {"aten.add", "aten.sub", "aten.rsub", "aten.mul", "aten.div", "aten.maximum", "aten.minimum", "aten.fmod",
          "aten.remainder", "aten.floor_divide", "aten.bitwise_and", "aten.bitwise_or", "aten.bitwise_xor",
          "aten.pow"}
UNARY = {"aten.neg", "aten.abs", "aten.sign", "aten.bitwise_not", "aten.logical_not", "aten.floor", "aten.ceil",
         "aten.round", "aten.trunc", "aten.isnan", "aten.isinf", "aten.isfinite", "aten.clamp", "aten.clamp_min",
         "aten.clamp_max", "aten.relu"}
COPIES = {"aten._to_copy", "aten.clone", "aten.contiguous", "aten.lift_fresh_copy", "aten.copy"}
TYPED = set(COMPARE) | set(LOGICAL) | BINARY | UNARY | COPIES | {"aten.where", "aten.masked_fill"}

FILLS = {"aten.full": 1, "aten.full_like": 1, "aten.scalar_tensor": 0, "aten.new_full": 2, "aten.zeros": None,
         "aten.zeros_like": None, "aten.new_zeros": None, "aten.ones": None, "aten.ones_like": None,
         "aten.new_ones": None, "aten.empty": None, "aten.empty_like": None, "aten.new_empty": None,
         "aten.empty_strided": None}  # op -> position of the fill value (None: 0 or 1 by name)


def fused_ok(node: Node, dtype_of: Callable[[str], str | None]) -> bool:
    """Whether the fused pointwise kernels take this elementwise node (the dtype rules lower.py checks)."""
    if not is_pointwise(node.op):
        return False
    if node.op == "aten.div" and node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None):
        return False
    outs = [o.dtype for o in node.out]
    if outs != ["float32"] and not (outs == ["bool"] and node.op in ("aten.bitwise_not", "aten.logical_not")):
        return False
    for v in node.inputs():
        dt = dtype_of(v)
        if dt is not None and dt != "float32" and not (dt == "bool" and node.op in MASK_OPS):
            return False
    return True


def claims(node: Node, dtype_of: Callable[[str], str | None], readers: Callable[[str], list[Node]]) -> bool:
    """Whether a layout-family lowering should take ``node`` although the fused kernels list its
    operator: typed work they cannot do, constants they cannot materialise (except a recurrent
    cell's zero state, which its kernel folds), gathers of integer tables."""
    op = node.op
    if op in TYPED:
        if op in ("aten.bitwise_not", "aten.logical_not") and node.out and node.out[0].dtype == "bool":
            # a fused kernel keeps a mask in registers: only mask operators may read it there
            return any(r.op not in MASK_OPS for r in readers(node.name)) or not fused_ok(node, dtype_of)
        return not fused_ok(node, dtype_of)
    if op in FILLS or op == "aten.arange":
        seen, todo = set(), [node.name]
        while todo:
            for r in readers(todo.pop()):
                if r.op in RECURRENT_OPS | RECURRENT_SEQUENCE_OPS:
                    return False
                if r.op in VIEW_OPS and r.name not in seen:
                    seen.add(r.name)
                    todo.append(r.name)
        return True
    if op in ("aten.gather", "aten.index"):
        table = node.inputs()[0] if node.inputs() else None
        if table is None or dtype_of(table) != "float32":
            return True
        if op == "aten.index" and isinstance(node.args[1], list):
            pos = [i for i, v in enumerate(node.args[1]) if v is not None]
            return bool(pos) and pos != list(range(pos[0], pos[-1] + 1))
    return False
