"""Neighbouring elementwise kernels of one shape that do not depend on each other, launched as one
kernel: each thread computes both groups' elements at its index, so the second launch and the second
pass over their common inputs go (ShuffleNet's channel shuffle: the two halves a unit's output is
split into, each gathered from the same two branches by a copy of its own).

Merged are two pointwise programs next to each other in launch order, over the same shape, neither
launched with the weight packs, neither writing at an offset of its buffer, where neither reads a
buffer the other writes (a thread would read an element another thread writes). The second group
stays in the program's list as an alias that names the kernel it runs in.
"""

from __future__ import annotations

from stitchcuda.compiler.ir.expr import Program
from stitchcuda.compiler.lowering.lowered import Lowered, Lowering


def _program(lg: Lowered) -> Program | None:
    p = lg.program
    if lg.kind != "pointwise" or lg.hoisted or p is None or p.kind != "pointwise" or not p.steps or p.write_offsets:
        return None
    return p


def _buffers(low: Lowering, p: Program) -> tuple[set[str], set[str]]:
    """The buffers ``p`` reads and those it writes."""
    reads = {low.storage[v] for lf in p.leaves() for v in lf.reads()}
    return reads, {low.storage[v] for v in p.outputs}


def merge_siblings(low: Lowering) -> int:
    """Merge such neighbours in ``low.groups`` (in place); returns how many were merged."""
    merged = 0
    last: Lowered | None = None
    for k, lg in enumerate(low.groups):
        p, q = (_program(last) if last is not None else None), _program(lg)
        if p is not None and q is not None and p.shape == q.shape \
                and not {s.name for s in p.steps} & {s.name for s in q.steps}:
            p_reads, p_writes = _buffers(low, p)
            q_reads, q_writes = _buffers(low, q)
            if not (p_writes & (q_reads | q_writes)) and not (q_writes & p_reads):
                last.program = Program("pointwise", p.shape, steps=[*p.steps, *q.steps],  # type: ignore[union-attr]
                                       outputs={**p.outputs, **q.outputs},
                                       output_shapes={**p.output_shapes, **q.output_shapes},
                                       write_strides={**p.write_strides, **q.write_strides})
                last.describe += f"; with group {lg.group.id}'s: {lg.describe}"  # type: ignore[union-attr]
                low.groups[k] = Lowered(lg.group, "alias", describe=f"{lg.describe}, in group "
                                                                     f"{last.group.id}'s kernel")  # type: ignore[union-attr]
                merged += 1
                last = None  # two at a time: a third waits for the next pair
                continue
        if lg.kind != "alias":
            last = lg
    return merged
