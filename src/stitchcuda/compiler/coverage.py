"""Which forward operators of PyTorch's core ATen IR the compiler lowers, and how: the coverage
report (``python benchmarks/zoo.py coverage``). Backward operators are out of scope.

An operator is covered when the capture decomposes it (it never reaches a lowering), when a
family lowering takes it (``families/``), or when the fused lowerings take it alone (a pointwise
formula, a view, a GEMM, a convolution, a row reduction, a recurrent layer). Anything else is a
missing lowering, and a model holding it is refused with its name.
"""

from __future__ import annotations

from pydantic import BaseModel

from stitchcuda.compiler.capture.bounded import BOUNDED_OPS
from stitchcuda.compiler.capture.graph import DRAWN_OPS, keep_table
from stitchcuda.compiler.ir.op_table import DECOMPOSED, FAMILY, GROUPS_THEN_FAMILY, OPERATORS, refusal


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


def _how(op: str, decomposed: set[str]) -> str | None:
    """How the compiler takes ``op``, as the operator table (ir/op_table.py) says."""
    if op in DRAWN_OPS:  # the program draws them from torch's generator (graph.Draw)
        return "drawn by the program (torch's generator)"
    if op in decomposed:
        return "decomposed"
    if op in BOUNDED_OPS:
        return "bounded at capture: static shapes sized by the mask (capture/bounded.py)"
    why = refusal(op)
    if why is not None:
        return f"refused by design: {why}"
    info = OPERATORS.get(op)
    if info is None or info.lowering == DECOMPOSED:
        return None
    if info.lowering in (FAMILY, GROUPS_THEN_FAMILY):
        return "family"
    if info.role in ("gemm", "conv", "recurrent", "reduce", "view"):
        return {"gemm": "gemm", "conv": "convolution", "recurrent": "recurrent", "reduce": "row reduction",
                "view": "view"}[info.role]
    if info.tags & {"split", "strided"}:
        return "view"
    if info.role in ("const", "copy") or info.tags & {"gather", "cat", "pool", "zeros"}:
        return "data movement"
    return "pointwise"


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


def markdown() -> str:
    """The operator table (ir/op_table.py) as docs/compiler.md shows it: for each role, its
    operators by what lowers them, then the core-ATen forward operators nothing lowers."""
    by: dict[tuple[str, str], list[str]] = {}
    for op, info in OPERATORS.items():
        lowering = "refused" if refusal(op) else info.lowering
        by.setdefault((info.role, lowering), []).append(op.removeprefix("aten."))  # the compiler's own keep their prefix
    lines = ["| role | lowered by | operators |", "|---|---|---|"]
    for (role, lowering), names in sorted(by.items()):
        lines.append(f"| {role} | {lowering} | {', '.join(f'`{n}`' for n in sorted(names))} |")
    found = coverage()
    lines += ["", f"{len(found.covered)} of {found.total} core-ATen forward operators are covered (lowered, decomposed "
              f"or bounded at capture, drawn by the program or refused with a reason); no lowering yet: "
              + ", ".join(f"`{op.split('.', 1)[1]}`" for op in found.missing) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
