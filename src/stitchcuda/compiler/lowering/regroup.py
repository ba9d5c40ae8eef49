"""A kernel over values that regroup one another's leading dims (``[B*W, H, N, N]`` and
``[B, W, H, N, N]``; a copy's ``[B, H/P, W/P, P, P, C]`` and the ``[B*H*W/P^2, P*P, C]`` view of
it): it runs over the finest of those shapes, every read spread over it through strides, and a
value computed in one shape is the same element in any other (each is stored in row-major order).
"""

from __future__ import annotations

from stitchcuda.compiler.ir.expr import Expr, Leaf, Unsupported, leaf, numel, op, ref, reshape_strides


def regrouped(shape: tuple[int, ...], rows: tuple[int, ...]) -> bool:
    """Whether ``shape`` holds the elements of ``rows`` in the same order, its last dim the same
    (a row kernel's rows stay rows): a reshape of the leading dims only."""
    return shape == rows or (numel(shape) == numel(rows) and bool(shape) and shape[-1] == rows[-1])


def refined(shape: tuple[int, ...], shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape whose leading dims split every regrouping of ``shape`` among ``shapes``
    (a shifted-window mask added through ``[B*W, H, N, N] -> [B, W, H, N, N]`` and back), so
    that each operand reads through strides of it; ``shape`` itself where there is none or no
    such split."""
    regroupings = [s for s in shapes if s != shape and regrouped(s, shape)]
    finer = common_split([shape, *regroupings]) if regroupings else None
    if finer is None or [d for d in finer if d != 1] == [d for d in shape if d != 1]:
        return shape
    return finer


def onto(e: Expr, shape: tuple[int, ...]) -> Expr:
    """``e``, an expression over a regrouping of ``shape``, over ``shape`` itself:
    each read through the strides of the finer dims (every regrouping splits into them)."""
    frm = tuple(e.shape)
    if frm == shape or not regrouped(frm, shape):
        return e

    def over(x: Expr) -> Expr:
        if x.op == "leaf":
            lf: Leaf = x.leaf  # type: ignore[assignment]
            new = reshape_strides(frm, lf.effective_strides(frm), shape) if lf.plain else None
            if new is None:
                raise Unsupported(f"{lf.value} of shape {list(lf.shape)} cannot be read over {list(shape)}")
            return leaf(lf.value, shape, new, lf.offset)
        if x.op == "ref":  # a whole-row value or a per-row one: the same element either way
            return ref(x.ref, shape if numel(x.shape) == numel(shape) else shape[:-1] + (1,))
        if x.op == "const":
            return x
        return op(x.op, *(over(a) for a in x.args))

    return over(e)


def common_split(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """The shape whose dims split each of ``shapes`` (all of one element count: batch dims merged
    in some and apart in others), or None where the dims of one cut across another's."""
    cuts: set[int] = set()
    for s in shapes:
        size = 1
        for d in reversed(s):
            size *= d
            cuts.add(size)
    dims, below = [], 1
    for cut in sorted(cuts):
        if cut % below:
            return None
        dims.append(cut // below)
        below = cut
    return tuple(reversed(dims))


def regrouped_read(x: Expr, shape: tuple[int, ...]) -> Expr:
    """A read of ``x`` (a plain leaf) as ``shape``, which merges leading dims of it that no strides
    can merge (repeat_kv's expanded heads): the logical shape ``shape`` over a leaf that keeps the
    finer dims. Only a batched GEMM reads such an operand (``lower_gemm.strided_gemm``)."""
    lf: Leaf = x.leaf  # type: ignore[assignment]
    if x.op != "leaf" or not lf.plain or numel(x.shape) != numel(shape) or len(shape) < 2 \
            or tuple(x.shape[-2:]) != tuple(shape[-2:]) or common_split([tuple(x.shape[:-2]), tuple(shape[:-2])]) is None:
        raise Unsupported(f"a read of {lf.value if lf else '?'} as {list(shape)}: not a regrouping of batch dims")
    return Expr("leaf", leaf=lf, shape=tuple(shape))
