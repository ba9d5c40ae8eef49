"""Layout and indexing: copies that move elements (triangles, flips, rolls, pads, repeats, index
selects, gathers, advanced indexing), and the kernel helpers the other layout modules share
(``layout_scatter``: scatters; ``layout_typed``: typed elementwise work, casts, constants;
``layout_sort``: sort and topk).

Each copy is one thread per output element: the thread turns its flat index into output
coordinates, maps them to the coordinates of the one input element it takes (or decides it takes
a fill value), and reads that element through the input's strides, so views before the operator
cost nothing and the writes are coalesced.

Shapes are static, so every size and stride is a literal of the kernel (divisions by constants
compile to multiplications); index arithmetic is 32-bit unless a tensor spans 2^31 elements.
Indices are bounds-checked: an index torch would reject reads NaN (0 for integer tensors), never
a stray address.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported, broadcast, c_float
from stitchcuda.compiler.lowering.cuda_files import render_kernel
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided
from stitchcuda.compiler.lowering.registry import lowering

INT_CTYPES = ("int64_t", "int32_t")


# -- kernel helpers -----------------------------------------------------------------------------------

def where_of(node: Node) -> str:
    return f"{node.name} ({node.op}.{node.overload})"


def index_type(*tensors: Strided) -> str:
    """``int`` when every flat index and element offset fits 31 bits, else ``long long``."""
    span = 0
    for x in tensors:
        reach = x.offset + sum((n - 1) * abs(s) for n, s in zip(x.shape, x.strides, strict=True) if n > 1)
        span = max(span, x.numel, reach + 1)
    return "int" if span < 2**31 - 1 else "long long"


def lit(value: int, ity: str) -> str:
    return f"{value}LL" if ity == "long long" else str(value)


def coords(shape: Sequence[int], flat: str, ity: str, prefix: str = "c") -> tuple[list[str], str]:
    """C++ statements splitting ``flat`` into row-major coordinates of ``shape``; a size-1 dim's
    coordinate is the literal ``0``."""
    names = [f"{prefix}{d}" if n != 1 else "0" for d, n in enumerate(shape)]
    live = [d for d, n in enumerate(shape) if n != 1]
    if not live:
        return names, ""
    lines = [f"{ity} {prefix}_r = {flat};"]
    for d in reversed(live):  # a body need not use every coordinate: no warning for those it skips
        if d == live[0]:
            lines.append(f"[[maybe_unused]] const {ity} {names[d]} = {prefix}_r;")
        else:
            lines.append(f"[[maybe_unused]] const {ity} {names[d]} = {prefix}_r % {lit(shape[d], ity)}; "
                         f"{prefix}_r /= {lit(shape[d], ity)};")
    return names, "\n  ".join(lines)


def offset(x: Strided, at: Sequence[str], ity: str) -> str:
    """C++ element offset of ``x`` at coordinate expressions ``at`` (one per dim of ``x``)."""
    terms = [f"({c}) * {lit(s, ity)}" if s != 1 else f"({c})"
             for c, s, n in zip(at, x.strides, x.shape, strict=True) if n != 1 and s != 0 and c != "0"]
    if x.offset:
        terms.insert(0, lit(x.offset, ity))
    return " + ".join(terms) if terms else "0"


def broadcast_at(x: Strided, out_coords: Sequence[str]) -> list[str]:
    """Coordinates of ``x`` broadcast (right-aligned) against output coordinates."""
    lead = len(out_coords) - len(x.shape)
    if lead < 0:
        raise Unsupported(f"a {len(x.shape)}-d operand does not broadcast to {len(out_coords)} dims")
    return ["0" if n == 1 else out_coords[lead + d] for d, n in enumerate(x.shape)]


def zero_of(ctype: str) -> str:
    return {"float": "0.0f", "bool": "false"}.get(ctype, f"({ctype})0")


def bad_of(ctype: str) -> str:
    """What a read with an out-of-range index gives: NaN for floats, 0 otherwise."""
    return "NAN" if ctype == "float" else zero_of(ctype)


def scalar_text(value: Any, ctype: str, where: str) -> str:
    """A Python number as a C++ literal of ``ctype``."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise Unsupported(f"{where}: scalar {value!r}") from None
    if not isinstance(value, (int, float, bool)):
        raise Unsupported(f"{where}: scalar {value!r}")
    if ctype == "bool":
        return "true" if value else "false"
    if ctype == "float":
        return c_float(float(value))
    if isinstance(value, float) and not value.is_integer():
        raise Unsupported(f"{where}: fractional scalar {value} for an integer tensor")
    return f"(({ctype}){int(value)}LL)"


def convert(text: str, src: str, dst: str) -> str:
    """C++ of a value of C type ``src`` converted to ``dst`` the way torch casts."""
    if src == dst:
        return text
    if dst == "bool":
        return f"(({text}) != 0)"
    return f"static_cast<{dst}>({text})"


def launch_line(name: str, n: int, block: int, args: Sequence[str]) -> str:
    if n <= 0:
        return f"// {name}: nothing to compute (empty output)"
    grid = -(-n // block)
    return f"{name}<<<{grid}, {block}, 0, stream>>>({', '.join(args)});\nSC_CUDA_CHECK(cudaGetLastError());"


def map_kernel(ctx: FamilyContext, node: Node, what: str, out: Strided, inputs: dict[str, Strided],
               body: Callable[[list[str], str], str], describe: str = "", ity: str | None = None) -> KernelCall:
    """One thread per element of the contiguous ``out``: ``body(coords, ity)`` gives the C++ that
    assigns ``y[i]`` from the parameters named by ``inputs`` (read-only pointers)."""
    ity = ity or index_type(out, *inputs.values())
    name = ctx.kernel_name(node, what)
    block = ctx.block
    names, unravel = coords(out.shape, "i", ity)
    text = body(names, ity)
    if not any(re.search(rf"\b{c}\b", text) for c in names if c != "0"):
        unravel = ""  # a fill, a flat roll: the flat index is all it needs
    params = [f"const {x.ctype}* __restrict__ {p}" for p, x in inputs.items()] + [f"{out.ctype}* __restrict__ y"]
    source = render_kernel("map.cu.j2", block=block, name=name, params=params, ity=ity,
                           limit=lit(out.numel, ity), unravel=unravel, text=text)
    launch = launch_line(name, out.numel, block, [x.ptr for x in inputs.values()] + [out.ptr])
    return KernelCall({name: source}, launch, describe=describe or f"{node.name}: {node.op.split('.', 1)[-1]}")


def copy_into(ctx: FamilyContext, node: Node, src: Strided, out: Strided) -> KernelCall:
    """``out = src`` (broadcast to ``out``'s shape, cast to its type): the first pass of a scatter."""
    def body(c: list[str], ity: str) -> str:
        return f"y[i] = {convert(f'x[{offset(src, broadcast_at(src, c), ity)}]', src.ctype, out.ctype)};"

    return map_kernel(ctx, node, "copy", out, {"x": src}, body)


def merge(*calls: KernelCall, describe: str = "") -> KernelCall:
    kernels: dict[str, str] = {}
    for c in calls:
        kernels.update(c.kernels)
    return KernelCall(kernels, "\n".join(c.launch for c in calls), describe=describe or calls[-1].describe)


def dims_of(value: Any, rank: int, where: str) -> list[int]:
    items = value if isinstance(value, (list, tuple)) else [value]
    try:
        dims = [int(d) % rank if rank else 0 for d in items]
    except (TypeError, ValueError):
        raise Unsupported(f"{where}: dims {value!r}") from None
    return dims


def int_arg(value: Any, where: str, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unsupported(f"{where}: {what} {value!r} is not an integer")
    return value


def single_output(ctx: FamilyContext, node: Node) -> Strided:
    if len(node.out) != 1:
        raise Unsupported(f"{where_of(node)}: {len(node.out)} outputs")
    return ctx.write(node.name, node.out[0].dtype)


def index_read(k: Strided, at: list[str], ity: str) -> str:
    return f"static_cast<long long>(k[{offset(k, at, ity)}])"


# -- triangles, flips, rolls, repeats ------------------------------------------------------------------

@lowering("aten.tril", "aten.triu")
def triangle(ctx: FamilyContext, node: Node) -> KernelCall:
    """Keep the elements on one side of diagonal ``k`` of the last two dims (a batch of matrices);
    the others are 0 and are never read."""
    where = where_of(node)
    x, out = ctx.read(node.args[0]), single_output(ctx, node)
    if len(x.shape) < 2:
        raise Unsupported(f"{where}: a {len(x.shape)}-d input")
    k = int_arg(node.args[1] if len(node.args) > 1 else node.kwargs.get("diagonal", 0), where, "diagonal")
    keep = ">=" if node.op == "aten.triu" else "<="

    def body(c: list[str], ity: str) -> str:
        return (f"y[i] = ((long long)({c[-1]}) - (long long)({c[-2]}) {keep} {k}LL) ? "
                f"x[{offset(x, c, ity)}] : {zero_of(out.ctype)};")

    return map_kernel(ctx, node, "tri", out, {"x": x}, body, f"{node.name}: {node.op[5:]}(diagonal={k})")


@lowering("aten.flip")
def flip(ctx: FamilyContext, node: Node) -> KernelCall:
    where = where_of(node)
    x, out = ctx.read(node.args[0]), single_output(ctx, node)
    dims = set(dims_of(node.args[1], len(x.shape), where)) if x.shape else set()

    def body(c: list[str], ity: str) -> str:
        at = [f"{lit(n - 1, ity)} - {v}" if d in dims and n > 1 else v
              for d, (v, n) in enumerate(zip(c, x.shape, strict=True))]
        return f"y[i] = x[{offset(x, at, ity)}];"

    return map_kernel(ctx, node, "flip", out, {"x": x}, body, f"{node.name}: flip dims {sorted(dims)}")


@lowering("aten.roll")
def roll(ctx: FamilyContext, node: Node) -> KernelCall:
    """Roll along dims (each coordinate moves ``shift`` forward, wrapping), or over the flattened
    tensor when no dims are given."""
    where = where_of(node)
    x, out = ctx.read(node.args[0]), single_output(ctx, node)
    shifts = node.args[1] if len(node.args) > 1 else node.kwargs.get("shifts")
    dims = node.args[2] if len(node.args) > 2 else node.kwargs.get("dims", [])
    shifts = [int_arg(s, where, "shift") for s in (shifts if isinstance(shifts, list) else [shifts])]
    dims = dims if isinstance(dims, list) else [dims]
    if not dims:
        if len(shifts) != 1:
            raise Unsupported(f"{where}: {len(shifts)} shifts without dims")
        total = max(out.numel, 1)
        s = shifts[0] % total

        def flat_body(c: list[str], ity: str) -> str:
            names, unravel = coords(x.shape, f"(i >= {lit(s, ity)} ? i - {lit(s, ity)} : i + {lit(total - s, ity)})",
                                    ity, "s")
            return f"{unravel}\n  y[i] = x[{offset(x, names, ity)}];"

        return map_kernel(ctx, node, "roll", out, {"x": x}, flat_body, f"{node.name}: roll flattened by {s}")
    if len(dims) != len(shifts):
        raise Unsupported(f"{where}: {len(shifts)} shifts for {len(dims)} dims")
    by_dim: dict[int, int] = {}
    for d, s in zip(dims_of(dims, len(x.shape), where), shifts, strict=True):
        by_dim[d] = (by_dim.get(d, 0) + s) % max(x.shape[d], 1)

    def body(c: list[str], ity: str) -> str:
        at = list(c)
        for d, s in by_dim.items():
            if s:
                at[d] = f"({c[d]} >= {lit(s, ity)} ? {c[d]} - {lit(s, ity)} : {c[d]} + {lit(x.shape[d] - s, ity)})"
        return f"y[i] = x[{offset(x, at, ity)}];"

    return map_kernel(ctx, node, "roll", out, {"x": x}, body, f"{node.name}: roll {by_dim}")


@lowering("aten.repeat")
def repeat(ctx: FamilyContext, node: Node) -> KernelCall:
    where = where_of(node)
    x, out = ctx.read(node.args[0]), single_output(ctx, node)
    reps = [int_arg(r, where, "repeat") for r in node.args[1]]
    lead = len(reps) - len(x.shape)
    if lead < 0 or list(out.shape) != [r * (x.shape[d - lead] if d >= lead else 1) for d, r in enumerate(reps)]:
        raise Unsupported(f"{where}: repeats {reps} of {list(x.shape)}")

    def body(c: list[str], ity: str) -> str:
        at = [c[lead + d] if r == 1 else f"{c[lead + d]} % {lit(n, ity)}"
              for d, (n, r) in enumerate(zip(x.shape, reps[lead:], strict=True))]
        return f"y[i] = x[{offset(x, at, ity)}];"

    return map_kernel(ctx, node, "repeat", out, {"x": x}, body, f"{node.name}: repeat {reps}")


# -- padding ----------------------------------------------------------------------------------------

PAD_MODES = {"aten.constant_pad_nd": "constant", "aten.reflection_pad1d": "reflect",
             "aten.reflection_pad2d": "reflect", "aten.reflection_pad3d": "reflect",
             "aten.replication_pad1d": "replicate", "aten.replication_pad2d": "replicate",
             "aten.replication_pad3d": "replicate", "aten._pad_circular": "circular"}


@lowering("aten.pad", *PAD_MODES)
def pad(ctx: FamilyContext, node: Node) -> KernelCall:
    """Pads (pairs from the last dim backwards): constant (negative pads crop), reflect (the edge
    element not repeated), replicate (the edge repeated), circular (wrapping)."""
    where = where_of(node)
    a = node.args
    x, out = ctx.read(a[0]), single_output(ctx, node)
    pads = [int_arg(p, where, "pad") for p in a[1]]
    if node.op == "aten.pad":
        mode = a[2] if len(a) > 2 else node.kwargs.get("mode", "constant")
        value = a[3] if len(a) > 3 else node.kwargs.get("value")
    else:
        mode = PAD_MODES[node.op]
        value = a[2] if len(a) > 2 else node.kwargs.get("value")
    value = 0 if value is None else value
    rank = len(x.shape)
    if len(pads) % 2 or len(pads) // 2 > rank or mode not in ("constant", "reflect", "replicate", "circular"):
        raise Unsupported(f"{where}: pad {pads} in mode {mode!r} of a {rank}-d input")
    lo = [0] * rank
    for j in range(len(pads) // 2):
        d = rank - 1 - j
        lo[d] = pads[2 * j]
        if x.shape[d] + pads[2 * j] + pads[2 * j + 1] != out.shape[d]:
            raise Unsupported(f"{where}: output {list(out.shape)} of pad {pads}")
        if mode == "reflect" and (max(pads[2 * j], pads[2 * j + 1]) >= x.shape[d]):
            raise Unsupported(f"{where}: reflect pad {pads[2 * j:2 * j + 2]} of a dim of {x.shape[d]}")
        if mode != "constant" and (min(pads[2 * j], pads[2 * j + 1]) < 0 or x.shape[d] == 0):
            raise Unsupported(f"{where}: {mode} pad {pads}")
    fill = scalar_text(value, out.ctype, where)

    def body(c: list[str], ity: str) -> str:
        lines, at, checks = [], [], []
        for d, n in enumerate(x.shape):
            if lo[d] == 0 and out.shape[d] == n:
                at.append(c[d])
                continue
            s = f"s{d}"
            lines.append(f"{ity} {s} = {c[d]} - ({lit(lo[d], ity)});")
            if mode == "constant":
                checks.append(f"{s} >= 0 && {s} < {lit(n, ity)}")
            elif mode == "reflect":
                lines.append(f"{s} = {s} < 0 ? -{s} : {s}; {s} = {s} >= {lit(n, ity)} ? {lit(2 * n - 2, ity)} - {s} : {s};")
            elif mode == "replicate":
                lines.append(f"{s} = {s} < 0 ? 0 : ({s} >= {lit(n, ity)} ? {lit(n - 1, ity)} : {s});")
            else:
                lines.append(f"{s} %= {lit(n, ity)}; {s} = {s} < 0 ? {s} + {lit(n, ity)} : {s};")
            at.append(s)
        read = f"x[{offset(x, at, ity)}]"
        value_text = f"({' && '.join(checks)}) ? {read} : {fill}" if checks else read
        return "\n  ".join([*lines, f"y[i] = {value_text};"])

    return map_kernel(ctx, node, "pad", out, {"x": x}, body, f"{node.name}: {mode} pad {pads}")


# -- selection by index -------------------------------------------------------------------------------

def check_index(k: Strided, where: str) -> None:
    if k.ctype not in INT_CTYPES:
        raise Unsupported(f"{where}: index of C type {k.ctype} (only int64/int32 index tensors)")


@lowering("aten.index_select")
def index_select(ctx: FamilyContext, node: Node) -> KernelCall:
    where = where_of(node)
    x, out = ctx.read(node.args[0]), single_output(ctx, node)
    k = ctx.read(node.args[2])
    check_index(k, where)
    rank = len(x.shape)
    dim = int(node.args[1]) % max(rank, 1)
    if rank == 0:  # a 0-d input and a one-element index: the element itself
        return map_kernel(ctx, node, "index_select", out, {"x": x}, lambda c, ity: "y[i] = x[0];")
    n = x.shape[dim]

    def body(c: list[str], ity: str) -> str:
        at = list(c)
        at[dim] = "j"
        kc = [c[dim]] if k.shape else []
        return (f"const long long j = {index_read(k, kc, ity) if kc else 'static_cast<long long>(k[0])'};\n"
                f"  y[i] = (j >= 0 && j < {n}LL) ? x[{offset(x, at, 'long long')}] : {bad_of(out.ctype)};")

    return map_kernel(ctx, node, "index_select", out, {"x": x, "k": k}, body, f"{node.name}: index_select dim {dim}")


@lowering("aten.gather")
def gather(ctx: FamilyContext, node: Node) -> KernelCall:
    """``out[c] = x[c with c[dim] = index[c]]``; the index may be smaller than the input in
    every dim (the fused path takes float tables read from buffers; this, any dtype)."""
    where = where_of(node)
    x, out = ctx.read(node.args[0]), single_output(ctx, node)
    k = ctx.read(node.args[2])
    check_index(k, where)
    rank = len(x.shape)
    if len(k.shape) != rank or tuple(out.shape) != k.shape:
        raise Unsupported(f"{where}: input {list(x.shape)} gathered by {list(k.shape)}")
    if rank == 0:
        return map_kernel(ctx, node, "gather", out, {"x": x}, lambda c, ity: "y[i] = x[0];")
    dim = int(node.args[1]) % rank
    n = x.shape[dim]

    def body(c: list[str], ity: str) -> str:
        at = list(c)
        at[dim] = "j"
        return (f"const long long j = {index_read(k, c, ity)};\n"
                f"  y[i] = (j >= 0 && j < {n}LL) ? x[{offset(x, at, 'long long')}] : {bad_of(out.ctype)};")

    return map_kernel(ctx, node, "gather", out, {"x": x, "k": k}, body, f"{node.name}: gather dim {dim}")


def advanced(x_shape: Sequence[int], spec: list[Any], index_shapes: list[tuple[int, ...]],
             where: str) -> tuple[list[int], list[int], int, list[int]]:
    """Advanced indexing geometry: (indexed dims, the broadcast index shape, where its dims sit in
    the result, the result dim of each unindexed input dim)."""
    rank = len(x_shape)
    spec = list(spec) + [None] * (rank - len(spec))
    if len(spec) > rank:
        raise Unsupported(f"{where}: {len(spec)} indices for a {rank}-d tensor")
    pos = [d for d, v in enumerate(spec) if v is not None]
    if not pos:
        raise Unsupported(f"{where}: no index tensor")
    try:
        bshape = list(broadcast(*index_shapes))
    except Unsupported:
        raise Unsupported(f"{where}: index shapes {index_shapes} do not broadcast") from None
    b_rank = len(bshape)
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    first = pos[0] if adjacent else 0
    rest, r = [], 0
    for d in range(rank):
        if d in pos:
            continue
        if r == first:
            r += b_rank
        rest.append(r)
        r += 1
    return pos, bshape, first, rest


def index_reads(ctx: FamilyContext, node: Node, spec: list[Any], where: str) -> list[Strided]:
    ks = []
    for v in spec:
        if v is None:
            continue
        k = ctx.read(v)
        if k.ctype == "bool":
            raise Unsupported(f"{where}: a boolean mask index (its result's size depends on the data)")
        check_index(k, where)
        ks.append(k)
    return ks


@lowering("aten.index", "aten._unsafe_index")
def index(ctx: FamilyContext, node: Node) -> KernelCall:
    """``x[..., i0, ..., i1, ...]`` with int index tensors (broadcast together) and ``None`` for full
    slices; negative indices wrap; indexed dims that are not adjacent put the index dims first."""
    where = where_of(node)
    x, out = ctx.read(node.args[0]), single_output(ctx, node)
    spec = list(node.args[1])
    ks = index_reads(ctx, node, spec, where)
    pos, bshape, first, rest = advanced(x.shape, spec, [k.shape for k in ks], where)
    expect = [0] * (len(x.shape) - len(pos) + len(bshape))
    for j, n in enumerate(bshape):
        expect[first + j] = n
    unindexed = [d for d in range(len(x.shape)) if d not in pos]
    for d, r in zip(unindexed, rest, strict=True):
        expect[r] = x.shape[d]
    if expect != list(out.shape):
        raise Unsupported(f"{where}: result {list(out.shape)}, expected {expect}")
    inputs = {"x": x, **{f"k{j}": k for j, k in enumerate(ks)}}

    def body(c: list[str], ity: str) -> str:
        bc = c[first:first + len(bshape)]
        at = ["0"] * len(x.shape)
        lines, ok = [], []
        for j, (d, k) in enumerate(zip(pos, ks, strict=True)):
            kc = broadcast_at(k, bc)
            lines.append(f"long long j{j} = static_cast<long long>(k{j}[{offset(k, kc, ity)}]); "
                         f"j{j} = j{j} < 0 ? j{j} + {x.shape[d]}LL : j{j};")
            ok.append(f"j{j} >= 0 && j{j} < {x.shape[d]}LL")
            at[d] = f"j{j}"
        for d, r in zip(unindexed, rest, strict=True):
            at[d] = c[r]
        lines.append(f"y[i] = ({' && '.join(ok)}) ? x[{offset(x, at, 'long long')}] : {bad_of(out.ctype)};")
        return "\n  ".join(lines)

    return map_kernel(ctx, node, "index", out, inputs, body, f"{node.name}: advanced indexing of dims {pos}")
