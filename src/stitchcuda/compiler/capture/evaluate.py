"""An :class:`OpGraph` run with torch's own operators, node by node: the meaning of a captured (and
simplified) graph, on any device, with no kernel of ours.

Constant folding evaluates the nodes it folds with it; tests run whole graphs with it on the CPU to
hold each graph rewrite to the reference's function, and to hold a graph to the weights its model
holds now (a value derived from parameters at capture, and kept, would not follow a
``load_state_dict``).
"""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.graph import Node, OpGraph


class NotEvaluable(LookupError):
    """A node torch cannot run here (a random draw, an operator of no torch namespace)."""


def torch_value(text: Any) -> Any:
    """An argument as torch takes it back: dtypes, layouts and memory formats kept as text at capture;
    a device is the CPU."""
    import torch

    if isinstance(text, list):
        return [torch_value(v) for v in text]
    if isinstance(text, str):
        if text.startswith("device("):
            return torch.device("cpu")
        if text.startswith("torch.") and hasattr(torch, text[6:]):
            return getattr(torch, text[6:])
    return text


def evaluate_node(n: Node, values: dict[str, Any]) -> Any:
    """Node ``n`` run by torch on ``values`` (graph value name -> tensor)."""
    import torch

    def arg(a: Any) -> Any:
        if isinstance(a, str) and a.startswith("%"):
            return values[a[1:]]
        if isinstance(a, list):
            return [arg(v) for v in a]
        return torch_value(a)

    args, kwargs = arg(n.args), {k: arg(v) for k, v in n.kwargs.items()}
    if n.op == "stitchcuda.int_add":
        return args[0] + args[1]
    if n.op == "stitchcuda.buffer_view":  # over a value of its own storage: torch's as_strided
        return torch.as_strided(args[0], args[1], args[2], args[3])
    packet, name = n.op.split(".", 1)
    if packet != "aten":
        raise NotEvaluable(n.op)
    return getattr(getattr(torch.ops.aten, name), n.overload)(*args, **kwargs)


def run_graph(graph: OpGraph, state: dict[str, Any], inputs: list[Any]) -> list[Any]:
    """The graph's outputs, in order, for ``inputs`` and the parameters and buffers in ``state``
    (a module's ``state_dict(keep_vars=True)`` or any mapping of its keys, non-persistent buffers
    included); lifted constants from the graph's own values. The buffers the forward writes back
    (running statistics, state kept across calls) are copied into ``state``'s tensors, as the
    program updates them in place."""
    import torch

    values: dict[str, Any] = {}
    for p in graph.placeholders:
        if p.kind == "input":
            values[p.name] = inputs[int(p.target)]
        elif p.kind in ("parameter", "buffer"):
            values[p.name] = state[p.target]
        elif p.kind == "constant" and p.target in graph.constants and p.meta is not None:
            values[p.name] = torch.tensor(graph.constants[p.target], dtype=getattr(torch, p.meta.dtype))
        else:
            raise NotEvaluable(f"placeholder {p.name} ({p.kind}) has no value here")
    pieces: dict[str, list[tuple[str, int]]] = {}
    for item, (src, index) in graph.getitems.items():
        pieces.setdefault(src, []).append((item, index))
    for n in graph.nodes:
        values[n.name] = evaluate_node(n, values)
        for item, index in pieces.get(n.name, []):
            values[item] = values[n.name][index]
    targets = {p.name: p.target for p in graph.placeholders}
    with torch.no_grad():
        for value, buffer in graph.mutations.items():
            state[targets[buffer]].copy_(values[value])
    return [values[o] for o in graph.outputs]
