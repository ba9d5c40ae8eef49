"""Scatters: ``scatter`` (src, value, add and amax/amin reductions), ``scatter_add``,
``index_add``, ``index_put`` (plain or accumulating) and ``slice_scatter`` / ``select_scatter``.

A scatter copies ``self`` into the fresh output, then one thread per update element writes into
it (atomically where updates add up); an update whose index is out of range is dropped. The
slice/select scatters need no second pass: each output element reads from exactly one source.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.cuda_files import render_kernel
from stitchcuda.compiler.lowering.families.layout import (
    advanced,
    broadcast_at,
    check_index,
    convert,
    coords,
    copy_into,
    index_read,
    index_reads,
    index_type,
    int_arg,
    launch_line,
    lit,
    map_kernel,
    merge,
    offset,
    scalar_text,
    single_output,
    where_of,
    zero_of,
)
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided
from stitchcuda.compiler.lowering.registry import lowering

# -- scatters ------------------------------------------------------------------------------------------

def atomic_add(ctype: str, ptr: str, value: str, where: str) -> str:
    if ctype in ("float", "int32_t"):
        return f"atomicAdd({ptr}, {value});"
    if ctype == "int64_t":
        return (f"atomicAdd(reinterpret_cast<unsigned long long*>({ptr}), "
                f"static_cast<unsigned long long>({value}));")
    raise Unsupported(f"{where}: an accumulating scatter into {ctype}")


def atomic_max_min(ctype: str, ptr: str, value: str, kind: str, where: str) -> str:
    """amax/amin with NaN winning, as torch's scatter_reduce does (a CAS loop on the bits)."""
    if ctype != "float":
        raise Unsupported(f"{where}: scatter_reduce {kind} into {ctype}")
    better = ">" if kind == "amax" else "<"
    return (f"{{ const float nv = {value}; int* p = reinterpret_cast<int*>({ptr}); int old = *p, seen;\n"
            f"    do {{ seen = old; const float cur = __int_as_float(seen);\n"
            f"      if (isnan(cur) || !(isnan(nv) || nv {better} cur)) break;\n"
            f"      old = atomicCAS(p, seen, __float_as_int(nv)); }} while (old != seen); }}")


def update_kernel(ctx: FamilyContext, node: Node, what: str, shape: Sequence[int], out: Strided,
                  inputs: dict[str, Strided], body: Callable[[list[str], str], str]) -> KernelCall:
    """One thread per update element (iteration space ``shape``); ``body`` writes into ``y``."""
    space = Strided("", out.ctype, tuple(shape), tuple(_contiguous(shape)))
    ity = index_type(space, out, *inputs.values())
    name = ctx.kernel_name(node, what)
    block = ctx.block
    names, unravel = coords(shape, "i", ity)
    params = [f"const {x.ctype}* __restrict__ {p}" for p, x in inputs.items()] + [f"{out.ctype}* y"]
    n = space.numel
    source = render_kernel("map.cu.j2", block=block, name=name, params=params, ity=ity, limit=lit(n, ity),
                           unravel=unravel, text=body(names, ity))
    return KernelCall({name: source}, launch_line(name, n, block, [x.ptr for x in inputs.values()] + [out.ptr]))


def _contiguous(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return list(reversed(strides))


def _value_operand(ctx: FamilyContext, node: Node, value: Any, out: Strided, where: str
                   ) -> tuple[dict[str, Strided], Callable[[list[str], str], str]]:
    """A scatter's update value: a tensor ``v`` read at the update coordinates, or a scalar."""
    if isinstance(value, str) and value.startswith("%"):
        v = ctx.read(value)
        return {"v": v}, lambda c, ity: convert(f"v[{offset(v, broadcast_at(v, c), ity)}]", v.ctype, out.ctype)
    text = scalar_text(value, out.ctype, where)
    return {}, lambda c, ity: text


SCATTER_REDUCE = {"add": "sum", "sum": "sum", "amax": "amax", "amin": "amin"}


@lowering("aten.scatter", "aten.scatter_add", "aten.scatter_reduce")
def scatter(ctx: FamilyContext, node: Node) -> KernelCall:
    """``out = self`` then, for every element ``c`` of ``index``, ``out[c with c[dim] = index[c]]``
    takes (or adds, or max/min-combines) ``src[c]`` or the scalar. Among duplicate indices without
    a reduction the winner is unspecified, as in torch."""
    where = where_of(node)
    a = node.args
    x, out = ctx.read(a[0]), single_output(ctx, node)
    dim = int(a[1]) % max(len(x.shape), 1)
    k = ctx.read(a[2])
    check_index(k, where)
    reduce = "sum" if node.op == "aten.scatter_add" else None
    include_self = True
    if node.op == "aten.scatter_reduce":
        reduce = SCATTER_REDUCE.get(a[4] if len(a) > 4 else node.kwargs.get("reduce", ""))
        include_self = bool(node.kwargs.get("include_self", a[5] if len(a) > 5 else True))
    elif "reduce" in node.kwargs:
        reduce = SCATTER_REDUCE.get(node.kwargs["reduce"])
        if reduce != "sum":
            raise Unsupported(f"{where}: scatter with reduce={node.kwargs['reduce']!r}")
    if node.op == "aten.scatter_reduce" and reduce is None:
        raise Unsupported(f"{where}: scatter_reduce {a[4] if len(a) > 4 else '?'!r} (only sum, amax, amin)")
    if len(k.shape) != len(x.shape):
        raise Unsupported(f"{where}: index of rank {len(k.shape)} for a {len(x.shape)}-d input")
    vin, value = _value_operand(ctx, node, a[3], out, where)
    for name, v in vin.items():
        if len(v.shape) != len(k.shape) or any(kn > vn for kn, vn in zip(k.shape, v.shape, strict=True)):
            raise Unsupported(f"{where}: src {list(v.shape)} smaller than the index {list(k.shape)}")
        vin[name] = Strided(v.ptr, v.ctype, k.shape, v.strides, v.offset)  # read over the index's extent
    n = x.shape[dim] if x.shape else 1
    steps = [copy_into(ctx, node, x, out)]

    def target(c: list[str], ity: str) -> tuple[str, str]:
        at = list(c)
        at[dim] = "j"
        return (f"const long long j = {index_read(k, c, ity)};\n  if (j < 0 || j >= {n}LL) return;\n  ",
                f"y + ({offset(out, at, 'long long')})")

    if reduce is not None and not include_self:
        identity = {"sum": zero_of(out.ctype), "amax": "(-INFINITY)", "amin": "INFINITY"}[reduce]

        def reset(c: list[str], ity: str) -> str:
            head, ptr = target(c, ity)
            return f"{head}*({ptr}) = {identity};"

        steps.append(update_kernel(ctx, node, "reset", k.shape, out, {"k": k}, reset))

    def body(c: list[str], ity: str) -> str:
        head, ptr = target(c, ity)
        if reduce is None:
            return f"{head}*({ptr}) = {value(c, ity)};"
        if reduce == "sum":
            return head + atomic_add(out.ctype, ptr, value(c, ity), where)
        return head + atomic_max_min(out.ctype, ptr, value(c, ity), reduce, where)

    steps.append(update_kernel(ctx, node, "scatter", k.shape, out, {"k": k, **vin}, body))
    return merge(*steps, describe=f"{node.name}: {node.op[5:]} along dim {dim}" + (f" ({reduce})" if reduce else ""))


@lowering("aten.index_add")
def index_add(ctx: FamilyContext, node: Node) -> KernelCall:
    """``out = self``, then ``out[..., index[j], ...] += alpha * source[..., j, ...]`` (atomics)."""
    where = where_of(node)
    a = node.args
    x, out = ctx.read(a[0]), single_output(ctx, node)
    dim = int(a[1]) % max(len(x.shape), 1)
    k, src = ctx.read(a[2]), ctx.read(a[3])
    check_index(k, where)
    alpha = node.kwargs.get("alpha", a[4] if len(a) > 4 else 1)
    if len(src.shape) != len(x.shape) or len(k.shape) > 1:
        raise Unsupported(f"{where}: source {list(src.shape)} into {list(x.shape)} by {list(k.shape)}")
    scale = "" if alpha == 1 else f"{scalar_text(alpha, out.ctype, where)} * "

    def body(c: list[str], ity: str) -> str:
        at = list(c)
        at[dim] = "j"
        kc = [c[dim]] if k.shape else []
        read = convert(f"s[{offset(src, c, ity)}]", src.ctype, out.ctype)
        return (f"const long long j = {index_read(k, kc, ity) if kc else 'static_cast<long long>(k[0])'};\n"
                f"  if (j < 0 || j >= {x.shape[dim]}LL) return;\n  "
                + atomic_add(out.ctype, f"y + ({offset(out, at, 'long long')})", scale + read, where))

    return merge(copy_into(ctx, node, x, out),
                 update_kernel(ctx, node, "index_add", src.shape, out, {"k": k, "s": src}, body),
                 describe=f"{node.name}: index_add along dim {dim}")


@lowering("aten.index_put", "aten._unsafe_index_put")
def index_put(ctx: FamilyContext, node: Node) -> KernelCall:
    """``out = self``; ``out[indices] = values`` (or ``+=`` with accumulate), values broadcast to
    the shape ``self[indices]`` would have."""
    where = where_of(node)
    a = node.args
    x, out = ctx.read(a[0]), single_output(ctx, node)
    spec = list(a[1])
    ks = index_reads(ctx, node, spec, where)
    accumulate = bool(a[3] if len(a) > 3 else node.kwargs.get("accumulate", False))
    pos, bshape, first, rest = advanced(x.shape, spec, [k.shape for k in ks], where)
    unindexed = [d for d in range(len(x.shape)) if d not in pos]
    space = [0] * (len(unindexed) + len(bshape))
    for j, n in enumerate(bshape):
        space[first + j] = n
    for d, r in zip(unindexed, rest, strict=True):
        space[r] = x.shape[d]
    vin, value = _value_operand(ctx, node, a[2], out, where)

    def body(c: list[str], ity: str) -> str:
        bc = c[first:first + len(bshape)]
        at = ["0"] * len(x.shape)
        lines = []
        for j, (d, k) in enumerate(zip(pos, ks, strict=True)):
            lines.append(f"long long j{j} = static_cast<long long>(k{j}[{offset(k, broadcast_at(k, bc), ity)}]); "
                         f"j{j} = j{j} < 0 ? j{j} + {x.shape[d]}LL : j{j};\n  "
                         f"if (j{j} < 0 || j{j} >= {x.shape[d]}LL) return;")
            at[d] = f"j{j}"
        for d, r in zip(unindexed, rest, strict=True):
            at[d] = c[r]
        ptr = f"y + ({offset(out, at, 'long long')})"
        lines.append(atomic_add(out.ctype, ptr, value(c, ity), where) if accumulate else f"*({ptr}) = {value(c, ity)};")
        return "\n  ".join(lines)

    inputs = {**{f"k{j}": k for j, k in enumerate(ks)}, **vin}
    return merge(copy_into(ctx, node, x, out), update_kernel(ctx, node, "index_put", space, out, inputs, body),
                 describe=f"{node.name}: index_put{' (accumulate)' if accumulate else ''} of dims {pos}")


@lowering("aten.slice_scatter", "aten.select_scatter")
def slice_scatter(ctx: FamilyContext, node: Node) -> KernelCall:
    """``self`` with one slice (or one index) of a dim replaced by ``src``: each output element
    reads from exactly one of the two."""
    where = where_of(node)
    a = node.args
    x, src, out = ctx.read(a[0]), ctx.read(a[1]), single_output(ctx, node)
    rank = len(x.shape)
    dim = int(a[2] if len(a) > 2 else node.kwargs.get("dim", 0)) % max(rank, 1)
    n = x.shape[dim]
    if node.op == "aten.select_scatter":
        start, step = int_arg(a[3], where, "index") % n, 1
        count = 1
    else:
        start = a[3] if len(a) > 3 else node.kwargs.get("start")
        end = a[4] if len(a) > 4 else node.kwargs.get("end")
        step = int_arg(a[5] if len(a) > 5 else node.kwargs.get("step", 1), where, "step")
        start = 0 if start is None else (start + n if start < 0 else start)
        end = n if end is None else (end + n if end < 0 else end)
        start, end = max(0, min(start, n)), max(0, min(end, n))
        count = max(0, -(-(end - start) // step))
        if list(src.shape) != [count if d == dim else s for d, s in enumerate(x.shape)]:
            raise Unsupported(f"{where}: src {list(src.shape)} for slice {start}:{end}:{step} of {list(x.shape)}")

    def body(c: list[str], ity: str) -> str:
        j = f"({c[dim]} - {lit(start, ity)})"
        inside = [f"{c[dim]} >= {lit(start, ity)}", f"{c[dim]} < {lit(start + (count - 1) * step + 1, ity)}"]
        if step != 1:
            inside.append(f"{j} % {lit(step, ity)} == 0")
        if node.op == "aten.select_scatter":
            sat = c[:dim] + c[dim + 1:]
        else:
            sat = list(c)
            sat[dim] = j if step == 1 else f"{j} / {lit(step, ity)}"
        s_read = convert(f"s[{offset(src, sat, ity)}]", src.ctype, out.ctype)
        return f"y[i] = ({' && '.join(inside)}) ? {s_read} : {convert(f'x[{offset(x, c, ity)}]', x.ctype, out.ctype)};"

    return map_kernel(ctx, node, "slice_scatter", out, {"x": x, "s": src}, body,
                      f"{node.name}: {node.op[5:]} along dim {dim}")
