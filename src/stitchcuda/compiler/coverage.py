"""Which forward operators of PyTorch's core ATen IR the compiler lowers, and how: the coverage
report (``python benchmarks/zoo.py coverage``). Backward operators are out of scope.

An operator is covered when the capture decomposes it (it never reaches a lowering), when a
family lowering takes it (``families/``), or when the fused lowerings take it alone (a pointwise
formula, a view, a GEMM, a convolution, a row reduction, a recurrent layer). Anything else is a
missing lowering, and a model holding it is refused with its name.
"""

from __future__ import annotations

from pydantic import BaseModel

from stitchcuda.compiler.capture.graph import DRAWN_OPS, keep_table
from stitchcuda.compiler.ir.expr import DATA_OPS, VIEWS
from stitchcuda.compiler.ir.formulas import ROW_OPS, is_pointwise
from stitchcuda.compiler.ir.ops import (
    CELLS,
    CONST_OPS,
    CONV_OPS,
    COPY_OPS,
    GEMM_OPS,
    NORM_OPS,
    SOFTMAX_OPS,
    SPLITS,
    SUM_OPS,
    VIEW_OPS,
    ZEROS,
)
from stitchcuda.compiler.lowering.lower_sequence import SEQUENCES
from stitchcuda.compiler.lowering.lowered import PLAIN_GEMM_OPS
from stitchcuda.compiler.lowering.registry import OPERATORS


class Coverage(BaseModel):
    """Core-ATen forward operators (overload packets, ``aten.add``) by how the compiler takes them."""

    covered: dict[str, str]  # operator -> how: decomposed, family, pointwise, view, gemm, ...
    missing: list[str]

    @property
    def total(self) -> int:
        return len(self.covered) + len(self.missing)


def core_forward_ops() -> list[str]:
    """The overload packets of every operator tagged ``core`` in this torch, backward ones left out."""
    import torch

    found = set()
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if packet is None or not hasattr(packet, "overloads") or "backward" in name:
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload, None)
            if op is not None and torch.Tag.core in getattr(op, "tags", ()):
                found.add(f"aten.{name}")
                break
    return sorted(found)


# core operators no program computes on purpose: the symbolic-shape and scalar readbacks of a
# data-dependent trace (refused at capture)
BY_DESIGN = {"aten.sym_numel": "symbolic shape", "aten.sym_storage_offset": "symbolic shape",
             "aten._local_scalar_dense": "data-dependent scalar"}


def _how(op: str, decomposed: set[str]) -> str | None:
    if op in BY_DESIGN:
        return f"refused by design: {BY_DESIGN[op]}"
    if op in DRAWN_OPS:  # the program draws them from torch's generator (graph.Draw)
        return "drawn by the program (torch's generator)"
    if op in decomposed:
        return "decomposed"
    if op in OPERATORS:
        return "family"
    if op in GEMM_OPS | PLAIN_GEMM_OPS:
        return "gemm"
    if op in CONV_OPS or op == "aten.convolution":
        return "convolution"
    if op in CELLS or op in SEQUENCES:
        return "recurrent"
    if op in ROW_OPS or op in SOFTMAX_OPS or op in NORM_OPS or op in SUM_OPS:
        return "row reduction"
    if op in VIEWS or op in VIEW_OPS or op in SPLITS:
        return "view"
    if op in DATA_OPS or op in COPY_OPS or op in CONST_OPS or op in ZEROS:
        return "data movement"
    if is_pointwise(op):
        return "pointwise"
    return None


def coverage() -> Coverage:
    import torch

    decomposed = {f"aten.{op._overloadpacket.__name__}" for op in keep_table()
                  if isinstance(op, torch._ops.OpOverload)}
    covered, missing = {}, []
    for op in core_forward_ops():
        how = _how(op, decomposed)
        if how is None:
            missing.append(op)
        else:
            covered[op] = how
    return Coverage(covered=covered, missing=missing)
