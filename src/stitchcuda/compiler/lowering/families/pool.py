"""Pooling over 1, 2 or 3 trailing dims: max (with or without indices), average, adaptive.

Every operator here follows PyTorch's CUDA kernels exactly, since the programs are compared
against them: a max pool's window skips the padding (it counts as -inf), takes a NaN over any
number (the last NaN's index when several) and the first maximum's index on ties, indices being
flat within each input plane (``(d * H + h) * W + w``); an average pool sums what lies inside the
input and divides by ``divisor_override``, else by the window clipped to the padded input
(``count_include_pad``), else by the elements it summed; ceil mode keeps a last window only when it
starts inside the input or its left padding; adaptive windows are ``[floor(o * L / O),
ceil((o + 1) * L / O))``.

One thread computes one output when the window is small, or the outputs enough to fill the GPU
(a regular pool's window is then an unrolled loop over the kernel with bounds checks: independent
loads); a warp, or a whole block when there are few outputs, shares a large window (global average
pooling, say): lanes stride over it, so neighbouring lanes read neighbouring elements, and combine
through shuffles (sums, or (value, index) pairs under the order above).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.cuda_files import render_kernel
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided, unravel
from stitchcuda.compiler.lowering.registry import lowering

# op -> (kind, spatial rank, argument names after ``self`` as in the schema)
_MAX = ["kernel_size", "stride", "padding", "dilation", "ceil_mode"]
_AVG = ["kernel_size", "stride", "padding", "ceil_mode", "count_include_pad", "divisor_override"]
POOLS: dict[str, tuple[str, int, list[str]]] = {
    "aten.max_pool1d": ("max", 1, _MAX), "aten.max_pool2d": ("max", 2, _MAX), "aten.max_pool3d": ("max", 3, _MAX),
    "aten.max_pool1d_with_indices": ("max", 1, _MAX), "aten.max_pool2d_with_indices": ("max", 2, _MAX),
    "aten.max_pool3d_with_indices": ("max", 3, _MAX),
    "aten.avg_pool1d": ("avg", 1, _AVG[:5]), "aten.avg_pool2d": ("avg", 2, _AVG), "aten.avg_pool3d": ("avg", 3, _AVG),
    "aten.adaptive_avg_pool1d": ("adaptive_avg", 1, ["output_size"]),
    "aten.adaptive_avg_pool2d": ("adaptive_avg", 2, ["output_size"]),
    "aten.adaptive_avg_pool3d": ("adaptive_avg", 3, ["output_size"]),
    "aten._adaptive_avg_pool2d": ("adaptive_avg", 2, ["output_size"]),
    "aten._adaptive_avg_pool3d": ("adaptive_avg", 3, ["output_size"]),
    "aten.adaptive_max_pool1d": ("adaptive_max", 1, ["output_size"]),
    "aten.adaptive_max_pool2d": ("adaptive_max", 2, ["output_size"]),
    "aten.adaptive_max_pool3d": ("adaptive_max", 3, ["output_size"]),
}
SERIAL_MAX_WINDOW = 64  # windows below this many elements: one thread per output
UNROLLED_MAX_WINDOW = 256  # a regular pool's window up to this: one thread, its loads unrolled (independent)
MANY_OUTPUTS = 132 * 2048  # this many threads fill an H100: one per output however large its window
BLOCK_MIN_WINDOW = 4096  # a block per output for windows this large when a warp each leaves SMs idle
FEW_WARPS = 132 * 32  # outputs below this (an H100's SMs x 32 warps): too few warps to fill the GPU


@dataclass(frozen=True)
class Window:
    """One spatial dim: input size, output size; kernel, stride, padding, dilation for regular pools."""

    size: int
    out: int
    kernel: int = 0
    stride: int = 1
    pad: int = 0
    dilation: int = 1

    @property
    def longest(self) -> int:
        """The most input elements a window spans along this dim."""
        if self.kernel:
            return min(self.kernel, self.size)
        return -(-self.size // self.out) + 1 if self.out else 0


def out_size(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil: bool) -> int:
    """PyTorch's ``pooling_output_shape``: in ceil mode the last window must start inside the
    input or its left padding."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1 + (stride - 1 if ceil else 0)
    n = span // stride + 1
    if ceil and (n - 1) * stride >= size + pad:
        n -= 1
    return n


def _args(node: Node, names: list[str]) -> dict[str, Any]:
    found = dict(zip(names, node.args[1:], strict=False))
    found.update({k: v for k, v in node.kwargs.items() if k in names})
    return found


def _ints(value: Any, rank: int, default: Any, where: str, what: str) -> tuple[int, ...]:
    value = default if value is None or value == [] else value
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(items) == 1:
        items = items * rank
    if len(items) != rank or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise Unsupported(f"{where}: {what} {value!r} is not {rank} integers")
    return tuple(items)


def windows(node: Node, in_shape: tuple[int, ...]) -> tuple[str, list[Window], bool, bool, int | None]:
    """(kind, one :class:`Window` per spatial dim, ceil mode, count_include_pad, divisor override)
    of a pooling node whose input has shape ``in_shape``; raises Unsupported where PyTorch's
    output shape is not what these windows give."""
    kind, rank, names = POOLS[node.op]
    where = f"{node.name} ({node.op})"
    if len(in_shape) < rank + 1:
        raise Unsupported(f"{where}: input of shape {list(in_shape)}")
    a = _args(node, names)
    sizes = in_shape[-rank:]
    out = tuple(node.out[0].shape)
    ceil, include_pad, divisor = False, True, None
    if kind.startswith("adaptive"):
        target = _ints(a.get("output_size"), rank, None, where, "output size")
        wins = [Window(size=s, out=o) for s, o in zip(sizes, target, strict=True)]
    else:
        kernel = _ints(a.get("kernel_size"), rank, None, where, "kernel size")
        stride = _ints(a.get("stride"), rank, kernel, where, "stride")
        pad = _ints(a.get("padding"), rank, 0, where, "padding")
        dilation = _ints(a.get("dilation"), rank, 1, where, "dilation")
        ceil = bool(a.get("ceil_mode", False))
        include_pad = bool(a.get("count_include_pad", True))
        divisor = a.get("divisor_override")
        if divisor is not None and (not isinstance(divisor, int) or divisor == 0):
            raise Unsupported(f"{where}: divisor override {divisor!r}")
        if min(kernel) < 1 or min(stride) < 1 or min(pad) < 0 or min(dilation) < 1:
            raise Unsupported(f"{where}: kernel {kernel}, stride {stride}, padding {pad}, dilation {dilation}")
        wins = [Window(size=s, out=out_size(s, k, st, p, d, ceil), kernel=k, stride=st, pad=p, dilation=d)
                for s, k, st, p, d in zip(sizes, kernel, stride, pad, dilation, strict=True)]
    expect = (*in_shape[:-rank], *(w.out for w in wins))
    if out != expect:
        raise Unsupported(f"{where}: output {list(out)} is not the expected {list(expect)}")
    return kind, wins, ceil, include_pad, divisor


def _bounds(kind: str, w: Window, c: str, d: int, unrolled: bool, span: bool) -> list[str]:
    """C++ declarations of ``b{d}`` (where a regular window starts, in the padding maybe),
    ``f{d}`` (first input position), ``n{d}`` (how many) and, for regular average pools,
    ``span{d}`` (the window clipped to the padded input) along dim ``d``; ``unrolled``: the loops
    run over the kernel from ``b{d}`` and need no ``f{d}``; ``span``: the divisor counts the padding."""
    if kind.startswith("adaptive"):
        return [f"const long long f{d} = ({c} * {w.size}LL) / {w.out}LL;",
                f"const long long n{d} = (({c} + 1) * {w.size}LL + {w.out - 1}LL) / {w.out}LL - f{d};"]
    b = f"b{d}"
    lines = [f"const long long {b} = {c} * {w.stride}LL - {w.pad}LL;"]
    if kind == "max" and unrolled:
        return lines
    if kind == "max":  # positions b + j * dilation inside [0, size)
        lines += [f"const long long f{d} = {b} < 0 ? {b} + ((-{b} + {w.dilation - 1}LL) / {w.dilation}LL) * "
                  f"{w.dilation}LL : {b};",
                  f"const long long last{d} = {b} + {(w.kernel - 1) * w.dilation}LL < {w.size - 1}LL ? "
                  f"{b} + {(w.kernel - 1) * w.dilation}LL : {w.size - 1}LL;",
                  f"const long long n{d} = last{d} >= f{d} ? (last{d} - f{d}) / {w.dilation}LL + 1 : 0;"]
    else:
        lines += [f"const long long f{d} = {b} > 0 ? {b} : 0;",
                  f"const long long e{d} = {b} + {w.kernel}LL < {w.size}LL ? {b} + {w.kernel}LL : {w.size}LL;",
                  f"const long long n{d} = e{d} > f{d} ? e{d} - f{d} : 0;"]
        lines += [f"const long long span{d} = ({b} + {w.kernel}LL < {w.size + w.pad}LL ? {b} + {w.kernel}LL : "
                  f"{w.size + w.pad}LL) - {b};"] if span else []
    return lines


def _step(w: Window, kind: str) -> int:
    return w.dilation if kind == "max" else 1


@lowering(*POOLS)
def lower_pool(ctx: FamilyContext, node: Node) -> KernelCall:
    where = f"{node.name} ({node.op})"
    x = ctx.read(node.args[0])
    if x.ctype != "float":
        raise Unsupported(f"{where}: input of C type {x.ctype} (float32 only)")
    kind, wins, ceil, include_pad, divisor = windows(node, x.shape)
    names = ctx.outputs(node)
    y = ctx.write(names[0]) if names[0] is not None else None
    ind = ctx.write(names[1], "int64") if len(names) > 1 and names[1] is not None else None
    if y is None and ind is None:
        return KernelCall(describe=f"{node.op}: nothing read")
    out_shape = tuple(node.out[0].shape)
    total = 1
    for s in out_shape:
        total *= s
    volume = 1
    for w in wins:
        volume *= w.longest
    adaptive = kind.startswith("adaptive")
    if volume < SERIAL_MAX_WINDOW or (not adaptive and (volume <= UNROLLED_MAX_WINDOW or total >= MANY_OUTPUTS)):
        group = 1
    elif total >= FEW_WARPS or volume < BLOCK_MIN_WINDOW:
        group = 32
    else:
        group = 256
    block = 256 if group == 256 else max(32, min(1024, ctx.block))
    name = ctx.kernel_name(node, kind + "pool")
    source = _kernel(name, x, out_shape, kind, wins, include_pad, divisor, ind is not None, y is not None,
                     group, block)
    blocks = -(-total * group // block)
    launch = "" if total == 0 else (
        f"{name}<<<{blocks}, {block}, 0, stream>>>({x.ptr}, {y.ptr if y else 'nullptr'}, "
        f"{ind.ptr if ind else 'nullptr'});\nSC_CUDA_CHECK(cudaGetLastError());")
    if kind.startswith("adaptive"):
        text = f"output {[w.out for w in wins]}"
    else:
        text = (f"kernel {[w.kernel for w in wins]}, stride {[w.stride for w in wins]}, "
                f"padding {[w.pad for w in wins]}" + (f", dilation {[w.dilation for w in wins]}" if kind == "max" else "")
                + (", ceil mode" if ceil else "") + ("" if include_pad or kind == "max" else ", count_include_pad=False")
                + (f", divisor {divisor}" if divisor is not None else ""))
    per = {1: "one thread", 32: "one warp", 256: "one block"}[group]
    return KernelCall(kernels={name: source}, launch=launch,
                      describe=f"{node.op.removeprefix('aten.')} {list(x.shape)} -> {list(out_shape)} ({text}), "
                               f"{per} per output" + (" with indices" if ind is not None else ""))


def _kernel(name: str, x: Strided, out_shape: tuple[int, ...], kind: str, wins: list[Window], include_pad: bool,
            divisor: int | None, with_index: bool, with_value: bool, group: int, block: int) -> str:
    rank = len(wins)
    lead = len(out_shape) - rank
    total = 1
    for s in out_shape:
        total *= s
    coords, split = unravel(out_shape, "o", "c")
    base = " + ".join([f"{x.offset}LL", *(f"{coords[i]} * {x.strides[i]}LL" for i in range(lead)
                                          if x.shape[i] != 1 and x.strides[i] != 0)])
    sp_strides = x.strides[lead:]
    plane = [1] * rank
    for d in range(rank - 2, -1, -1):
        plane[d] = plane[d + 1] * wins[d + 1].size
    is_max = kind.endswith("max")
    body = [split, f"const float* __restrict__ xp = x + ({base});"]
    unrolled = group == 1 and not kind.startswith("adaptive")
    for d, w in enumerate(wins):
        body += _bounds(kind, w, coords[lead + d], d, unrolled, kind == "avg" and include_pad and divisor is None)
    if is_max:
        body += ["float m = -INFINITY;"] + (["long long mi = -1;"] if with_index else [])
    else:
        body += ["float acc = 0.0f;"]

    def update(pos: list[str]) -> list[str]:
        addr = " + ".join(f"{p} * {s}LL" for p, s in zip(pos, sp_strides, strict=True))
        flat = " + ".join(f"{p} * {s}LL" for p, s in zip(pos, plane, strict=True))
        lines = [f"const float v = xp[{addr}];"]
        if not is_max:
            return lines + ["acc += v;"]
        if with_index:  # the first element a thread sees seeds it (PyTorch seeds with the first position)
            return lines + [f"if (mi < 0 || v > m || isnan(v)) {{ m = v; mi = {flat}; }}"]
        return lines + ["if (v > m || isnan(v)) m = v;"]

    pos = [f"i{d}" for d in range(rank)]
    if unrolled:  # over the kernel: the window's bounds are checked per position
        loops, close = [], []
        for d, w in enumerate(wins):
            step = _step(w, kind)
            loops += [f"#pragma unroll\nfor (int j{d} = 0; j{d} < {w.kernel}; ++j{d}) {{",
                      f"const long long i{d} = b{d} + j{d} * {step}LL;",
                      f"if (i{d} < 0 || i{d} >= {w.size}LL) continue;"]
            close.append("}")
        body += loops + update(pos) + close
    elif group == 1:
        loops, close = [], []
        for d in range(rank):
            loops.append(f"for (long long i{d} = f{d}; i{d} < f{d} + n{d}; ++i{d}) {{")
            close.append("}")
        body += loops + update(pos) + close
    else:
        vol = " * ".join(f"n{d}" for d in range(rank))
        body += [f"const long long vol = {vol};",
                 f"for (long long t = lane; t < vol; t += {group}) {{", "long long rest = t;"]
        for d in range(rank - 1, -1, -1):
            step = _step(wins[d], kind)
            body.append(f"const long long i{d} = f{d} + (rest % n{d}) * {step}LL; rest /= n{d};")
        body += [*update(pos), "}"]
        body += _combine(kind, with_index, group)
        body.append("if (lane != 0) return;")
    # the write
    if is_max:
        if with_value:
            body.append("y[o] = m;")
        if with_index:
            body.append("ind[o] = mi;")
    else:
        count = " * ".join(f"n{d}" for d in range(rank))
        if divisor is not None:
            div = f"{divisor}LL"
        elif kind == "avg" and include_pad:
            div = " * ".join(f"span{d}" for d in range(rank))
        else:
            div = count
        body.append(f"y[o] = ({count}) > 0 ? acc / (float)({div}) : 0.0f;")
    if group == 1:
        head = [f"const long long o = (long long)blockIdx.x * {block} + threadIdx.x;",
                f"if (o >= {total}LL) return;"]
    else:
        head = [f"const long long o = (long long)blockIdx.x * {block // group} + threadIdx.x / {group};",
                f"const int lane = threadIdx.x % {group};"]
        if group < block:  # a warp per output: the whole warp leaves together
            head.append(f"if (o >= {total}LL) return;")
    text = "\n    ".join(head + body)
    return render_kernel("pool_window.cu.j2", block=block, name=name, text=text)


def _combine(kind: str, with_index: bool, group: int) -> list[str]:
    """Lanes' partial results combined: shuffles within each warp, then (a block per output)
    through shared memory to the first warp. Lane 0 ends with the window's result."""
    is_max = kind.endswith("max")
    if not is_max:
        step = ["acc += __shfl_down_sync(0xffffffffu, acc, off);"]
        save, load = ["sh_acc[w] = acc;"], ["acc = lane < {n} ? sh_acc[lane] : 0.0f;"]
        shared = ["__shared__ float sh_acc[{n}];"]
    elif with_index:
        # (value, index) pairs: a NaN beats numbers (the later NaN wins), a larger number wins, and
        # equal ones keep the smaller index: the order of PyTorch's serial scan
        step = ["const float om = __shfl_down_sync(0xffffffffu, m, off);",
                "const long long oi = __shfl_down_sync(0xffffffffu, mi, off);",
                "if (oi >= 0 && (mi < 0 || (isnan(om) ? (!isnan(m) || oi > mi) : "
                "(!isnan(m) && (om > m || (om == m && oi < mi)))))) { m = om; mi = oi; }"]
        save = ["sh_m[w] = m;", "sh_i[w] = mi;"]
        load = ["m = lane < {n} ? sh_m[lane] : -INFINITY;", "mi = lane < {n} ? sh_i[lane] : -1;"]
        shared = ["__shared__ float sh_m[{n}];", "__shared__ long long sh_i[{n}];"]
    else:
        step = ["const float om = __shfl_down_sync(0xffffffffu, m, off);",
                "if (isnan(om) || om > m) m = om;"]
        save, load = ["sh_m[w] = m;"], ["m = lane < {n} ? sh_m[lane] : -INFINITY;"]
        shared = ["__shared__ float sh_m[{n}];"]
    warp = ["for (int off = 16; off > 0; off >>= 1) {", *step, "}"]
    if group == 32:
        return warp
    n = group // 32
    fmt = [s.format(n=n) for s in shared]
    return [*fmt, *warp, "const int w = lane / 32;", "if (lane % 32 == 0) {", *save, "}", "__syncthreads();",
            "if (lane >= 32) return;", *(s.format(n=n) for s in load), *warp]
