"""``aten.sort`` and ``aten.topk``: values and int64 indices along one dim.

A line (the elements along the dim, the other coordinates fixed) is sorted by a bitonic network in
shared memory, padded to a power of two; short lines share a block. The order is total: NaN
counts as larger than every number (last ascending, first descending, as torch), equal values
keep their original order (ties broken by index, what a stable sort gives), padding goes last.
``topk`` of a line longer than one block can hold keeps, per thread, its best ``k`` of a strided
share of the line, then sorts the threads' candidates together.
"""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.cuda_files import render_kernel
from stitchcuda.compiler.lowering.families.layout import coords, launch_line, offset, where_of
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided
from stitchcuda.compiler.lowering.registry import lowering

MAX_LINE = 4096  # elements of one bitonic sort in shared memory (32 KiB of float keys + int indices)
MAX_K = 64  # the most a thread keeps of a long line for topk


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _before(name: str, ctype: str, n: int, descending: bool) -> str:
    """The total order as a device function: does (av, ai) come before (bv, bi)?"""
    nan = ("  const bool an = isnan(av), bn = isnan(bv);\n"
           f"  if (an || bn) return (an && bn) ? ai < bi : {'an' if descending else 'bn'};\n") if ctype == "float" else ""
    return (f"__device__ __forceinline__ bool {name}({ctype} av, int ai, {ctype} bv, int bi) {{\n"
            f"  if ((ai >= {n}) != (bi >= {n})) return bi >= {n};\n{nan}"
            f"  if (av != bv) return av {'>' if descending else '<'} bv;\n  return ai < bi;\n}}\n")


def _network(before: str, size: int, lines: int, threads: int) -> str:
    """The bitonic network over ``lines`` runs of ``size`` slots in sv/si (threads loop over pairs)."""
    half = size // 2
    return (f"  for (int k = 2; k <= {size}; k <<= 1) {{\n"
            f"    for (int j = k >> 1; j > 0; j >>= 1) {{\n"
            f"      for (int p = threadIdx.x; p < {lines * half}; p += {threads}) {{\n"
            f"        const int l = p / {half}, q = p % {half};\n"
            f"        const int i = 2 * j * (q / j) + (q % j);\n"
            f"        const int a = l * {size} + i, b = a + j;\n"
            f"        const bool up = (i & k) == 0;\n"
            f"        if (up ? {before}(sv[b], si[b], sv[a], si[a]) : {before}(sv[a], si[a], sv[b], si[b])) {{\n"
            f"          const auto tv = sv[a]; sv[a] = sv[b]; sv[b] = tv;\n"
            f"          const int ti = si[a]; si[a] = si[b]; si[b] = ti;\n"
            f"        }}\n      }}\n      __syncthreads();\n    }}\n  }}\n")


def _line_base(shape: tuple[int, ...], dim: int, x: Strided, line: str, prefix: str) -> tuple[str, str]:
    """Statements computing the element offset of a line's first element, and its name."""
    rest = tuple(n for d, n in enumerate(shape) if d != dim)
    names, unravel = coords(rest, line, "long long", prefix)
    at = names[:dim] + ["0"] + names[dim:]
    return f"{unravel}\n  const long long {prefix}_base = {offset(x, at, 'long long')};", f"{prefix}_base"


@lowering("aten.sort", "aten.topk")
def sort(ctx: FamilyContext, node: Node) -> KernelCall:
    where = where_of(node)
    a = node.args
    x = ctx.read(a[0])
    rank = len(x.shape)
    if node.op == "aten.sort":
        dim = a[1] if len(a) > 1 else node.kwargs.get("dim", -1)
        descending = bool(a[2] if len(a) > 2 else node.kwargs.get("descending", False))
        if node.overload == "stable":
            dim, descending = node.kwargs.get("dim", -1), bool(node.kwargs.get("descending", False))
    else:
        dim = a[2] if len(a) > 2 else node.kwargs.get("dim", -1)
        descending = bool(a[3] if len(a) > 3 else node.kwargs.get("largest", True))
    if x.ctype not in ("float", "int64_t", "int32_t"):
        raise Unsupported(f"{where}: sorting {x.ctype} values")
    dim = int(dim) % max(rank, 1)
    shape = x.shape if rank else (1,)
    xs = x if rank else Strided(x.ptr, x.ctype, (1,), (1,), x.offset)
    n = shape[dim]
    k = int(a[1]) if node.op == "aten.topk" else n
    if not 0 <= k <= n:
        raise Unsupported(f"{where}: k={k} of a line of {n}")
    names = ctx.outputs(node)
    values = ctx.write(names[0], node.out[0].dtype) if names[0] else None
    indices = ctx.write(names[1], "int64") if len(names) > 1 and names[1] else None
    out_shape = tuple(k if d == dim else s for d, s in enumerate(shape))
    lines = 1
    for d, s in enumerate(shape):
        if d != dim:
            lines *= s
    if lines == 0 or k == 0:
        return KernelCall({}, f"// {node.name}: empty result", describe=f"{node.name}: empty")
    kname = ctx.kernel_name(node, "sort")
    before = f"{kname}_before"
    ct = x.ctype
    out_stride = 1
    for s in out_shape[dim + 1:]:
        out_stride *= s
    long_line = n > MAX_LINE
    if long_line and (node.op != "aten.topk" or k > MAX_K):
        raise Unsupported(f"{where}: a {node.op[5:]} of lines of {n} elements (at most {MAX_LINE}"
                          f"{f', or topk with k <= {MAX_K}' if node.op == 'aten.topk' else ''})")
    if not long_line:
        size = _pow2(max(n, 2))
        per_block = max(1, min(MAX_LINE // size, 1024 // size, lines))
        threads = max(32, min(512, per_block * size // 2))
        load = (f"  for (int e = threadIdx.x; e < {per_block * size}; e += {threads}) {{\n"
                f"    const int l = e / {size}, j = e % {size};\n"
                f"    const long long line = (long long)blockIdx.x * {per_block} + l;\n"
                f"    if (line < {lines}LL && j < {n}) {{\n"
                f"      {_line_base(shape, dim, xs, 'line', 'b')[0]}\n"
                f"      sv[e] = x[b_base + (long long)j * {xs.strides[dim]}LL]; si[e] = j;\n"
                f"    }} else {{ sv[e] = ({ct})0; si[e] = {n} + j; }}\n  }}\n  __syncthreads();\n")
        slots, blocks = per_block * size, -(-lines // per_block)
    else:
        size = _pow2(k)
        threads = max(32, min(256, MAX_LINE // size))
        size = _pow2(threads * k)
        per_block = 1
        load = (f"  {ct} lv[{k}]; int li[{k}]; int cnt = 0;\n"
                f"  const long long line = blockIdx.x;\n"
                f"  {_line_base(shape, dim, xs, 'line', 'b')[0]}\n"
                f"  for (int j = threadIdx.x; j < {n}; j += {threads}) {{\n"
                f"    const {ct} v = x[b_base + (long long)j * {xs.strides[dim]}LL];\n"
                f"    if (cnt < {k} || {before}(v, j, lv[{k - 1}], li[{k - 1}])) {{\n"
                f"      int p = cnt < {k} ? cnt++ : {k - 1};\n"
                f"      while (p > 0 && {before}(v, j, lv[p - 1], li[p - 1])) {{ lv[p] = lv[p - 1]; li[p] = li[p - 1]; --p; }}\n"
                f"      lv[p] = v; li[p] = j;\n    }}\n  }}\n"
                f"  for (int q = 0; q < {k}; ++q) {{\n"
                f"    const int e = threadIdx.x * {k} + q;\n"
                f"    sv[e] = q < cnt ? lv[q] : ({ct})0; si[e] = q < cnt ? li[q] : {n} + e;\n  }}\n"
                f"  for (int e = {threads * k} + threadIdx.x; e < {size}; e += {threads}) {{ sv[e] = ({ct})0; "
                f"si[e] = {n} + e; }}\n  __syncthreads();\n")
        slots, blocks = size, lines
    out_ref = Strided("", ct, out_shape, tuple(_strides(out_shape)))
    store = (f"  for (int e = threadIdx.x; e < {per_block * k}; e += {threads}) {{\n"
             f"    const int l = e / {k}, j = e % {k};\n"
             f"    const long long line = (long long)blockIdx.x * {per_block} + l;\n"
             f"    if (line >= {lines}LL) continue;\n"
             f"    {_line_base(out_shape, dim, out_ref, 'line', 'o')[0]}\n"
             f"    const long long at = o_base + (long long)j * {out_stride}LL;\n"
             + (f"    vals[at] = sv[l * {size} + j];\n" if values else "")
             + (f"    idx[at] = (int64_t)si[l * {size} + j];\n" if indices else "")
             + "  }\n")
    source = render_kernel("sort.cu.j2", before=_before(before, ct, n, descending), threads=threads, name=kname, ct=ct,
                           slots=slots, load=load, network=_network(before, size, per_block, threads), store=store)
    launch = launch_line(kname, blocks * threads, threads,
                         [x.ptr, values.ptr if values else "nullptr", indices.ptr if indices else "nullptr"])
    how = "per-thread candidates, then a bitonic sort of them" if long_line else "bitonic sort in shared memory"
    return KernelCall({kname: source}, launch,
                      describe=f"{node.name}: {node.op[5:]} of {lines} line(s) of {n}"
                      + (f" (k={k})" if node.op == "aten.topk" else "") + f", {how}")


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return list(reversed(out))
