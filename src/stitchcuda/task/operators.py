"""The reference's operator graph with shapes, from a dry run on the meta device.

The model is built and run on ``meta`` tensors (no memory, no compute, no GPU) under a
dispatch mode that records every ATen operator with its input and output shapes and the
module it ran in. Repeated identical operators (a recurrent loop) are folded into one line
with a count. This is what the Planner reads next to the profile.
"""

from __future__ import annotations

import threading
import types
from typing import Any

from pydantic import BaseModel

from stitchcuda.task.record import Task

# torch's tracing machinery (torch.export, fx's patcher, the proxy and fake dispatch modes) keeps
# process-wide state, so two traces in threads of one process (a bench's tasks) corrupt each
# other: every trace of a reference holds this lock.
TRACE_LOCK = threading.Lock()

# Operators that only describe or move tensors: left out of the graph the Planner reads.
_QUIET = {"aten.detach", "aten.view", "aten._unsafe_view", "aten.t", "aten.alias", "aten.lift_fresh",
          "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.zeros", "aten.ones", "aten.new_empty",
          "aten.new_zeros", "aten.expand", "aten._to_copy", "aten.clone", "aten.unsqueeze", "aten.squeeze",
          "aten.slice", "aten.select", "aten.split", "aten.split_with_sizes", "aten.unbind", "aten.transpose",
          "aten.permute", "aten.reshape", "aten.contiguous", "aten.as_strided", "aten.copy_"}


class OpNode(BaseModel):
    op: str
    module: str
    inputs: list[str]
    output: str
    count: int = 1

    def line(self) -> str:
        times = f" x{self.count}" if self.count > 1 else ""
        where = f" [{self.module}]" if self.module else ""
        return f"{self.op}({', '.join(self.inputs)}) -> {self.output}{where}{times}"


def _shape(value: Any) -> str | None:
    import torch

    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace("torch.", "")
        return f"{dtype}[{','.join(str(d) for d in value.shape)}]"
    if isinstance(value, (list, tuple)):
        inner = [s for s in (_shape(v) for v in value) if s]
        return "(" + ", ".join(inner) + ")" if inner else None
    return None


def capture(task: Task, limit: int = 400) -> list[OpNode]:
    """Record the reference's ATen operators on the meta device; raises on models that cannot run there."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    module = types.ModuleType(f"stitchcuda_graph_{task.sha256[:8]}")
    exec(compile(task.source, task.path or task.name, "exec"), module.__dict__)  # the user's own reference
    torch.manual_seed(0)
    init = list(module.get_init_inputs())
    inputs = list(module.get_inputs())
    with torch.device("meta"):
        model = module.Model(*init)
    model.eval()
    meta_inputs = [torch.empty_like(t, device="meta") if isinstance(t, torch.Tensor) else t for t in inputs]

    stack: list[str] = []
    handles = []

    def enter(name: str):
        return lambda _module, _args: stack.append(name)  # returns None: the inputs stay as they are

    def leave(_module, _args, _output) -> None:  # must return None, or it would replace the output
        if stack:
            stack.pop()

    for name, sub in model.named_modules():
        if name:
            handles.append(sub.register_forward_pre_hook(enter(name)))
            handles.append(sub.register_forward_hook(leave))
    nodes: list[OpNode] = []

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = str(func.overloadpacket) if hasattr(func, "overloadpacket") else str(func)
            name = name.replace("aten::", "aten.")
            if name not in _QUIET:
                node = OpNode(op=name, module=stack[-1] if stack else "",
                              inputs=[s for s in (_shape(a) for a in args) if s], output=_shape(out) or "-")
                last = nodes[-1] if nodes else None
                if last and (last.op, last.module, last.inputs, last.output) == (
                        node.op, node.module, node.inputs, node.output):
                    last.count += 1
                elif len(nodes) < limit:
                    nodes.append(node)
            return out

    try:
        with TRACE_LOCK, torch.no_grad(), Recorder():
            model(*meta_inputs)
    finally:
        for h in handles:
            h.remove()
    return nodes


def graph_text(task: Task, max_lines: int = 80) -> tuple[str | None, str | None]:
    """(the graph as text, None) or (None, why it is not available)."""
    try:
        nodes = capture(task)
    except Exception as exc:  # a model that does not run on meta tensors: the Planner goes without
        return None, f"the dry run on the meta device failed: {type(exc).__name__}: {str(exc)[:200]}"
    lines = [n.line() for n in nodes]
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... {len(lines) - max_lines} more operators"]
    return "\n".join(lines), None
