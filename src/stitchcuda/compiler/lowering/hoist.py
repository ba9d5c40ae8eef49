"""Work that depends on the weights alone runs once, not on every call (as weight prepacking does).

A model computes some values from its parameters and buffers only: BERT's position embeddings
(a slice of its ``position_ids`` buffer, then a gather from a weight), T5's relative position bias
(an embedding of constant bucket indices), Llama's rotary tables (``inv_freq`` times the constant
positions), and the concatenated weights of a merged Q/K/V projection (``schedule/horizontal.py``).
The groups that compute only such values (all of their inputs are parameters, constants or
unmutated buffers, none of their outputs is returned) are launched with the weight packs: before
the first call, and again whenever one of the tensors they read has a new ``data_ptr`` or
``_version`` (``load_state_dict``, an optimizer step, ``copy_``; see packing.py). Their results stay
in the program's own buffers, which no other value shares.

A buffer the forward writes back (BatchNorm's running statistics in training mode) is not static:
what reads it runs on every call. Only groups of plain kernels are moved; a library call's launch
needs the per-call handles the pack does not set up.
"""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import OpGraph
from stitchcuda.compiler.lowering.lowered import Lowering

STATIC_KINDS = ("parameter", "buffer", "constant")


def static_values(graph: OpGraph) -> set[str]:
    """The graph values that depend on no input and no random draw, only on parameters, constants
    and buffers the forward does not write back."""
    written = set(graph.mutations.values())
    static = {p.name for p in graph.placeholders if p.kind in STATIC_KINDS and p.name not in written}
    for n in graph.nodes:
        reads = [graph.getitems.get(i, (i, 0))[0] for i in n.inputs()]
        if reads and all(r in static for r in reads):
            static.add(n.name)
    static |= {name for name, (src, _) in graph.getitems.items() if src in static}
    return static


def hoist(low: Lowering, static: set[str]) -> None:
    """Mark the groups of plain kernels that compute static values only as launched with the packs,
    and add the tensors they read to the pack key."""
    graph = low.graph
    returned = set(graph.outputs) | set(graph.mutations)
    outputs = {ident for _, ident, _ in low.outputs}  # a value stored in an output's buffer is returned too
    returned |= {v for v, ident in low.storage.items() if ident in outputs}
    placeholders = {p.name for p in graph.placeholders}
    by_name = {n.name: n for n in graph.nodes}
    # what the packs can read: the static placeholders and what hoisted groups compute (a static
    # value a library call makes, a product of two buffers on cuBLAS say, exists only once the
    # per-call launches have run, so what reads it stays there)
    ready = {p.name for p in graph.placeholders if p.name in static}
    for lg in low.groups:
        nodes = lg.group.nodes
        if lg.kind == "alias" or lg.group.id < 0 or not nodes or any(n not in static or n in returned for n in nodes):
            continue
        reads = {graph.getitems.get(i, (i, 0))[0] for n in nodes for i in by_name[n].inputs()} - set(nodes)
        if not reads <= ready or any(x.gemm is not None or x.conv is not None or (x.call is not None and x.call.library)
                                     for x in lg.launches()):
            continue
        lg.hoisted = True
        ready |= set(nodes)
        for n in nodes:
            for i in by_name[n].inputs():
                ident = low.storage.get(i)
                if i in placeholders and ident is not None and ident not in low.pack_params:
                    low.pack_params.append(ident)
