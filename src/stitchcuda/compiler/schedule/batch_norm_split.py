"""Training-mode batch norm split into its statistics and an elementwise normalisation.

A batch norm over the channels of an NCHW value (training mode: the batch's own statistics) is a
reduction over every dim but the channel, which no row kernel takes: its family lowering makes a
statistics kernel and an apply kernel, and the ReLU (or residual add) after it was a third pass
over the tensor. Here the operator keeps computing the statistics (its mean and 1/std outputs, and
the new running statistics), and its normalised output becomes the elementwise chain
``(x - mean) * rstd * weight + bias`` over channel views of those, named as the output was, so that
fusion merges it with the elementwise work around it: batch norm, ReLU and a residual add in one
pass, or the normalisation applied as a softmax's row kernel loads its rows (Inductor splits batch
norm the same way). The arithmetic is the apply kernel's, in its order, on the same float mean and
1/std.
"""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import Node, OpGraph, TensorMeta

_TRAINING_BATCH_NORM = "aten._native_batch_norm_legit_functional"


def training_batch_norm_as_pointwise(graph: OpGraph) -> OpGraph:
    """``graph`` where each float32 training-mode batch norm whose output is read computes its
    statistics alone, the output being the elementwise normalisation by them."""
    item_of = {(src, index): item for item, (src, index) in graph.getitems.items()}
    split = [n for n in graph.nodes if _splittable(n, item_of)]
    if not split:
        return graph
    out = graph.model_copy(deep=True)
    chains: dict[str, list[Node]] = {}
    for n in split:
        normalised = item_of[(n.name, 0)]
        del out.getitems[normalised]
        stats = []
        for index, what in ((1, "mean"), (2, "rstd")):
            name = item_of.get((n.name, index)) or f"{n.name}__{what}"
            out.getitems[name] = (n.name, index)
            stats.append(name)
        chains[n.name] = _normalisation(n, normalised, stats)
    nodes: list[Node] = []
    for n in out.nodes:
        nodes.append(n)
        nodes += chains.get(n.name, [])
    out.nodes = nodes
    return out


def _splittable(n: Node, item_of: dict[tuple[str, int], str]) -> bool:
    if n.op != _TRAINING_BATCH_NORM or len(n.args) < 8 or not bool(n.args[5]) or len(n.out) < 3:
        return False
    x = n.out[0]
    return x.dtype == "float32" and len(x.shape) >= 2 and isinstance(n.args[0], str) \
        and (n.name, 0) in item_of and all(a is None or isinstance(a, str) for a in n.args[1:3])


def _normalisation(n: Node, normalised: str, stats: list[str]) -> list[Node]:
    """``(x - mean) * rstd [* weight] [+ bias]`` over ``n``'s input, its last node named ``normalised``."""
    full = n.out[0]
    channels = full.shape[1]
    per_channel = [1, channels] + [1] * (len(full.shape) - 2)
    chain: list[Node] = []

    def channel_view(value: str, tag: str) -> str:
        name = f"{n.name}__{tag}_c"
        chain.append(Node(name=name, op="aten.view", args=[value, per_channel],
                          out=[TensorMeta(shape=per_channel, dtype="float32")], module=n.module))
        return "%" + name

    steps = [("aten.sub", channel_view("%" + stats[0], "mean")), ("aten.mul", channel_view("%" + stats[1], "rstd"))]
    if n.args[1] is not None:
        steps.append(("aten.mul", channel_view(n.args[1], "weight")))
    if n.args[2] is not None:
        steps.append(("aten.add", channel_view(n.args[2], "bias")))
    current = n.args[0]
    for i, (op, operand) in enumerate(steps):
        name = normalised if i == len(steps) - 1 else f"{n.name}__norm{i}"
        chain.append(Node(name=name, op=op, overload="Tensor", args=[current, operand],
                          out=[TensorMeta(shape=list(full.shape), dtype="float32")], module=n.module))
        current = "%" + name
    return chain
