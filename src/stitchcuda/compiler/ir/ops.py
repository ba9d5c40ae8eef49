"""The stages' operator sets, each a query of the operator table (op_table.py), and the geometry
of a row reduction (which dims, what shape the per-row values take)."""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.op_table import (
    FAMILY,
    GROUPS,
    GROUPS_THEN_FAMILY,
    lowered_by,
    tagged,
    with_role,
)

# The stages' operator sets, each a query of the operator table (ir/op_table.py).
GEMM_OPS = with_role("gemm")
CONV_OPS = with_role("conv")
RECURRENT_OPS = tagged("cell")
RECURRENT_SEQUENCE_OPS = tagged("sequence")  # whole nn.LSTM/GRU/RNN
SDPA_OPS = with_role("attention")
SOFTMAX_OPS = tagged("softmax")
NORM_OPS = tagged("norm")
SUM_OPS = tagged("sum")
ELEMENTWISE_OPS = with_role("elementwise")
VIEW_OPS = with_role("view")  # no data moves when the consumer reads through strides
LAYOUT_VIEWS = tagged("layout")  # views that keep a contiguous tensor contiguous (an epilogue may run through them)
CONST_OPS = with_role("const")
COPY_OPS = with_role("copy")
KNOWN_FUSED = tagged("fusable")  # what the scheduler may fuse (a family lowering takes the rest, alone)
# What a family lowering (lowering/families/) takes one node at a time, in any instance: what
# scheduling may give a group of its own. The lowering registry registers exactly these.
FAMILY_OPS = lowered_by(FAMILY, GROUPS_THEN_FAMILY)
GROUP_LOWERED = lowered_by(GROUPS, GROUPS_THEN_FAMILY)  # what the group lowerings (lowering/lower_*.py) take
SPLITS = tagged("split")  # multi-output views
CELLS = {"aten.lstm_cell": 4, "aten.gru_cell": 3}  # recurrent cells -> gates per hidden unit
ZEROS = tagged("zeros")  # initial states
RESHAPES = tagged("reshape")
C_TYPES = {"float32": "float", "bool": "bool", "int64": "int64_t", "int32": "int32_t"}  # element types a kernel takes, as C
MAX_ROW = 32768  # the longest row the fused row kernel keeps in registers


def norm_dim(d: int, rank: int) -> int:
    """``d`` counted from the front (a negative dim counts from the back)."""
    return d + rank if d < 0 else d


def dims_of(value: Any, rank: int) -> list[int]:
    """A dim argument (one int or a list) as sorted non-negative dims."""
    if isinstance(value, int):
        return [norm_dim(value, rank)]
    return sorted(norm_dim(int(d), rank) for d in (value or []))


def reduce_geometry(node: Node, in_shape: list[int]) -> tuple[tuple[int, ...], tuple[int, ...], str] | None:
    """(input shape, reduced dims, extra) of a row reduction; equal geometries share rows."""
    rank = len(in_shape)
    op, args = node.op, node.args
    if op in SOFTMAX_OPS:
        dims = dims_of(args[1] if len(args) > 1 else node.kwargs.get("dim", -1), rank)
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
        dims = list(range(rank)) if raw is None or raw == [] else dims_of(raw, rank)
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


def short(op: str) -> str:
    """``aten.layer_norm`` -> ``layer_norm``."""
    return op.split(".", 1)[-1]
