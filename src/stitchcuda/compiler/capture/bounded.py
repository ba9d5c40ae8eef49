"""Data-dependent sizes bounded: a capture with ``torch.where(mask)``, ``nonzero`` or boolean
indexing (mixture-of-experts routing) rewritten into a graph of static shapes with the same results.

torch.export gives such a value an unbacked size symbol ``u``: the number of true elements of a
mask, known only at run time. The compiler's programs have static shapes, so each symbol is sized by
an upper bound instead: the mask's element count (every element true), or a tighter one the forward
states itself (``torch._check(n <= ...)``, which export records as the symbol's range). The rewrite:

- the source becomes a static ``nonzero``: a prefix sum over the mask places each true element's
  coordinates in its slot, and the slots past the true count hold coordinates 0 (always in range);
- every value sized by ``u`` is computed over the whole bound. Operators that work row by row along
  that dim (pointwise arithmetic, products whose rows are those rows, gathers, views that keep the
  dim) give the true rows unchanged, and compute harmless rows past them;
- where the rows past the count would reach a result (an ``index_add``/``index_put`` sink, a sum or
  maximum over the dim, a product contracting it), they are masked first: they add exactly 0, count
  as the reduction's identity, or are written to a scratch row that is cut off. Results stay exact.

What cannot be bounded is refused with the reason: a size no mask gives (``unique``,
``repeat_interleave`` by a tensor, a size read with ``.item()``), a result whose own size depends on
the data, the count used as a number (a mean over the chosen rows), or an operator that mixes rows
along the dim (a sort, a flip) before they are masked.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any


class UnboundedSize(ValueError):
    """A data-dependent size the rewrite cannot bound exactly; the message says why."""

# the sources of a data-dependent size that the rewrite turns into static work (boolean indexing is
# ``aten.index`` with a mask)
BOUNDED_OPS = ("aten.nonzero",)
# consumers whose result, along a dim they keep, depends on later rows of that dim (a prefix scan
# does not: the padding comes last)
_ROW_MIXING = ("flip", "roll", "sort", "argsort")
# ... and those that are exact when the padding is -inf first
_SOFTMAX = ("_softmax", "_log_softmax", "softmax", "log_softmax", "_safe_softmax")
# consumers that keep the rows along any dim apart (besides pointwise operators and views, which
# their schemas tell), and those that keep apart only the rows of their leading (batch) dim
_ROW_WISE = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "cumsum", "cumprod", "index", "index_select",
             "gather", "embedding", "index_put", "index_add", "scatter_add", "scatter", "clone", "cat", "stack",
             "tril", "triu", "full_like", "zeros_like", "ones_like", "empty_like", "_to_copy", "lift_fresh_copy",
             "sum", "amax", "amin", "mean", "prod", "var", "std", "any", "all", "max", "min", "argmax", "argmin",
             "logsumexp", "norm", "linalg_vector_norm", "topk", "constant_pad_nd", "flip", "roll", "sort", "argsort",
             "batch_norm", "_native_batch_norm_legit_no_training", *_SOFTMAX)
_PER_SAMPLE = ("convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
               "conv_transpose3d", "group_norm", "native_group_norm", "instance_norm", "max_pool1d", "max_pool2d",
               "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices", "avg_pool1d", "avg_pool2d",
               "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d",
               "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool1d", "adaptive_max_pool2d",
               "scaled_dot_product_attention", "upsample_nearest2d", "upsample_bilinear2d")
_NORMS = ("layer_norm", "native_layer_norm", "rms_norm")
_ASSERTS = ("_assert_scalar", "sym_constrain_range_for_size", "sym_constrain_range", "_assert_async")


@dataclass
class _Count:
    bound: int
    valid: Any  # fx node: bool [bound], true for the slots below the run-time count


def bound_data_dependent_sizes(exported: Any) -> dict[str, int]:
    """Rewrite ``exported``'s graph in place into one of static shapes (see the module docstring) and
    return each data-dependent size symbol with the bound that now sizes it (empty: nothing to do)."""

    gm = exported.graph_module
    graph = gm.graph
    if not any(_symbols(n.meta.get("val")) for n in graph.nodes):
        return {}
    ranges = {str(k): v for k, v in getattr(exported, "range_constraints", {}).items()}
    counts: dict[str, _Count] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or getattr(node, "_erased", False):
            continue
        fresh = _symbols(node.meta.get("val")) - _input_symbols(node)
        if not fresh and _name(node) == "index_put" and _mask_of(node) is not None:
            _bool_index_put(graph, node, counts)
            continue
        if not fresh:
            continue
        if node.target is operator.getitem or _name(node) in ("sym_size",):
            continue
        mask = _mask_of(node)
        if mask is None or len(fresh) != 1:
            raise UnboundedSize(f"the forward's shapes depend on its data in a way the compiler cannot bound: "
                               f"{node.name} ({_name(node)}) gives size "
                               f"{_shape_text(node.meta.get('val'))} (only the true elements of a mask, from "
                               "torch.where, nonzero or boolean indexing, are sized by an upper bound)")
        (sym,) = fresh
        numel = int(mask.meta["val"].numel())
        upper = getattr(ranges.get(sym), "upper", None)
        bound = min(numel, int(upper)) if upper is not None and _finite(upper) else numel
        with graph.inserting_before(node):
            cols, valid = _static_nonzero(graph, mask, bound, node)
        # two masks asserted to hold as many true elements share one symbol: the first one's validity
        # (a function of the count alone) serves both
        counts.setdefault(sym, _Count(bound, valid))
        if _name(node) == "nonzero":
            _replace_nonzero(graph, node, cols)
        else:  # x[mask]: the boolean index becomes one integer index per mask dim
            self_, indices = node.args
            where = next(i for i, t in enumerate(indices) if t is mask)
            node.args = (self_, [*indices[:where], *cols, *indices[where + 1:]])
    for node in list(graph.nodes):
        _bound_consumer(graph, node, counts)
    _drop_assertions(graph)
    graph.eliminate_dead_code()
    graph.lint()
    gm.recompile()
    _propagate(gm)
    return {sym: c.bound for sym, c in counts.items()}


def _bound_consumer(graph: Any, node: Any, counts: dict[str, _Count]) -> None:

    if node.op == "output":
        leaves = node.args[0] if isinstance(node.args[0], (list, tuple)) else [node.args[0]]
        for leaf in leaves:
            if hasattr(leaf, "meta") and _symbols(leaf.meta.get("val")) & counts.keys():
                raise UnboundedSize(f"the forward returns {leaf.name}, whose size depends on its data "
                                   f"{_shape_text(leaf.meta.get('val'))}: a program's outputs have static shapes")
        return
    if node.op != "call_function" or _name(node) in _ASSERTS or not (_input_symbols(node) & counts.keys()):
        return
    name = _name(node)
    if name == "sym_size":
        value = node.meta.get("val")
        syms = _symbols(value)
        if syms and str(_expr(value)) not in counts:
            raise UnboundedSize(f"the forward computes with a data-dependent size ({_expr(value)}), which no bound "
                               "makes exact")
        for user in list(node.users):
            if not (_name(user) in ("ge", "le", "gt", "lt", "eq", "ne") and all(
                    _name(u) in _ASSERTS for u in user.users)) and not _as_size(user, node):
                raise UnboundedSize(f"the forward uses the number of rows a mask chose as a number ({user.name}: "
                                   f"{_name(user)}), e.g. a mean over the chosen rows; the compiler sizes those rows "
                                   "by an upper bound and cannot use their count that way")
        bound = counts[str(_expr(value))].bound if syms else int(value)
        node.replace_all_uses_with(bound)
        graph.erase_node(node)
        return
    if node.target is operator.getitem:
        return
    out = _symbols(node.meta.get("val"))
    lost = _input_symbols(node) - out
    # an index_put whose values carry the padding adds it as 0s; any other (a write, or values
    # broadcast over the index) sends the padded slots to a scratch row
    scratch = name == "index_put" and not (len(node.args) > 3 and node.args[3] and _padded_dims(node.args[2], counts))
    if scratch:
        _scratch_row_put(graph, node, counts)
    elif name in ("index", "index_put", "index_add", "index_select", "gather", "scatter_add"):
        _mask_indices(graph, node, counts)  # padded index slots then read and write row 0, in range
    if not lost:
        _padded_dims(node, counts)  # a size computed from the count (a merge, a pad, a cat along it) is refused
        along = _along(node) & set(_padded_dims(node.args[0], counts)) if name in (*_SOFTMAX, *_ROW_MIXING) else set()
        if along and name in _SOFTMAX:
            _mask_arg(graph, node, 0, counts, float("-inf"))
        elif (along and name in _ROW_MIXING) or not _keeps_rows_apart(node, counts):
            raise UnboundedSize(f"the forward runs {name} over a dim whose size depends on its data ({node.name}); "
                                "padded to a bound, its rows would mix with the padding")
        return
    if name in ("index", "index_select", "gather", "select", "slice") and not (
            _padded_dims(node.args[0], counts) and name in ("select", "slice")):
        return  # reads rows the reference's own indices chose: all below the count
    if scratch:
        pass  # its padded slots write a scratch row (above)
    elif name in ("index_put", "index_add", "scatter_add"):
        values = {"index_put": 2, "index_add": 3, "scatter_add": 3}[name]
        if not _padded_dims(node.args[values], counts):
            raise UnboundedSize(f"the forward scatters values of static size through a data-dependent index "
                                f"({node.name}: {name}); the compiler masks the padding in the values, and these have none")
        _mask_arg(graph, node, values, counts, 0)
    elif name in ("sum", "any", "all", "amax", "amin", "prod"):
        dtype = node.args[0].meta["val"].dtype
        ident = {"sum": 0, "any": False, "all": True, "prod": 1,
                 "amax": _extreme(dtype, low=True), "amin": _extreme(dtype, low=False)}[name]
        _mask_arg(graph, node, 0, counts, ident)
    elif name in ("mm", "bmm", "addmm"):
        for i in ((1, 2) if name == "addmm" else (0, 1)):
            _mask_arg(graph, node, i, counts, 0)
    else:
        raise UnboundedSize(f"the forward reduces over a data-dependent number of rows with {name} ({node.name}); "
                           "the compiler bounds sums, maxima, minima, products and index_add/index_put by masking the "
                           "padding, not this")


def _static_nonzero(graph: Any, mask: Any, bound: int, near: Any) -> tuple[Any, Any]:
    """Nodes computing ``mask``'s true coordinates, one ``[bound]`` int64 column per dim of the mask
    (slots past the count hold 0), and the ``[bound]`` validity of each slot."""
    import torch

    aten = torch.ops.aten
    val = mask.meta["val"]
    shape, numel, device = list(val.shape), int(val.numel()), val.device
    meta = {k: near.meta[k] for k in ("nn_module_stack", "stack_trace") if k in near.meta}

    def call(target: Any, *args: Any, **kwargs: Any) -> Any:
        n = graph.call_function(target, args, kwargs)
        n.meta.update(meta)
        return n

    def full(size: list[int], value: Any, dtype: Any) -> Any:
        return call(aten.full.default, size, value, dtype=dtype, device=device, pin_memory=False)

    flat = call(aten.view.default, call(aten.ne.Scalar, mask, 0), [numel])
    ranks = call(aten.cumsum.default, call(aten._to_copy.default, flat, dtype=torch.int64), 0)
    count = call(aten.select.int, ranks, 0, numel - 1) if numel else full([], 0, torch.int64)
    slot = call(aten.sub.Tensor, ranks, full([], 1, torch.int64))
    keep = flat if bound >= numel else call(aten.logical_and.default, flat,
                                            call(aten.lt.Tensor, slot, full([], bound, torch.int64)))
    slot = call(aten.where.self, keep, slot, full([], bound, torch.int64))
    positions = call(aten.arange.start_step, 0, numel, dtype=torch.int64, device=device, pin_memory=False)
    filled = call(aten.index_put.default, full([bound + 1], 0, torch.int64), [slot], positions, False)
    flat_pos = call(aten.slice.Tensor, filled, 0, 0, bound)
    cols, stride = [], numel
    for size in shape:
        stride //= max(size, 1)
        q = call(aten.div.Tensor_mode, flat_pos, full([], max(stride, 1), torch.int64), rounding_mode="trunc")
        cols.append(call(aten.remainder.Tensor, q, full([], max(size, 1), torch.int64)))
    slots = call(aten.arange.start_step, 0, bound, dtype=torch.int64, device=device, pin_memory=False)
    return cols, call(aten.lt.Tensor, slots, count)


def _replace_nonzero(graph: Any, node: Any, cols: list[Any]) -> None:
    """``nonzero``'s users read its columns (``torch.where(mask)`` slices them out); a use of the whole
    ``[count, dims]`` tensor reads them stacked."""
    import torch

    aten = torch.ops.aten
    for user in list(node.users):
        a = user.args
        if _name(user) == "select" and a[1] == 1:
            column = cols[a[2]]
        elif _name(user) == "slice" and a[1] == 1 and len(a) >= 4 and a[3] == a[2] + 1 and (len(a) < 5 or a[4] == 1):
            with graph.inserting_before(user):
                column = graph.call_function(aten.unsqueeze.default, (cols[a[2]], 1))
        else:
            continue
        column.meta["val"] = user.meta["val"]  # sized by the count, which now stands for the bound
        user.replace_all_uses_with(column)
        graph.erase_node(user)
    if node.users:
        with graph.inserting_before(node):
            stacked = graph.call_function(aten.stack.default, (cols, 1))
        stacked.meta["val"] = node.meta["val"]
        node.replace_all_uses_with(stacked)
    graph.erase_node(node)


def _bool_index_put(graph: Any, node: Any, counts: dict[str, _Count]) -> None:
    """``out[mask] = values``: the mask becomes its true coordinates, under a count symbol of its own
    (the values' rows, if they have any, hold the same count: the trace asserted it), so that the
    consumer pass writes the padded slots to a scratch row, or masks them when accumulating."""
    import torch

    mask = _mask_of(node)
    val = mask.meta["val"]
    numel = int(val.numel())
    with graph.inserting_before(node):
        cols, valid = _static_nonzero(graph, mask, numel, node)
    count = val.fake_mode.shape_env.create_unbacked_symint()
    with val.fake_mode:
        for col in cols:
            col.meta["val"] = torch.empty((count,), dtype=torch.int64, device=val.device)
    counts[str(_expr(count))] = _Count(numel, valid)
    indices = node.args[1]
    where = next(i for i, t in enumerate(indices) if t is mask)
    node.update_arg(1, [*indices[:where], *cols, *indices[where + 1:]])


def _masked(graph: Any, before: Any, value: Any, counts: dict[str, _Count], fill: Any) -> Any:
    """``value`` with the rows past each count along its padded dims set to ``fill`` (nodes inserted
    before ``before``); ``value`` itself where it has no padded dim."""
    import torch

    dims = _padded_dims(value, counts)
    val = getattr(value, "meta", {}).get("val")
    masked = value
    with graph.inserting_before(before):
        for dim, count in dims.items():
            valid = count.valid
            for _ in range(val.dim() - dim - 1):
                valid = graph.call_function(torch.ops.aten.unsqueeze.default, (valid, -1))
            ident = graph.call_function(torch.ops.aten.full.default, ([], fill),
                                        {"dtype": val.dtype, "device": val.device, "pin_memory": False})
            masked = graph.call_function(torch.ops.aten.where.self, (valid, masked, ident))
            masked.meta["val"] = val
    return masked


def _mask_arg(graph: Any, node: Any, i: int, counts: dict[str, _Count], fill: Any) -> None:
    node.update_arg(i, _masked(graph, node, node.args[i], counts, fill))


def _mask_indices(graph: Any, node: Any, counts: dict[str, _Count]) -> None:
    """Integer index tensors of ``node`` with their padded slots set to 0: whatever arithmetic made
    them, the padding then reads and writes in range."""
    import torch

    def index(t: Any) -> bool:
        return hasattr(t, "meta") and t.meta["val"].dtype in (torch.int64, torch.int32) and bool(_padded_dims(t, counts))

    for i, a in enumerate(node.args):
        if isinstance(a, (list, tuple)):
            node.update_arg(i, [_masked(graph, node, t, counts, 0) if index(t) else t for t in a])
        elif i > 0 and index(a):
            _mask_arg(graph, node, i, counts, 0)


def _scratch_row_put(graph: Any, node: Any, counts: dict[str, _Count]) -> None:
    """A non-accumulating ``index_put`` with padded indices: the padded slots write a scratch row
    appended to the destination along the first indexed dim, cut off after."""
    import torch

    aten = torch.ops.aten
    self_, indices, values = node.args[:3]
    dim = next(i for i, t in enumerate(indices) if t is not None)
    index = indices[dim]
    dims = _padded_dims(index, counts)
    if not dims:
        return
    val = node.meta["val"]  # the destination's shape and dtype (``self_`` may be a node made here)
    shape = list(val.shape)
    scratch = shape[dim]
    with graph.inserting_before(node):
        pad = graph.call_function(aten.full.default, ([*shape[:dim], 1, *shape[dim + 1:]], 0),
                                  {"dtype": val.dtype, "device": val.device, "pin_memory": False})
        grown = graph.call_function(aten.cat.default, ([self_, pad], dim))
    rest = [t if t is None or not hasattr(t, "meta") else _masked(graph, node, t, counts, 0) for t in indices]
    rest[dim] = _masked(graph, node, index, counts, scratch)
    with graph.inserting_before(node):
        put = graph.call_function(node.target, (grown, rest, *node.args[2:]), dict(node.kwargs))
    # the node itself becomes the cut, so its name (an output's, in the graph signature) stays
    node.target, node.args, node.kwargs = aten.slice.Tensor, (put, dim, 0, scratch), {}


def _drop_assertions(graph: Any) -> None:
    """The trace's run-time checks (on the counts: ``u >= 0``, ``u <= bound``, two counts equal): they
    hold by construction, and the program checks none of a trace's assertions."""
    for node in list(graph.nodes):
        if node.op == "call_function" and _name(node) in _ASSERTS:
            graph.erase_node(node)


def _propagate(gm: Any) -> None:
    """Every node's ``val`` again, now with static shapes."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    args = []
    for node in gm.graph.nodes:
        node.meta.pop("unbacked_bindings", None)  # the counts' symbols, bound to sizes no longer there
        if node.op != "placeholder":
            continue
        v = node.meta.get("val")
        if isinstance(v, torch.Tensor):
            with mode:
                args.append(torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device=v.device))
        else:
            args.append(v)
    at: list[Any] = [None]

    class Propagation(FakeTensorProp):
        def run_node(self, n: Any) -> Any:
            at[0] = n
            return super().run_node(n)

    try:
        Propagation(gm, mode).propagate_dont_convert_inputs(*args)
    except Exception as exc:
        where = at[0].format_node() if at[0] is not None else "?"
        raise UnboundedSize(f"the graph with data-dependent sizes bounded could not be traced again, at {where} "
                            f"({type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''})"
                            ) from exc


# --- reading sizes -------------------------------------------------------------------------------

def _name(node: Any) -> str:
    target = node.target
    packet = getattr(target, "_overloadpacket", None)
    return packet.__name__ if packet is not None else getattr(target, "__name__", str(target))


def _expr(value: Any) -> Any:
    return value.node.expr if hasattr(value, "node") else value


def _unbacked(expr: Any) -> set[str]:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return {str(s) for s in free_unbacked_symbols(expr)}
    except Exception:
        return set()


def _symbols(val: Any) -> set[str]:
    import torch

    if isinstance(val, (list, tuple)):
        return set().union(*(_symbols(v) for v in val)) if val else set()
    if isinstance(val, torch.Tensor):
        return set().union(*(_unbacked(_expr(d)) for d in val.shape if not isinstance(d, int))) \
            if any(not isinstance(d, int) for d in val.shape) else set()
    if isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return _unbacked(_expr(val))
    return set()


def _input_symbols(node: Any) -> set[str]:
    return set().union(*(_symbols(a.meta.get("val")) for a in node.all_input_nodes)) if node.all_input_nodes else set()


def _padded_dims(arg: Any, counts: dict[str, _Count]) -> dict[int, _Count]:
    """The dims of ``arg`` sized by a bounded count (a size computed from a count is refused)."""
    val = getattr(arg, "meta", {}).get("val")
    dims: dict[int, _Count] = {}
    for i, d in enumerate(getattr(val, "shape", ())):
        if isinstance(d, int):
            continue
        expr = str(_expr(d))
        if expr in counts:
            dims[i] = counts[expr]
        elif _unbacked(_expr(d)) & counts.keys():
            raise UnboundedSize(f"{arg.name} has a size computed from a data-dependent count ({expr}); the compiler "
                               "bounds a count itself, not sizes derived from it")
    return dims


def _mask_of(node: Any) -> Any:
    """The boolean mask whose true elements a data-dependent size counts, or None."""
    import torch

    if _name(node) == "nonzero":
        return node.args[0]
    if _name(node) in ("index", "index_put") and len(node.args) >= 2:
        masks = [t for t in node.args[1] if t is not None and t.meta["val"].dtype == torch.bool]
        return masks[0] if len(masks) == 1 else None
    return None


def _keeps_rows_apart(node: Any, counts: dict[str, _Count]) -> bool:
    """Whether ``node``'s rows along its inputs' padded dims depend only on the same rows (the
    padding then cannot reach the rows below the count)."""
    import torch

    target, name = node.target, _name(node)
    if isinstance(target, torch._ops.OpOverload) and (
            torch.Tag.pointwise in target.tags or any(r.alias_info is not None for r in target._schema.returns)):
        return True  # pointwise, or a view (one that merges the padded dim gives a derived size, refused)
    if name in _ROW_WISE:
        return True
    padded = set().union(*(_padded_dims(a, counts).keys() for a in node.all_input_nodes))
    if name in _PER_SAMPLE:
        return padded == {0}
    if name in _NORMS:  # normalized over its trailing dims
        rank, normalized = node.args[0].meta["val"].dim(), len(node.args[1])
        return all(d < rank - normalized for d in padded)
    return False


def _along(node: Any) -> set[int]:
    """The dims a row-mixing operator works along."""
    a, name = node.args, _name(node)
    rank = max(a[0].meta["val"].dim(), 1)
    if name == "flip":
        dims = list(a[1])
    elif name == "roll":
        dims = list(a[2]) if len(a) > 2 and a[2] else list(range(rank))
    elif name in ("sort", "argsort"):
        dims = [a[1] if len(a) > 1 and isinstance(a[1], int) else node.kwargs.get("dim", -1)]
    else:
        dims = [a[1] if len(a) > 1 else node.kwargs.get("dim", -1)]
    return {d % rank for d in dims}


def _as_size(user: Any, size: Any) -> bool:
    """Whether ``size`` enters ``user`` only inside a list argument (a shape: view, expand, full)."""
    flat = [a for a in user.args if a is size] + [v for v in user.kwargs.values() if v is size]
    return not flat and user.op == "call_function" and _name(user) not in ("sym_size",) and \
        user.target.__module__ != "_operator"


def _shape_text(val: Any) -> str:
    if isinstance(val, (list, tuple)):
        return ", ".join(_shape_text(v) for v in val)
    return str(tuple(str(d) for d in getattr(val, "shape", ())))


def _finite(x: Any) -> bool:
    try:
        return abs(float(x)) != float("inf")
    except (TypeError, ValueError):
        return False


def _extreme(dtype: Any, low: bool) -> Any:
    import torch

    if dtype.is_floating_point:
        return float("-inf") if low else float("inf")
    info = torch.iinfo(dtype)
    return info.min if low else info.max
