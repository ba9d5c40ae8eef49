"""The compiler's front door: capture, fuse and check that every group lowers, decomposing a kept
operator after all where its whole-operator lowering refuses an instance of it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from stitchcuda.compiler.capture.graph import KEEP, OpGraph, capture
from stitchcuda.compiler.emit.codegen import CodegenOptions, Unsupported, generate, lower
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import SPLITS
from stitchcuda.compiler.lowering.lowered import Lowering
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.compiler.schedule.rewrite import split_into_slices
from stitchcuda.compiler.schedule.simplify import simplify
from stitchcuda.task.record import Task

# Kept operators whose decomposition the general lowerings take when a fused lowering refuses an
# instance (a softmax over a non-trailing dim, a group norm with huge groups). Library operators
# (convolutions, GEMMs) and pointwise formulas are never decomposed: that would only lose them.
_DECOMPOSABLE = {"aten.softmax", "aten._safe_softmax", "aten.log_softmax", "aten.layer_norm", "aten.group_norm", "aten.instance_norm",
                 "aten.rms_norm", "aten.adaptive_avg_pool1d", "aten.adaptive_avg_pool2d",
                 "aten.adaptive_avg_pool3d", "aten.matmul", "aten.embedding"}
_KEPT = {f"aten.{name.split('.')[0]}" for name in KEEP} & _DECOMPOSABLE


def _is_split(graph: OpGraph, name: str) -> bool:
    return any(n.name == name and n.op in SPLITS for n in graph.nodes)


@dataclass
class Compiled:
    """A task the compiler can write programs for: its graph and fusion groups."""

    task: Task
    graph: OpGraph
    groups: list[FusionGroup]
    decomposed: frozenset[str] = frozenset()  # kept operators decomposed for this task
    isolated: frozenset[str] = frozenset()  # nodes lowered on their own: their fused group did not lower
    seconds: dict[str, float] = field(default_factory=dict)  # capture, lower, emit: where compiling went
    lowerings: dict[str, Lowering] = field(default_factory=dict)  # by options: each lowered once
    sources: dict[str, str] = field(default_factory=dict)  # by options: each program emitted once

    def lowering(self, options: CodegenOptions) -> Lowering:
        """The groups lowered under ``options``, once per distinct options (the check that every
        group lowers already made the default one)."""
        key = options.model_dump_json()
        if key not in self.lowerings:
            started = time.perf_counter()
            self.lowerings[key] = lower(self.graph, self.groups, options)
            self._add("lower", time.perf_counter() - started)
        return self.lowerings[key]

    def program(self, options: CodegenOptions | None = None) -> str:
        options = options or CodegenOptions()
        key = options.model_dump_json()
        if key not in self.sources:
            low = self.lowering(options)
            started = time.perf_counter()
            self.sources[key] = generate(self.task, self.graph, self.groups, options, low)
            self._add("emit", time.perf_counter() - started)
        return self.sources[key]

    def _add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds


def compile_task(task: Task, max_rounds: int = 3) -> Compiled:
    """Capture ``task`` and make sure every group lowers. A group that fails is split: its nodes are
    lowered on their own, the values between them materialised (a split becomes one view per
    piece). A kept operator (softmax, group norm, a pooling, ...) that fails on its own is then
    decomposed into core ATen and the task captured again, up to ``max_rounds`` times. What is
    left is single operators whose own lowering refuses. Raises CaptureError or Unsupported
    (naming every problem)."""
    decompose: frozenset[str] = frozenset()
    seconds = {"capture": 0.0, "lower": 0.0}
    while True:
        started = time.perf_counter()
        captured = simplify(capture(task, decompose))
        seconds["capture"] += time.perf_counter() - started
        isolate: frozenset[str] = frozenset()
        while True:
            started = time.perf_counter()
            graph = split_into_slices(captured, isolate)
            groups = fuse(graph, isolate=isolate)
            try:
                low = lower(graph, groups, CodegenOptions())
            except Unsupported as exc:
                seconds["lower"] += time.perf_counter() - started
                # a failed group's nodes go alone (a split alone still read apart becomes slices);
                # a kept operator that still fails alone is decomposed, and the task captured again
                alone = {n for nodes in exc.groups if len(nodes) > 1 or _is_split(graph, nodes[0])
                         for n in nodes} - isolate
                if alone:
                    isolate |= alone
                    continue
                more = (exc.ops & _KEPT) - decompose
                if more and max_rounds > 0:
                    decompose, max_rounds = decompose | more, max_rounds - 1
                    break
                raise
            seconds["lower"] += time.perf_counter() - started
            return Compiled(task, graph, groups, decompose, isolate, seconds,
                            {CodegenOptions().model_dump_json(): low})
