"""The reference's operator graph, captured with torch.export on fake tensors (no compute, no GPU).

The graph is ATen-level (after export's default decompositions), every value carries its shape
and dtype, parameters and buffers keep their ``state_dict`` names (so generated programs can
take the reference's weights), and each node remembers the module it ran in. Loops over time
steps (RNNs) are unrolled by the trace. Capture failures raise :class:`CaptureError` saying why.
"""

from __future__ import annotations

import types
from typing import Any, Literal

from pydantic import BaseModel, Field

from stitchcuda.task.operators import TRACE_LOCK
from stitchcuda.task.record import Task


class CaptureError(RuntimeError):
    """The reference's graph could not be captured; the message says why."""


class TensorMeta(BaseModel):
    shape: list[int]
    dtype: str  # "float32", "int64", ...

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


Arg = str | int | float | bool | None | list  # a value name ("%name"), a constant, or a list of them


class Node(BaseModel):
    name: str
    op: str = Field(description="ATen overload packet, e.g. aten.addmm, aten.gelu")
    overload: str = Field("default", description="e.g. default, Tensor, Scalar, dim_IntList")
    args: list[Any] = Field([], description="'%name' for graph values, constants otherwise")
    kwargs: dict[str, Any] = {}
    out: list[TensorMeta] = Field(description="one entry per tensor output (several for e.g. layer_norm)")
    module: str = Field("", description="the nn.Module path the op ran in ('' at top level)")

    def inputs(self) -> list[str]:
        """Names of the graph values this node reads."""
        found: list[str] = []

        def walk(value: Any) -> None:
            if isinstance(value, str) and value.startswith("%"):
                found.append(value[1:])
            elif isinstance(value, (list, tuple)):
                for v in value:
                    walk(v)

        walk(self.args)
        walk(list(self.kwargs.values()))
        return found


class Placeholder(BaseModel):
    name: str
    kind: Literal["input", "parameter", "buffer", "constant"]
    target: str = Field("", description="state_dict key for parameters and buffers; input index as text")
    meta: TensorMeta | None = None


class OpGraph(BaseModel):
    task: str
    placeholders: list[Placeholder]
    nodes: list[Node]
    outputs: list[str] = Field(description="names of the values the forward returns, in order")
    getitems: dict[str, tuple[str, int]] = Field({}, description="name -> (multi-output node, index)")

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def meta(self, name: str) -> TensorMeta | None:
        for p in self.placeholders:
            if p.name == name:
                return p.meta
        if name in self.getitems:
            src, index = self.getitems[name]
            return self.node(src).out[index]
        node = self.node(name)
        return node.out[0] if node.out else None

    def users(self) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for n in self.nodes:
            for i in n.inputs():
                found.setdefault(self.getitems.get(i, (i, 0))[0], []).append(n.name)
        return found


def _meta(value: Any) -> TensorMeta | None:
    import torch

    if isinstance(value, torch.Tensor):
        return TensorMeta(shape=[int(d) for d in value.shape], dtype=str(value.dtype).replace("torch.", ""))
    return None


def _arg(value: Any) -> Any:
    import torch.fx

    if isinstance(value, torch.fx.Node):
        return "%" + value.name
    if isinstance(value, (list, tuple)):
        return [_arg(v) for v in value]
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return repr(value)  # dtypes, devices, memory formats: kept as text


def capture(task: Task) -> OpGraph:
    """Export the reference's forward on fake inputs and describe it as an :class:`OpGraph`."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    module = types.ModuleType(f"stitchcuda_offline_{task.sha256[:8]}")
    try:
        exec(compile(task.source, task.path or task.name, "exec"), module.__dict__)  # the user's own reference
        torch.manual_seed(0)
        model = module.Model(*module.get_init_inputs()).eval()
        inputs = list(module.get_inputs())
    except Exception as exc:
        raise CaptureError(f"the reference did not build: {type(exc).__name__}: {exc}") from exc
    try:
        with TRACE_LOCK:
            with FakeTensorMode(allow_non_fake_inputs=True) as mode:
                fake = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]
            exported = torch.export.export(model, tuple(fake))
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CaptureError(f"torch.export could not capture the forward ({type(exc).__name__}: {first[:300]}); "
                           "the offline Coder needs a graph without data-dependent control flow") from exc
    return _describe(task.name, exported)


def _describe(name: str, exported: Any) -> OpGraph:
    import operator

    sig = exported.graph_signature
    kinds: dict[str, tuple[str, str]] = {}
    for spec in sig.input_specs:
        kind = spec.kind.name.lower()  # user_input, parameter, buffer, constant_tensor, ...
        label = {"user_input": "input", "parameter": "parameter", "buffer": "buffer"}.get(kind, "constant")
        kinds[spec.arg.name] = (label, spec.target or "")
    placeholders, nodes, outputs, getitems = [], [], [], {}
    inputs_seen = 0
    for node in exported.graph.nodes:
        val = node.meta.get("val")
        if node.op == "placeholder":
            kind, target = kinds.get(node.name, ("input", ""))
            if kind == "input":
                target, inputs_seen = str(inputs_seen), inputs_seen + 1
            placeholders.append(Placeholder(name=node.name, kind=kind, target=target, meta=_meta(val)))  # type: ignore[arg-type]
        elif node.op == "call_function" and node.target is operator.getitem:
            getitems[node.name] = (node.args[0].name, int(node.args[1]))
        elif node.op == "call_function":
            target = node.target
            packet = getattr(target, "_overloadpacket", None)
            op = f"aten.{packet.__name__}" if packet is not None else str(target)
            overload = getattr(target, "_overloadname", "default")
            outs = [m for m in ((_meta(v) for v in val) if isinstance(val, (list, tuple)) else [_meta(val)]) if m]
            stack = node.meta.get("nn_module_stack") or {}
            path = list(stack.values())[-1][0] if stack else ""
            nodes.append(Node(name=node.name, op=op, overload=overload, args=[_arg(a) for a in node.args],
                              kwargs={k: _arg(v) for k, v in node.kwargs.items()}, out=outs,
                              module=path.replace("L['self'].", "").replace("L__self___", "")))
        elif node.op == "output":
            flat = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
            outputs = [a.name for a in flat if hasattr(a, "name")]
    return OpGraph(task=name, placeholders=placeholders, nodes=nodes, outputs=outputs, getitems=getitems)
