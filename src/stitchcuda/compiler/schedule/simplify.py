"""Graph simplifications made once after capture, before fusion: work a CUDA engineer would not
launch a kernel for.

- ``drop_identity_clones``: a view to its input's own shape (``expand(x, x.shape)``) and core
  ATen's ``clone`` of a dense value (eval-mode dropout leaves one after every residual branch of
  a transformer), or a pad by nothing (``F.unfold`` without padding), are the value itself in a
  functional graph: their readers read the source. A
  clone that is returned, written back to a buffer, or of a strided view (a real layout copy)
  stays, unless elementwise operators alone read it and its rows stay contiguous: their kernels
  read the view through strides.
- ``fold_constants``: values that depend on no input, parameter or buffer (``arange`` ->
  ``unsqueeze`` -> ``ge`` index math of a mask, ``full``, ``scalar_tensor``) are computed here
  once with torch on the CPU and become lifted constants, which the program recreates once at
  construction (``MAX_CONSTANT`` elements at most): kernels no call needs to run again. It is
  constant folding (what torch.compile's freezing does); nothing that depends on data is folded.
- ``index_ranges_as_slices``: advanced indexing along one dim by a constant run of positions
  (``x[:, :, [4, 5]]``: Falcon's multi-query heads picked out of the fused QKV product) is a slice,
  a view its readers read through strides, not a gather kernel;
- ``negated_pieces_as_signs``: a concatenation of negated pieces and plain ones (a rotary
  embedding's ``rotate_half``: ``cat(-x2, x1)``) is the concatenation of the plain pieces times a
  constant vector of -1 and 1 (exact), so the consuming kernel reads the pieces where they are
  instead of three kernels laying out the negation and the concatenation;
- ``tanh_gelu_formulas``: GELU's tanh approximation written out (HF's ``gelu_new``:
  ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``) is ``gelu(x, approximate="tanh")``,
  the one operator a GEMM's epilogue takes (GPT-2's MLP: its product, bias and activation in one call);
- ``shuffles_as_concatenations``: a contiguous copy of a permuted view of a concatenation whose
  view splits the concatenated dim along the pieces (ShuffleNet's channel shuffle:
  ``cat([a, b], 1).view(n, 2, c, h, w).transpose(1, 2).contiguous()``) is the concatenation of the
  pieces, each viewed and permuted: one copy kernel reading the pieces where they are, not the
  concatenation laid out and then copied again in another order;
- ``commute_row_permutes`` (row_permutes.py): a linear over a permute of its rows reads the rows
  in their own order, and the permute moves to its output (no copy before the product);
- every split, chunk and unbind becomes one slice (select) per piece (rewrite.py): plain views,
  which a group reads through strides wherever its pieces go;
- ``training_batch_norm_as_pointwise`` (batch_norm_split.py): a training-mode batch norm computes
  its statistics alone, its output the elementwise normalisation by them, which fusion merges with
  the ReLU or residual add after it;
- ``split_shared_views`` (shared_views.py): a view several elementwise kernels read becomes one
  view per reader, so none is laid out by a copy of its own.
"""

from __future__ import annotations

from typing import Any

from stitchcuda.compiler.capture.evaluate import evaluate_node
from stitchcuda.compiler.capture.graph import MAX_CONSTANT, Node, OpGraph, Placeholder, TensorMeta
from stitchcuda.compiler.ir.expr import permutation
from stitchcuda.compiler.ir.op_table import tagged
from stitchcuda.compiler.ir.ops import (
    C_TYPES,
    RECURRENT_OPS,
    RECURRENT_SEQUENCE_OPS,
    RESHAPES,
    SPLITS,
    VIEW_OPS,
)
from stitchcuda.compiler.schedule.batch_norm_split import training_batch_norm_as_pointwise
from stitchcuda.compiler.schedule.copy_reads import read_copies_through_views
from stitchcuda.compiler.schedule.horizontal import merge_shared_linears
from stitchcuda.compiler.schedule.rewrite import split_into_slices, without_unread
from stitchcuda.compiler.schedule.roles import op_role
from stitchcuda.compiler.schedule.row_permutes import commute_row_permutes
from stitchcuda.compiler.schedule.shared_views import split_shared_views

# Operators folded: those whose result is the same bits on the CPU as on the GPU (views, fills,
# index math, comparisons, casts, correctly rounded arithmetic). Transcendentals (log, exp, ...) and
# float reductions, whose last bit depends on the device's library or summation order, are left to
# the program: a bucket index computed from a log (T5's relative positions) must round as the
# reference's does on its GPU.
_EXACT = {f"aten.{op}" for op in (
    "arange", "full", "full_like", "zeros", "zeros_like", "ones", "ones_like", "scalar_tensor", "new_full",
    "new_zeros", "new_ones", "lift_fresh_copy", "clone", "alias", "detach", "contiguous", "_to_copy", "view",
    "_unsafe_view", "reshape", "expand", "unsqueeze", "squeeze", "permute", "transpose", "t", "slice", "select",
    "flatten", "cat", "stack", "repeat", "index", "gather", "index_select", "where", "masked_fill",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_and",
    "bitwise_or", "bitwise_xor", "bitwise_not", "add", "sub", "rsub", "mul", "div", "neg", "abs", "minimum",
    "maximum", "clamp", "clamp_min", "clamp_max", "remainder", "fmod", "floor_divide", "floor", "ceil", "round",
    "sign", "triu", "tril", "flip", "roll")} | {"stitchcuda.int_add"}
# ... and reductions, of integers and bools only
_INTEGER_REDUCTIONS = {"aten.any", "aten.all", "aten.sum", "aten.amax", "aten.amin", "aten.cumsum", "aten.max",
                       "aten.min"}


def simplify(graph: OpGraph) -> OpGraph:
    graph = read_copies_through_views(commute_row_permutes(merge_shared_linears(tanh_gelu_formulas(
        negated_pieces_as_signs(index_ranges_as_slices(fold_constants(drop_identity_clones(graph))))))))
    graph = split_into_slices(graph, {n.name for n in graph.nodes if n.op in SPLITS})
    return split_shared_views(shuffles_as_concatenations(training_batch_norm_as_pointwise(graph)))


# views that are their input when they keep its shape
_SAME_SHAPE_VIEWS = tagged("same_shape")
# views that keep a dense value dense, element order unchanged (expand only to its own shape)
_DENSE_VIEWS = tagged("dense")


def _shapes(graph: OpGraph, produced: dict[str, Node]) -> dict[str, list[int]]:
    """Every tensor value's shape (graph.meta searches the graph on each call)."""
    shapes = {p.name: p.meta.shape for p in graph.placeholders if p.meta is not None}
    shapes |= {n.name: n.out[0].shape for n in graph.nodes if n.out}
    for item, (src, index) in graph.getitems.items():
        outs = produced[src].out if src in produced else []
        if index < len(outs):
            shapes[item] = outs[index].shape
    return shapes


def _dense(name: str, produced: dict[str, Node], shapes: dict[str, list[int]], graph: OpGraph) -> bool:
    """Whether value ``name`` is laid out densely in its shape's order: a placeholder, a computed
    value, or a reshape of one."""
    if name not in produced:
        return name in shapes and name not in graph.getitems  # a placeholder
    n = produced[name]
    if len(n.out) != 1:
        return False
    if n.op not in VIEW_OPS:
        return True
    src = n.inputs()[0] if n.inputs() else None
    if n.op not in _DENSE_VIEWS or src is None or src not in shapes:
        return False
    if n.op == "aten.expand" and shapes[src] != n.out[0].shape:
        return False
    return _dense(src, produced, shapes, graph)


def _read_elementwise(name: str, users: dict[str, list[str]], produced: dict[str, Node]) -> bool:
    """Whether elementwise operators alone read value ``name`` (their kernels read any strides)."""
    readers = users.get(name, [])
    return bool(readers) and all(op_role(produced[r]) == "elementwise" for r in readers)


def _rows_contiguous(view: str, produced: dict[str, Node], shapes: dict[str, list[int]], graph: OpGraph) -> bool:
    """Whether the view chain ending in ``view`` keeps its last dim contiguous in the dense value it
    starts from (torch's own view rules, on a meta tensor): read through strides, its rows still
    load coalesced, where a transposed last dim would not (a copy kernel tiles that)."""
    import torch

    chain: list[Node] = []
    name = view
    while name in produced and produced[name].op in VIEW_OPS:
        n = produced[name]
        if len(n.inputs()) != 1 or name in graph.getitems:
            return False
        chain.append(n)
        name = n.inputs()[0]
    if name in graph.getitems or name not in shapes or not chain:
        return False
    values: dict[str, Any] = {name: torch.empty(shapes[name], device="meta")}
    try:
        for n in reversed(chain):
            values[n.name] = evaluate_node(n, values)
    except Exception:  # noqa: BLE001 - a chain torch does not replay here: left as a copy
        return False
    last = values[view]
    return last.dim() > 0 and (last.stride(-1) == 1 or last.shape[-1] == 1)


def _zero_pad(n: Node) -> bool:
    """A pad by nothing on every side (``F.unfold`` without padding pads by zeros): a copy."""
    pads = n.args[1] if len(n.args) > 1 else None
    return n.op in ("aten.pad", "aten.constant_pad_nd") and isinstance(pads, list) and bool(pads) \
        and all(isinstance(p, int) and p == 0 for p in pads)


def drop_identity_clones(graph: OpGraph) -> OpGraph:
    """``graph`` without same-shape views, clones of dense values and clones of strided views with
    contiguous rows that only elementwise operators read: their readers read the source."""
    produced = {n.name: n for n in graph.nodes}
    shapes = _shapes(graph, produced)
    users = graph.users()
    kept = set(graph.outputs) | set(graph.mutations) | set(graph.mutations.values())
    alias: dict[str, str] = {}
    for n in graph.nodes:
        if n.op in _SAME_SHAPE_VIEWS and n.name not in kept and len(n.inputs()) == 1 and len(n.out) == 1 \
                and shapes.get(n.inputs()[0]) == n.out[0].shape:
            alias[n.name] = alias.get(n.inputs()[0], n.inputs()[0])  # a view to its own shape: the value
            continue
        if (n.op != "aten.clone" and not _zero_pad(n)) or n.name in kept or len(n.inputs()) != 1:
            continue
        if n.kwargs.get("memory_format") not in (None, "torch.preserve_format", "torch.contiguous_format"):
            continue
        src = alias.get(n.inputs()[0], n.inputs()[0])
        if src in graph.getitems or src in kept:
            continue  # a piece of a split (a view), or a value the forward returns: the copy is real
        if not _dense(src, produced, shapes, graph) and not (
                _read_elementwise(n.name, users, produced) and _rows_contiguous(src, produced, shapes, graph)):
            continue  # a clone of a strided view lays it out: a real copy, unless kernels that read
            # through strides alone read it, along rows it keeps contiguous (a residual add after
            # batch_first attention's transposed output)
        alias[n.name] = src
    if not alias:
        return graph
    out = graph.model_copy(deep=True)
    out.nodes = [n.reading(alias) for n in out.nodes if n.name not in alias]
    return out


# -- constant folding ---------------------------------------------------------------------------------

def fold_constants(graph: OpGraph) -> OpGraph:
    """``graph`` with the small values that depend on nothing the forward is given as lifted
    constants (computed here with torch), and the nodes only they read dropped."""
    import torch

    values: dict[str, Any] = {}
    for p in graph.placeholders:
        if p.kind == "constant" and p.target in graph.constants and p.meta is not None:
            values[p.name] = torch.tensor(graph.constants[p.target], dtype=getattr(torch, p.meta.dtype))
    folded: dict[str, Node] = {}
    for n in graph.nodes:
        if len(n.out) != 1 or n.name in graph.outputs or n.out[0].dtype not in C_TYPES \
                or n.out[0].numel > MAX_CONSTANT or any(v not in values for v in n.inputs()):
            continue
        if n.op not in _EXACT and not (n.op in _INTEGER_REDUCTIONS and all(
                values[v].dtype in (torch.bool, torch.int32, torch.int64) for v in n.inputs())):
            continue
        try:
            value = evaluate_node(n, values)
        except Exception:  # noqa: BLE001 - not folded: the program computes it as before
            continue
        if not isinstance(value, torch.Tensor) or list(value.shape) != n.out[0].shape \
                or str(value.dtype).replace("torch.", "") != n.out[0].dtype:
            continue
        values[n.name] = value
        folded[n.name] = n
    if not folded:
        return graph
    readers = graph.users()
    live = {name for name in folded
            if any(r not in folded for r in readers.get(name, []))}  # read by work that stays
    recurrent = {n.name for n in graph.nodes if n.op in RECURRENT_OPS | RECURRENT_SEQUENCE_OPS}
    # a recurrent cell's zero state is folded into its kernel already: leave those fills to it
    keep = {name for name in live if any(r in recurrent for r in readers.get(name, []))}
    while True:  # ... and everything they read
        more = {v for name in keep for v in folded[name].inputs() if v in folded} - keep
        if not more:
            break
        keep |= more
    out = graph.model_copy(deep=True)
    dropped = set(folded) - keep
    for name in [n.name for n in graph.nodes if n.name in live and n.name not in keep]:  # graph order
        target = f"_folded_{name}"
        out.placeholders.append(Placeholder(name=name, kind="constant", target=target,
                                            meta=folded[name].out[0].model_copy()))
        out.constants[target] = values[name].tolist()
    out.nodes = [n for n in out.nodes if n.name not in dropped]
    return out


def index_ranges_as_slices(graph: OpGraph) -> OpGraph:
    """``graph`` where each ``aten.index`` by constant runs of evenly spaced ascending positions is
    a chain of ``aten.slice`` (and a view where the indices' broadcast adds size-1 dims): one index
    along one dim, or several on adjacent dims, each varying along its own axis of their broadcast
    (``mask[arange(B)[:, None], arange(S)[None, :]]``, the whole mask, in HF's mask making): the
    same values in the same place, as views."""
    import torch

    constants = {p.name: torch.tensor(graph.constants[p.target]) for p in graph.placeholders
                 if p.kind == "constant" and p.target in graph.constants and p.meta is not None
                 and p.meta.dtype in ("int64", "int32")}
    nodes, changed = [], False
    for n in graph.nodes:
        pieces = _index_ranges(graph, n, constants)
        if pieces is None:
            nodes.append(n)
            continue
        source, shape = n.args[0], list(graph.meta(n.args[0][1:]).shape)  # type: ignore[union-attr]
        steps: list[tuple[str, list, list[int]]] = []  # (op, its arguments after the source, its shape)
        for dim, start, stop, step in pieces:
            shape[dim] = len(range(start, stop, step))
            steps.append(("aten.slice", [dim, start, stop, step], list(shape)))
        if shape != n.out[0].shape:  # the broadcast's size-1 dims
            steps.append(("aten.view", [n.out[0].shape], n.out[0].shape))
        for k, (op, args, out_shape) in enumerate(steps):
            last = k == len(steps) - 1
            piece = Node(name=n.name if last else f"{n.name}__s{k}", op=op,
                         overload="Tensor" if op == "aten.slice" else "default", args=[source, *args], module=n.module,
                         out=n.out if last else [TensorMeta(shape=out_shape, dtype=n.out[0].dtype)])
            nodes.append(piece)
            source = "%" + piece.name
        changed = True
    if not changed:
        return graph
    out = graph.model_copy()
    out.nodes = nodes
    return out


def _index_ranges(graph: OpGraph, n: Node, constants: dict[str, Any]) -> list[tuple[int, int, int, int]] | None:
    """The (dim, start, stop, step) of each slice ``n`` is, where it is an index by constant runs on
    adjacent dims whose broadcast puts each along an axis of its own, in order."""
    if n.op != "aten.index" or len(n.args) != 2 or not isinstance(n.args[0], str) or not isinstance(n.args[1], list):
        return None
    picks = [(d, a) for d, a in enumerate(n.args[1]) if a is not None]
    x = graph.meta(n.args[0][1:])
    if not picks or x is None or [d for d, _ in picks] != list(range(picks[0][0], picks[0][0] + len(picks))) or \
            not all(isinstance(a, str) and a[1:] in constants for _, a in picks):
        return None
    indices = [constants[a[1:]] for _, a in picks]
    rank = max(i.dim() for i in indices)
    found, last_axis = [], -1
    for (dim, _), index in zip(picks, indices, strict=True):
        padded = [1] * (rank - index.dim()) + list(index.shape)
        varying = [d for d, size in enumerate(padded) if size != 1]
        if len(varying) > 1 or (varying and varying[0] <= last_axis) or (len(picks) > 1 and not varying):
            return None
        last_axis = varying[0] if varying else last_axis
        size = x.shape[dim]
        positions = [p + size if p < 0 else p for p in index.reshape(-1).tolist()]
        if not positions or any(not 0 <= p < size for p in positions):
            return None
        step = positions[1] - positions[0] if len(positions) > 1 else 1
        if step < 1 or positions != list(range(positions[0], positions[0] + step * len(positions), step)):
            return None
        found.append((dim, positions[0], positions[-1] + 1, step))
    return found


def negated_pieces_as_signs(graph: OpGraph) -> OpGraph:
    """``graph`` where each float ``cat`` with a piece that is ``neg(y)`` read by the cat alone reads
    ``y`` there, its result multiplied by a constant of -1 over that piece's span of the
    concatenated dim and 1 elsewhere (named as the cat was, so its readers read the product)."""
    import torch

    users = graph.users()
    produced = {n.name: n for n in graph.nodes}
    pinned = set(graph.outputs) | set(graph.mutations.values())
    plans: dict[str, tuple[list[str], list[float], int]] = {}
    for n in graph.nodes:
        if n.op != "aten.cat" or len(n.out) != 1 or n.out[0].dtype != "float32" or not isinstance(n.args[0], list):
            continue
        rank = len(n.out[0].shape)
        dim = (n.args[1] if len(n.args) > 1 else 0) % max(rank, 1)
        pieces, signs, negated = [], [], False
        for a in n.args[0]:
            src = produced.get(a[1:]) if isinstance(a, str) else None
            meta = graph.meta(a[1:]) if isinstance(a, str) else None
            if meta is None or len(meta.shape) != rank:
                break
            flip = src is not None and src.op == "aten.neg" and users.get(src.name) == [n.name] \
                and src.name not in pinned and isinstance(src.args[0], str)
            pieces.append(src.args[0] if flip else a)  # type: ignore[union-attr]
            signs += [-1.0 if flip else 1.0] * meta.shape[dim]
            negated |= flip
        else:
            if negated and len(signs) == n.out[0].shape[dim] <= MAX_CONSTANT:
                plans[n.name] = (pieces, signs, dim)
    if not plans:
        return graph
    out = graph.model_copy(deep=True)
    nodes = []
    for n in out.nodes:
        if n.name not in plans:
            nodes.append(n)
            continue
        pieces, signs, dim = plans[n.name]
        rank = len(n.out[0].shape)
        sign_shape = [len(signs)] + [1] * (rank - 1 - dim)
        name = f"_signs_{n.name}"
        out.placeholders.append(Placeholder(name=name, kind="constant", target=name,
                                            meta=TensorMeta(shape=sign_shape, dtype="float32")))
        out.constants[name] = torch.tensor(signs).view(sign_shape).tolist()
        unsigned = n.model_copy(update={"name": f"{n.name}__unsigned", "args": [pieces, *n.args[1:]]})
        nodes += [unsigned, Node(name=n.name, op="aten.mul", overload="Tensor", args=["%" + unsigned.name, "%" + name],
                                 out=n.out, module=n.module)]
    out.nodes = without_unread(graph, nodes, lambda n: n.op == "aten.neg")  # the negations the cats read alone
    return out


_SQRT_2_OVER_PI = 0.7978845608028654


def tanh_gelu_formulas(graph: OpGraph) -> OpGraph:
    """``graph`` where ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3)))``, in any order of
    its products' and sums' operands, is ``aten.gelu(x, approximate="tanh")`` named as its last product."""
    produced = {n.name: n for n in graph.nodes}
    found = {n.name: x for n in graph.nodes if (x := _gelu_tanh_of(n, produced)) is not None}
    if not found:
        return graph
    nodes = [n.model_copy(update={"op": "aten.gelu", "overload": "default", "args": ["%" + found[n.name]],
                                  "kwargs": {"approximate": "tanh"}}) if n.name in found else n for n in graph.nodes]
    out = graph.model_copy()
    out.nodes = without_unread(graph, nodes, lambda n: n.op in _FORMULA_OPS)  # the formula's inner nodes
    return out


_FORMULA_OPS = ("aten.mul", "aten.add", "aten.pow", "aten.tanh")


def _gelu_tanh_of(n: Node, produced: dict[str, Node]) -> str | None:
    """The ``x`` whose tanh-approximated GELU ``n`` computes, else None."""
    def node(a: Any, op: str) -> Node | None:
        m = produced.get(a[1:]) if isinstance(a, str) and a.startswith("%") else None
        return m if m is not None and m.op == op and not m.kwargs and len(m.args) == 2 else None

    def scaled(a: Any, factor: float) -> str | None:  # a = v * factor (either order): v
        m = node(a, "aten.mul")
        if m is None:
            return None
        for v, c in (m.args, m.args[::-1]):
            if isinstance(v, str) and isinstance(c, (int, float)) and abs(c - factor) <= 1e-6 * abs(factor):
                return v
        return None

    def plus(a: Any) -> tuple[Any, Any] | None:  # a = p + q
        m = node(a, "aten.add")
        return (m.args[0], m.args[1]) if m is not None else None

    if n.op != "aten.mul" or n.kwargs or len(n.args) != 2 or n.out[0].dtype != "float32":
        return None
    for half, rest in (n.args, n.args[::-1]):
        x = scaled(half, 0.5)
        terms = plus(rest)
        if x is None or terms is None:
            continue
        for t, one in (terms, terms[::-1]):
            tanh = produced.get(t[1:]) if isinstance(t, str) else None
            if one != 1 or tanh is None or tanh.op != "aten.tanh":
                continue
            inner = plus(scaled(tanh.args[0], _SQRT_2_OVER_PI))
            for lin, cubic in (inner, inner[::-1]) if inner is not None else ():
                p = node(scaled(cubic, 0.044715), "aten.pow")
                if lin == x and p is not None and p.args[0] == x and p.args[1] == 3:
                    return x[1:]
    return None



def shuffles_as_concatenations(graph: OpGraph) -> OpGraph:
    """``graph`` where each contiguous ``clone`` of ``permute(view(cat(pieces, d)))``, the view splitting
    ``d`` into (pieces, m) with every piece m wide along ``d``, is ``cat`` of each piece viewed (``d`` of
    size 1 there) and permuted, along the dim ``d`` went to, named as the clone. Where the clone is
    only read merged back to the cat's shape and then sliced along the merged dim at whole groups
    (ShuffleNet's ``chunk(2, dim=1)`` after the shuffle), each slice is instead its own such ``cat``
    of the pieces' slices, viewed to the slice's shape: two contiguous halves, no whole shuffled copy."""
    produced = {n.name: n for n in graph.nodes}
    users = graph.users()
    pinned = set(graph.outputs) | set(graph.mutations) | set(graph.mutations.values())
    plans: dict[str, list[Node]] = {}
    chained: set[str] = set()
    for n in graph.nodes:
        chain = _shuffle_chain(n, produced, graph)
        if chain is None or n.name in pinned:
            continue
        cat, view, order = chain
        d = (cat.args[1] if len(cat.args) > 1 else 0) % len(cat.out[0].shape)
        pieces: list[Node] = []
        for i, a in enumerate(cat.args[0]):
            meta = graph.meta(a[1:])
            shape = [*meta.shape[:d], 1, *meta.shape[d:]]  # type: ignore[union-attr]
            viewed = Node(name=f"{n.name}__piece{i}", op="aten.view", args=[a, shape],
                          out=[TensorMeta(shape=shape, dtype=meta.dtype)], module=n.module)  # type: ignore[union-attr]
            pieces += [viewed, Node(name=f"{n.name}__piece{i}_permuted", op="aten.permute",
                                    args=["%" + viewed.name, order], module=n.module,
                                    out=[TensorMeta(shape=[shape[k] for k in order], dtype=viewed.out[0].dtype)])]
        chained |= {cat.name, view.name, n.inputs()[0]}
        halves = _shuffled_slices(n, order, d, users, produced, pinned)
        if halves is None:
            plans[n.name] = [*pieces, Node(name=n.name, op="aten.cat", args=[["%" + p.name for p in pieces[1::2]],
                                                                            order.index(d)], out=n.out, module=n.module)]
            continue
        j = order.index(d + 1)  # the piece's own dim, outer half of the merged one
        k = len(cat.args[0])
        for merge, slices in halves:
            chained |= {n.name, merge.name}
            for sl in slices:
                start, end = sl.args[2] // k, min(sl.args[3], n.out[0].shape[j] * k) // k
                made = []
                for p in pieces[1::2]:
                    shape = list(p.out[0].shape)
                    shape[j] = end - start
                    made.append(Node(name=f"{sl.name}__{p.name}", op="aten.slice", overload="Tensor",
                                     args=["%" + p.name, j, start, end, 1], module=n.module,
                                     out=[TensorMeta(shape=shape, dtype=p.out[0].dtype)]))
                shape = list(made[0].out[0].shape)
                shape[order.index(d)] = k
                shuffled = Node(name=f"{sl.name}__shuffled", op="aten.cat", module=n.module,
                                args=[["%" + m.name for m in made], order.index(d)],
                                out=[TensorMeta(shape=shape, dtype=sl.out[0].dtype)])
                plans[sl.name] = [*made, shuffled, Node(name=sl.name, op="aten.view", module=sl.module, out=sl.out,
                                                        args=["%" + shuffled.name, list(sl.out[0].shape)])]
        plans[n.name] = pieces  # placed where the clone was: before every slice that reads them
    if not plans:
        return graph
    out = graph.model_copy(deep=True)
    nodes = [m for n in out.nodes for m in plans.get(n.name, [n])]
    out.nodes = without_unread(graph, nodes, lambda x: x.name in chained)  # the shuffle's views and cats, once unread
    return out


def _shuffle_chain(n: Node, produced: dict[str, Node], graph: OpGraph) -> tuple[Node, Node, list[int]] | None:
    """(the cat, its splitting view, the permutation) where ``n`` is a contiguous clone of a permuted
    view of a concatenation whose view splits the concatenated dim into one index per piece."""
    if n.op != "aten.clone" or len(n.inputs()) != 1 or len(n.out) != 1:
        return None
    if n.kwargs.get("memory_format") not in (None, "torch.preserve_format", "torch.contiguous_format"):
        return None
    permute = produced.get(n.inputs()[0])
    if permute is None or len(permute.inputs()) != 1:
        return None
    view = produced.get(permute.inputs()[0])
    if view is None or view.op not in RESHAPES or len(view.inputs()) != 1:
        return None
    order = permutation(permute, len(view.out[0].shape))
    cat = produced.get(view.inputs()[0])
    if order is None or cat is None or cat.op != "aten.cat" or len(cat.out) != 1 or not isinstance(cat.args[0], list):
        return None
    whole, split = cat.out[0].shape, view.out[0].shape
    rank = len(whole)
    d = (cat.args[1] if len(cat.args) > 1 else 0) % max(rank, 1)
    metas = [graph.meta(a[1:]) if isinstance(a, str) else None for a in cat.args[0]]
    if len(split) != rank + 1 or split[:d] != whole[:d] or split[d + 2:] != whole[d + 1:]:
        return None
    if split[d] != len(metas) or any(m is None or len(m.shape) != rank or m.shape[d] != split[d + 1] for m in metas):
        return None
    return cat, view, order


def _shuffled_slices(n: Node, order: list[int], d: int, users: dict[str, list[str]], produced: dict[str, Node],
                     pinned: set[str]) -> list[tuple[Node, list[Node]]] | None:
    """[(a reshape of the shuffled ``n`` merging its (m, pieces) dims back, its slices)] where that is
    all that reads ``n``, and every slice takes whole groups of pieces along the merged dim; else None."""
    j = order.index(d + 1)
    if j + 1 >= len(order) or order[j + 1] != d or n.name in pinned:
        return None
    k = n.out[0].shape[j + 1]
    merged = [*n.out[0].shape[:j], n.out[0].shape[j] * k, *n.out[0].shape[j + 2:]]
    found = []
    for name in users.get(n.name, []):
        merge = produced[name]
        if merge.op not in RESHAPES or merge.name in pinned or list(merge.out[0].shape) != merged:
            return None
        slices = [produced[s] for s in users.get(merge.name, [])]
        if not slices or not all(_whole_groups(sl, j, merged[j], k) and sl.name not in pinned for sl in slices):
            return None
        found.append((merge, slices))
    return found or None


def _whole_groups(sl: Node, dim: int, size: int, k: int) -> bool:
    """Whether ``sl`` slices ``dim`` (``size`` long) with step 1, from and to multiples of ``k``."""
    if sl.op != "aten.slice" or len(sl.args) < 4 or not all(isinstance(a, int) for a in sl.args[1:4]):
        return False
    rank = len(sl.out[0].shape)
    step = sl.args[4] if len(sl.args) > 4 else 1
    start, end = sl.args[2], min(sl.args[3], size)
    return sl.args[1] % rank == dim and step == 1 and 0 <= start < end and start % k == 0 and end % k == 0
