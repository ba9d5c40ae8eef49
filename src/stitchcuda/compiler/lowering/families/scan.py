"""Scans: cumsum and cumprod along any dim of any layout.

A *line* is the run of elements along the scanned dim at one combination of the other dims.

- ``block`` mapping, when the scanned dim is innermost in memory or lines are too few to fill the
  GPU: one block per line walks it in chunks of ``block x 8`` elements; each thread scans its 8
  consecutive elements in registers, the warps scan the threads' totals with shuffles, the block
  adds the warps' totals through shared memory, and a carry takes the chunk's total to the next
  chunk. Float lines whose start is 16-byte aligned move as float4 (checked per line at run time).
- ``thread`` mapping, when another dim is innermost (a cumsum over dim 0 of a row-major matrix):
  one thread per line walks it in order, neighbouring threads taking neighbouring lines, so every
  step of the warp reads and writes one contiguous run.

Sums and products accumulate in double (int64 for integer outputs): within rounding of the
exact scan, closer than PyTorch's own float scan is to it, so lines of 32k elements stay well
inside a 1e-4 tolerance.
"""

from __future__ import annotations

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.ops import C_TYPES
from stitchcuda.compiler.lowering.cuda_files import render_kernel
from stitchcuda.compiler.lowering.families.reduce import RESIDENT, Dim, bind, fail, offset_code
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall
from stitchcuda.compiler.lowering.registry import lowering

PER_THREAD = 8  # consecutive elements a thread scans in registers per chunk
FULL = "0xffffffffu"


def _loads(vector: bool, in_t: str, acc: str, ident: str, length: int, stride: int) -> str:
    scalar = (f"#pragma unroll\n      for (int k = 0; k < {PER_THREAD}; ++k) {{ const long long j = j0 + k; "
              f"v[k] = j < {length}LL ? ({acc})x[ib + j * {stride}LL] : ({acc})({ident}); }}")
    if not vector:
        return scalar
    quads = " ".join(f"const float4 q{h} = *reinterpret_cast<const float4*>(x + ib + j0 + {4 * h}); "
                     f"v[{4 * h}] = q{h}.x; v[{4 * h + 1}] = q{h}.y; v[{4 * h + 2}] = q{h}.z; v[{4 * h + 3}] = q{h}.w;"
                     for h in range(PER_THREAD // 4))
    return f"if (vin && j0 + {PER_THREAD} <= {length}LL) {{ {quads} }} else {{\n      {scalar}\n      }}"


def _stores(vector: bool, out_t: str, op: str, length: int, ostride: int) -> str:
    scalar = (f"#pragma unroll\n      for (int k = 0; k < {PER_THREAD}; ++k) {{ const long long j = j0 + k; "
              f"if (j < {length}LL) y[ob + j * {ostride}LL] = ({out_t})(pre {op} v[k]); }}")
    if not vector:
        return scalar
    quads = " ".join(f"*reinterpret_cast<float4*>(y + ob + j0 + {4 * h}) = make_float4("
                     + ", ".join(f"(float)(pre {op} v[{4 * h + i}])" for i in range(4)) + ");"
                     for h in range(PER_THREAD // 4))
    return f"if (vout && j0 + {PER_THREAD} <= {length}LL) {{ {quads} }} else {{\n      {scalar}\n      }}"


def block_kernel(name: str, block: int, in_t: str, out_t: str, acc: str, op: str, ident: str, offset: int,
                 lines: list[Dim], length: int, stride: int, ostride: int) -> str:
    nw = block // 32
    vin = in_t == "float" and stride == 1
    vout = out_t == "float" and ostride == 1
    flags = ""
    if vin:
        flags += "const bool vin = (reinterpret_cast<uintptr_t>(x + ib) & 15) == 0;\n    "
    if vout:
        flags += "const bool vout = (reinterpret_cast<uintptr_t>(y + ob) & 15) == 0;\n    "
    return render_kernel("scan_block.cu.j2", name=name, block=block, in_t=in_t, out_t=out_t, acc=acc, op=op,
                         ident=ident, offset=offset, length=length, nw=nw, flags=flags,
                         offsets=offset_code(lines, "line", "lin", "ob"), chunk=block * PER_THREAD,
                         per_thread=PER_THREAD, last=PER_THREAD - 1, full=FULL,
                         loads=_loads(vin, in_t, acc, ident, length, stride),
                         stores=_stores(vout, out_t, op, length, ostride))


def thread_kernel(name: str, block: int, in_t: str, out_t: str, acc: str, op: str, ident: str, offset: int,
                  lines: list[Dim], count: int, length: int, stride: int, ostride: int) -> str:
    return render_kernel("scan_thread.cu.j2", name=name, block=block, in_t=in_t, out_t=out_t, acc=acc, op=op,
                         ident=ident, offset=offset, count=count, length=length, stride=stride, ostride=ostride,
                         offsets=offset_code(lines, "line", "lin", "ob"))


@lowering("aten.cumsum", "aten.cumprod")
def lower_scan(ctx: FamilyContext, node: Node) -> KernelCall:
    args = bind(node)
    if not isinstance(args.get("self"), str):
        raise fail(node, "the input is not a tensor")
    x = ctx.read(args["self"])
    rank = len(x.shape)
    dim = args.get("dim")
    if not isinstance(dim, int) or isinstance(dim, bool) or not -max(rank, 1) <= dim < max(rank, 1):
        raise fail(node, f"dim {dim!r} for a rank-{rank} input")
    dtype = node.out[0].dtype
    if dtype not in C_TYPES or dtype == "bool":
        raise fail(node, f"a scan to {dtype}")
    shape, strides = (list(x.shape), list(x.strides)) if rank else ([1], [0])
    dim %= len(shape)
    out_strides, acc_n = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        out_strides[d] = acc_n
        acc_n *= shape[d]
    length, stride, ostride = shape[dim], strides[dim], out_strides[dim]
    lines = [Dim(s, st, o) for d, (s, st, o) in enumerate(zip(shape, strides, out_strides, strict=True))
             if d != dim and s != 1]
    count = 1
    for d in lines:
        count *= d.size
    y = ctx.write(node.name, dtype)
    what = node.op.split(".", 1)[1]
    if count == 0 or length == 0:
        return KernelCall(describe=f"{what}: empty")
    floating = dtype == "float32"
    acc = "double" if floating else "long long"
    op, ident = ("+", "0") if node.op == "aten.cumsum" else ("*", "1")
    in_t = x.ctype
    out_t = y.ctype
    name = ctx.kernel_name(node, "scan")
    inner = min((abs(d.stride) for d in lines if d.stride), default=None)
    along = inner is None or (stride != 0 and abs(stride) <= inner) or count * 8 < RESIDENT
    if along:
        block = 32
        while block < ctx.block and block * PER_THREAD < length:
            block *= 2
        source = block_kernel(name, block, in_t, out_t, acc, op, ident, x.offset, lines, length, stride, ostride)
        grid, how = count, f"a block of {block} per line, chunks of {block * PER_THREAD}"
    else:
        block = ctx.block
        source = thread_kernel(name, block, in_t, out_t, acc, op, ident, x.offset, lines, count, length, stride,
                               ostride)
        grid, how = -(-count // block), "a thread per line, neighbouring lines coalesced"
    launch = (f"{name}<<<{grid}, {block}, 0, stream>>>({x.ptr}, {y.ptr});\n"
              "SC_CUDA_CHECK(cudaGetLastError());")
    return KernelCall(kernels={name: source}, launch=launch,
                      describe=f"{what} over {count} lines of {length} ({how})")
