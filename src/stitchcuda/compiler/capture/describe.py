"""The captured core-ATen graph as the lines the LLM Planner reads: one operator per line with
its input and output shapes and the module it ran in; a repeated run of lines (a recurrent
loop, a stack of equal blocks) folds into one block with a count.

It reads the same capture the offline compiler lowers (:func:`stitchcuda.compiler.capture.graph.capture`),
in the model's own mode, so both Planners see one graph.
"""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import CaptureError, OpGraph, TensorMeta, capture
from stitchcuda.task.record import Task

# Operators that only describe or move tensors: left out of what the Planner reads.
QUIET = frozenset({
    "aten.view", "aten._unsafe_view", "aten.reshape", "aten.t", "aten.alias", "aten.permute", "aten.expand",
    "aten.clone", "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select", "aten.transpose",
    "aten.contiguous", "aten.as_strided", "aten._to_copy", "aten.detach", "aten.lift_fresh_copy",
})


def _shape(meta: TensorMeta | None) -> str | None:
    return None if meta is None else f"{meta.dtype}[{','.join(map(str, meta.shape))}]"


def _fold(items: list[str], longest: int = 8) -> list[str]:
    """Runs of a repeated block of up to ``longest`` lines as one block with its count: a two-layer
    LSTM unrolled over 512 steps is two lines, not a thousand."""
    out: list[str] = []
    i = 0
    while i < len(items):
        best_k, best_reps = 1, 1
        for k in range(1, longest + 1):
            block = items[i:i + k]
            if len(block) < k:
                break
            reps = 1
            while items[i + reps * k:i + (reps + 1) * k] == block:
                reps += 1
            if reps > 1 and reps * k > best_reps * best_k:
                best_k, best_reps = k, reps
        if best_reps == 1:
            out.append(items[i])
        elif best_k == 1:
            out.append(f"{items[i]} x{best_reps}")
        else:
            out.append(f"x{best_reps} {{")
            out += [f"  {line}" for line in items[i:i + best_k]]
            out.append("}")
        i += best_k * best_reps
    return out


def lines(graph: OpGraph) -> list[str]:
    """One line per operator (views and copies left out), repeated runs folded."""
    found: list[str] = []
    for node in graph.nodes:
        if node.op in QUIET:
            continue
        inputs = [s for s in (_shape(graph.meta(name)) for name in node.inputs()) if s]
        outputs = [s for s in map(_shape, node.out) if s]
        out = outputs[0] if len(outputs) == 1 else "(" + ", ".join(outputs) + ")" if outputs else "-"
        where = f" [{node.module}]" if node.module else ""
        found.append(f"{node.op}({', '.join(inputs)}) -> {out}{where}")
    return _fold(found)


def graph_text(task: Task, graph: OpGraph | None = None, max_lines: int = 80) -> tuple[str | None, str | None]:
    """(the graph as text, None) or (None, why it is not available). ``graph``: a capture already
    made (the offline Coder's), so the task is not captured twice."""
    if graph is None:
        try:
            graph = capture(task)
        except CaptureError as exc:
            return None, str(exc)[:300]
    found = lines(graph)
    draws = [f"{d.fn} {d.dtype}[{','.join(map(str, d.shape))}]" for d in graph.draws.values()]
    if draws:  # the program draws these from torch's generator; the Verifier checks the output forgets them
        found.insert(0, "random draws each call: " + ", ".join(draws))
    if graph.state:
        found.insert(0, "state carried across calls (reassigned in forward): " + ", ".join(graph.state))
    if len(found) > max_lines:
        found = found[:max_lines] + [f"... {len(found) - max_lines} more operators"]
    return "\n".join(found), None
