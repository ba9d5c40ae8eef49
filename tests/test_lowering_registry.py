"""The one registry of lowerings, and the fuser's promise that the groups stay a DAG.

- every fused group lowering and every per-operator family lowering is registered in
  compiler/lowering/registry.py; a group goes to the first fused lowering that takes it, in order
  (attention groups to attention, convolution groups to the convolution lowering);
- the groups the fuser forms (with its incremental cycle check) are acyclic when contracted, checked
  by brute force on tasks of every kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.lowering.registry import GROUPS, OPERATORS, group_lowering_for
from stitchcuda.task.load import load_task_file

CLASSES = Path(__file__).parent / "fixtures" / "compiler_classes"
KERNELBENCH = Path(__file__).resolve().parents[2] / "shared" / "kernelbench" / "KernelBench"


def test_every_lowering_is_in_the_one_registry_in_order():
    assert [g.name for g in GROUPS] == ["attention", "recurrent layer", "recurrent cell", "convolution",
                                        "matrix product", "group norm", "row", "pointwise"]
    assert {"aten.cumsum", "aten.max_pool2d", "aten.sort", "aten.clone", "aten.native_layer_norm"} <= set(OPERATORS)


def _tasks() -> list[Path]:
    found = sorted(CLASSES.glob("*.py"))
    if KERNELBENCH.is_dir():
        found += sorted(KERNELBENCH.glob("level2/*.py"))[::5] + sorted(KERNELBENCH.glob("level1/*.py"))[::10]
    return found


@pytest.mark.parametrize("path", _tasks(), ids=lambda p: p.stem[:40])
def test_each_group_goes_to_a_lowering_and_the_groups_stay_a_dag(path):
    compiled = compile_task(load_task_file(path))
    graph = compiled.graph
    owner = {n: g.id for g in compiled.groups for n in g.nodes}
    by_name = {n.name: n for n in graph.nodes}
    expected = {"attention": "attention", "conv": "convolution"}
    for g in compiled.groups:  # the registry's choice follows the group's anchor
        nodes = [by_name[n] for n in g.nodes]
        if g.kind in expected and not (len(nodes) == 1 and nodes[0].op in OPERATORS):
            assert group_lowering_for(g, nodes).name == expected[g.kind], (g.id, g.kind, [n.op for n in nodes])
    edges: dict[int, set[int]] = {g.id: set() for g in compiled.groups}
    for n in graph.nodes:
        for i in n.inputs():
            src = graph.getitems.get(i, (i, 0))[0]
            if src in owner and owner[src] != owner[n.name]:
                edges[owner[src]].add(owner[n.name])
    state: dict[int, int] = {}

    def visit(u: int) -> None:  # brute-force DFS: a grey node reached again is a cycle
        state[u] = 1
        for v in edges[u]:
            assert state.get(v) != 1, f"groups {u} and {v} depend on each other"
            if v not in state:
                visit(v)
        state[u] = 2

    for u in edges:
        if u not in state:
            visit(u)


def test_a_fused_attempt_that_refuses_leaves_nothing_behind():
    """A single operator whose fused lowering refuses it falls back to its family lowering; the
    buffers and configurations the attempt had made are dropped first (Lowering.mark/undo)."""
    from stitchcuda.compiler.capture.graph import OpGraph
    from stitchcuda.compiler.lowering.lowered import Lowering

    low = Lowering(graph=OpGraph(task="t", placeholders=[], nodes=[], outputs=[]))
    low.intermediates.append(("b_kept", [4]))
    low.storage["kept"] = "b_kept"
    mark = low.mark()
    low.intermediates.append(("b_scratch", [8]))
    low.storage["scratch"] = "b_scratch"
    low.ctypes["b_scratch"] = "int64_t"
    low.uses_blas = True
    low.undo(mark)
    assert low.intermediates == [("b_kept", [4])] and low.storage == {"kept": "b_kept"}
    assert low.ctypes == {} and not low.uses_blas
