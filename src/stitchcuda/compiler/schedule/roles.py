"""What kind of work a node is, for fusion: its role (gemm, conv, reduce, elementwise, view, ...),
and whether the fused row kernel takes a reduction (over trailing dims, rows it keeps on chip)."""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.data_movement import POOL_OPS, pool_fusable
from stitchcuda.compiler.ir.expr import numel
from stitchcuda.compiler.ir.formulas import ROW_OPS
from stitchcuda.compiler.ir.op_table import OPERATORS, Role
from stitchcuda.compiler.ir.ops import (
    FAMILY_OPS,
    KNOWN_FUSED,
    MAX_ROW,
    SUM_OPS,
    reduce_geometry,
)


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
        return rank >= 2 and shape[1] % groups == 0 and numel(shape[1:]) // groups <= MAX_ROW
    if extra:
        return True
    if not dims:
        return True
    if node.op in SUM_OPS and (node.op not in ROW_OPS or list(dims) != [rank - 1]):
        return False  # the row kernel reduces the last dim alone, by sum, mean or amax
    if list(dims) != list(range(rank - len(dims), rank)):
        return False
    return numel([shape[d] for d in dims]) <= MAX_ROW


def op_role(node: Node, fold_batch_norm: bool = True, in_shape: list[int] | None = None) -> Role:
    """What kind of work a node is, for fusion (``in_shape``: its first input's shape, when known)."""
    op = node.op
    if op in FAMILY_OPS and (op not in KNOWN_FUSED or not row_lowerable(node, in_shape)
                           or (op in POOL_OPS and not pool_fusable(node, in_shape))):
        return "other"  # its family lowering, one group of its own
    if op == "aten.batch_norm":
        training = bool(node.args[5]) if len(node.args) > 5 else False
        return "elementwise" if fold_batch_norm and not training else "reduce"
    role = OPERATORS[op].role if op in OPERATORS else "other"
    if role in ("reduce", "elementwise") and len(node.out) != 1:
        return "other"  # a multi-output reduction or elementwise op (var_mean, ...) is no fusable stage
    return role
