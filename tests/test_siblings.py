"""Neighbouring independent elementwise kernels of one shape launched as one (lowering/siblings.py):
ShuffleNet's two halves of a channel shuffle, gathered from the same branches, in one kernel that
still computes the reference; kernels where one reads what the other writes stay apart."""

from __future__ import annotations

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.ir.expr import Program, Step, leaf
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.lowering.lower import lower
from stitchcuda.compiler.lowering.lowered import Lowered, Lowering
from stitchcuda.compiler.lowering.siblings import merge_siblings
from tests.test_offline_codegen import simulate, task_from
from tests.test_simplify import CHANNEL_SHUFFLES


def test_the_halves_of_a_channel_shuffle_are_one_kernel():
    c = compile_task(task_from("channel_shuffles", CHANNEL_SHUFFLES))
    low = lower(c.graph, c.groups)
    riders = [lg for lg in low.groups if lg.kind == "alias" and lg.describe.endswith("'s kernel")]
    assert len(riders) >= 3  # one a unit
    for lg in riders:  # each rode in the kernel of the group launched just before it
        host = next(x for x in low.groups if f"in group {x.group.id}'s kernel" in lg.describe)
        assert len(host.program.outputs) >= 2
    got, expected = simulate(c.task, c.graph, c.groups, train=True)
    for g, e in zip(got, expected, strict=True):
        assert ((g - e).abs().max() / e.abs().max()).item() < 1e-5


def _copy(gid: int, src: str, dst: str) -> Lowered:
    program = Program("pointwise", (4, 8), steps=[Step(f"s_{dst}", "full", leaf(src, (4, 8)))], outputs={dst: f"s_{dst}"},
                      output_shapes={dst: (4, 8)})
    return Lowered(FusionGroup(id=gid, kind="elementwise", nodes=[dst]), "pointwise", program=program)


def test_kernels_that_read_what_the_other_writes_stay_apart():
    low = Lowering(graph=None)  # type: ignore[arg-type]
    low.storage = {v: f"b_{v}" for v in ("x", "y", "z", "w")}
    low.groups = [_copy(0, "x", "y"), _copy(1, "y", "z")]  # z reads y
    assert merge_siblings(low) == 0
    low.groups = [_copy(0, "x", "y"), _copy(1, "z", "x")]  # the second writes what the first reads
    assert merge_siblings(low) == 0
    low.groups = [_copy(0, "x", "y"), _copy(1, "x", "z"), _copy(2, "x", "w")]
    assert merge_siblings(low) == 1 and low.groups[1].kind == "alias" and low.groups[2].kind == "pointwise"
    assert set(low.groups[0].program.outputs) == {"y", "z"}
