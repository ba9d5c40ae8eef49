"""One registry of lowerings: how the compiler finds what lowers a group or an operator.

- Per operator (:data:`OPERATORS`, registered with :func:`lowering`): a family lowering (families/)
  takes one node of its operator in any instance (rank, dims, layout, the dtypes it names) and
  returns its kernels and launch statements. It is every operator's standalone lowering: a group
  that nothing else takes, or a single operator a fused lowering refuses, goes here.
- Per group (:data:`GROUPS`, registered with :func:`group_lowering`): a fused lowering (lower_*.py)
  takes a fusion group (an anchor with the prologue and epilogue scheduling fused to it) and
  returns its launches. Each says which groups it takes; the first in order that takes a group
  lowers it, and the pointwise lowering, last, takes any.

Scheduling reads which operators lower alone from the IR's table (``ir.ops.FAMILY_OPS``), so a
group forms only where a lowering accepts it; this registry takes a lowering only for an operator
that table names. Importing the family package (``families``) and the fused lowerings'
modules registers them; ``lower.py``, which lowers with them, imports them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import FAMILY_OPS
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall

OperatorLowering = Callable[[FamilyContext, Node], KernelCall]
OPERATORS: dict[str, OperatorLowering] = {}


def lowering(*ops: str) -> Callable[[OperatorLowering], OperatorLowering]:
    """Register ``fn`` as the lowering of ``ops`` (ATen overload packets, e.g. ``"aten.cumsum"``)."""

    def register(fn: OperatorLowering) -> OperatorLowering:
        for op in ops:
            if op in OPERATORS:
                raise ValueError(f"two lowerings for {op}")
            if op not in FAMILY_OPS:
                raise ValueError(f"{op} has a family lowering but ir.ops.FAMILY_OPS does not name it: "
                                 "scheduling would never give it a group of its own")
            OPERATORS[op] = fn
        return fn

    return register


@dataclass(frozen=True)
class GroupLowering:
    name: str
    order: int  # lower first: asked first
    takes: Callable[[FusionGroup, list[Node]], bool]
    lower: Callable[[Any, FusionGroup, list[Node]], Any]  # (LowerContext, group, its nodes) -> Lowered


GROUPS: list[GroupLowering] = []


def group_lowering(name: str, order: int, takes: Callable[[FusionGroup, list[Node]], bool]) -> Callable:
    """Register ``fn(cx, group, nodes)`` as the fused lowering of the groups ``takes`` accepts."""

    def register(fn: Callable) -> Callable:
        if any(g.name == name or g.order == order for g in GROUPS):
            raise ValueError(f"group lowering {name} (order {order}) registered twice")
        GROUPS.append(GroupLowering(name, order, takes, fn))
        GROUPS.sort(key=lambda g: g.order)
        return fn

    return register


def group_lowering_for(group: FusionGroup, nodes: list[Node]) -> GroupLowering:
    return next(g for g in GROUPS if g.takes(group, nodes))
