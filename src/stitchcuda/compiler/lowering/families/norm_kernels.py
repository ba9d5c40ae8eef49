"""The two kernels of a normalisation family lowering (norm.py plans them, per operator).

Every normalisation is "statistics per group of elements, then an elementwise pass": the input is
described as a :class:`Layout` whose dims are either *kept* (they pick the group: batch norm's
channel, layer norm's leading dims, every dim but softmax's) or *reduced* (the group's elements),
with the strides of each operand (input, output, group index, affine weight and bias, running
statistics) per dim, so that one generator covers every operator.

- The statistics kernel reduces each group: a block per group (several blocks per group, their
  partials combined by the last one to finish, when the groups are few and long) reading the
  group's elements in memory order, or -- when the reduced dim is not the innermost one in memory
  but a kept dim is -- a lane per group over consecutive groups (a few rows of lanes sharing each
  group where the groups alone are too few), so that a warp's reads are coalesced across groups.
  Moments are summed in double around a per-group shift (the group's first element), which keeps
  ``E[x^2] - E[x]^2`` exact enough for any offset of the data; softmax keeps an online (max, sum
  of exp) pair per thread.
- The apply kernel is elementwise over the output, four consecutive elements per thread (float4
  loads where the layout allows and the pointer is aligned at run time).

The statistics live in ``__device__`` arrays of the program (the shapes are static); the
operator's own statistics outputs (save_mean, rstd, the new running stats) are written by the
statistics kernel where the graph reads them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.lowering.cuda_files import cuda_file, render_kernel
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided

Kind = Literal["moments", "softmax", "safe_softmax", "log_softmax", "running"]

_TARGET_BLOCKS = 2048  # statistics blocks worth launching: an H100 (132 SMs) runs ~1000 at once
_MIN_CHUNK = 8192  # elements a block-per-group statistics block reduces at least before splitting a group
_MIN_ROWS = 64  # reduced positions a lane-per-group block walks at least before splitting

HELPERS_NAME = "sc_norm_helpers"
HELPERS = cuda_file("norm_helpers.cuh")


@dataclass
class Layout:
    """Dims of the (possibly regrouped) input: size, kept/reduced, and every operand's stride."""

    sizes: list[int]
    red: list[bool]
    strides: dict[str, list[int]] = field(default_factory=dict)  # operand -> stride per dim

    def merged(self) -> Layout:
        """Size-1 dims dropped; neighbours merged where every operand walks them as one."""
        keep = [d for d, n in enumerate(self.sizes) if n != 1]
        sizes, red = [self.sizes[d] for d in keep], [self.red[d] for d in keep]
        strides = {k: [v[d] for d in keep] for k, v in self.strides.items()}
        d = len(sizes) - 1
        while d > 0:
            if red[d - 1] == red[d] and all(s[d - 1] == s[d] * sizes[d] for s in strides.values()):
                sizes[d - 1] *= sizes[d]
                for s in strides.values():
                    s[d - 1] = s[d]
                    del s[d]
                del sizes[d], red[d]
            d -= 1
        return Layout(sizes, red, strides)


def row_major(sizes: list[int], mask: list[bool]) -> list[int]:
    """Row-major strides over the dims where ``mask`` holds (0 elsewhere)."""
    out, acc = [0] * len(sizes), 1
    for d in range(len(sizes) - 1, -1, -1):
        if mask[d]:
            out[d] = acc
            acc *= sizes[d]
    return out


def literal(v: float) -> str:
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if v > 0 else "-INFINITY"
    return repr(float(v))


def prod(xs: Any) -> int:
    n = 1
    for x in xs:
        n *= int(x)
    return n


def _offsets(dims: list[tuple[int, dict[str, int]]], flat: str, prefix: str, wide: bool,
             names: list[str]) -> list[str]:
    """C++ statements: split ``flat`` (row-major over ``dims``) and sum each operand's offset into
    ``{prefix}_{operand}`` (long long). 32-bit divisions where the index fits: they are cheap."""
    lines = [f"long long {prefix}_{k} = 0;" for k in names]
    if not dims:
        return lines
    ut = "unsigned long long" if wide else "unsigned"
    suffix = "ull" if wide else "u"
    lines.append(f"{ut} {prefix}_r = ({ut})({flat});")
    for d in range(len(dims) - 1, -1, -1):
        size, st = dims[d]
        coord = f"{prefix}_r" if d == 0 else f"{prefix}_c{d}"
        if d > 0:
            lines.append(f"const {ut} {coord} = {prefix}_r % {size}{suffix}; {prefix}_r /= {size}{suffix};")
        lines += [f"{prefix}_{k} += (long long){coord} * {st[k]}LL;" for k in names if st.get(k, 0)]
    return lines


@dataclass
class Plan:
    """One normalisation as the generators see it."""

    node: Node
    kind: Kind
    x: Strided
    layout: Layout  # merged; strides for "x", "o", "g" and any of "w", "b", "rm", "rv"
    eps: float = 0.0
    params: dict[str, Strided] = field(default_factory=dict)  # "w", "b", "rm", "rv" -> their reads
    out: Strided | None = None  # the normalised output (None: unread)
    finish: list[str] = field(default_factory=list)  # per-group statements after the statistics
    finish_args: list[tuple[str, str]] = field(default_factory=list)  # (C parameter, launch argument)

    @property
    def groups(self) -> int:
        return prod(n for n, r in zip(self.layout.sizes, self.layout.red, strict=True) if not r)

    @property
    def reduced(self) -> int:
        return prod(n for n, r in zip(self.layout.sizes, self.layout.red, strict=True) if r)


def _stats_kernel(ctx: FamilyContext, p: Plan) -> tuple[str, str, str]:
    """(kernel name, source, launch) of the per-group statistics; the stats array is ``{name}_st``."""
    name = ctx.kernel_name(p.node, "stats")
    lay, xo = p.layout, p.x.offset
    kept = [(n, {"x": lay.strides["x"][d]}) for d, n in enumerate(lay.sizes) if not lay.red[d]]
    red = [(n, lay.strides["x"][d]) for d, n in enumerate(lay.sizes) if lay.red[d]]
    red.sort(key=lambda t: -abs(t[1]))  # memory order: the order of the walk does not change a sum
    merged: list[tuple[int, int]] = []
    for n, s in red:
        if merged and merged[-1][1] == s * n:
            merged[-1] = (merged[-1][0] * n, s)
        else:
            merged.append((n, s))
    red = merged or [(1, 0)]
    G, M = p.groups, p.reduced
    acc = "ScSoftmax" if p.kind in ("softmax", "safe_softmax", "log_softmax") else "ScMoments"
    wide = max(G, M) >= 2**32 - 1
    inner_kept = kept[-1][1]["x"] if kept else 0
    lanes = bool(red) and red[-1][1] != 1 and inner_kept == 1 and G > 1  # a lane per group
    block, rows = ctx.block, 1
    if lanes:
        # lanes * rows threads: rows walk the reduced dim side by side (merged in shared memory) only
        # where the groups alone would not give the GPU ~1M threads
        while rows < 8 and G * rows < 1 << 20 and 4 * rows <= M:
            rows *= 2
        width = max(32, block // rows // 32 * 32)
        while width > 32 and width // 2 >= G:
            width //= 2
        block = width * rows
    else:
        width = 1
        while block > 64 and block // 2 >= M // 4:  # short groups: fewer idle threads
            block //= 2
    tiles = -(-G // width)
    min_chunk = _MIN_ROWS if lanes else _MIN_CHUNK
    parts = max(1, min(-(-_TARGET_BLOCKS // tiles), M // min_chunk))
    chunk = -(-M // parts)
    vec = not lanes and red[-1][1] == 1 and red[-1][0] % 4 == 0 and xo % 4 == 0 and all(
        s % 4 == 0 for _, s in red[:-1]) and all(st["x"] % 4 == 0 for _, st in kept)
    if vec:
        chunk = -(-chunk // 4) * 4
    parts = -(-M // chunk)
    step = f"{rows if lanes else block}"
    k_expr = "xg[0]" if acc == "ScMoments" else "0.0f"
    body: list[str] = []
    body.append(f"const long long blk = blockIdx.x, tile = blk / {parts}, part = blk % {parts};")
    if lanes:
        body += [f"const int tx = threadIdx.x % {width}, ty = threadIdx.x / {width};",
                 f"const long long g = tile * {width} + tx; const bool live = g < {G}LL;"]
    else:
        body += ["const long long g = tile; const bool live = true;", "const int ty = threadIdx.x;"]
    body += _offsets(kept, "live ? g : 0", "gb", wide, ["x"])
    body.append(f"const float* __restrict__ xg = x + {xo}LL + gb_x;")
    body.append(f"const float k = live ? {k_expr} : 0.0f;")
    body.append(f"{acc} acc; sc_init(acc);")
    body.append(f"const long long j0 = part * {chunk}LL, j1 = j0 + {chunk}LL < {M}LL ? j0 + {chunk}LL : {M}LL;")
    loop = _offsets([(n, {"x": s}) for n, s in red], "j", "jo", wide, ["x"])
    scalar = ["if (live) {", "  #pragma unroll 4", f"  for (long long j = j0 + ty; j < j1; j += {step}) {{",
              *("    " + s for s in loop), "    sc_add(acc, __ldg(xg + jo_x), k);", "  }", "}"]
    if vec:
        vred = [*red[:-1], (red[-1][0] // 4, 4)]
        vloop = _offsets([(n, {"x": s}) for n, s in vred], "j", "jo", wide, ["x"])
        body += ["if (aligned) {", "  #pragma unroll 4", f"  for (long long j = j0 / 4 + ty; j < j1 / 4; j += {step}) {{",
                 *("    " + s for s in vloop),
                 "    const float4 v = __ldg(reinterpret_cast<const float4*>(xg + jo_x));",
                 "    sc_add(acc, v.x, k); sc_add(acc, v.y, k); sc_add(acc, v.z, k); sc_add(acc, v.w, k);",
                 "  }", "} else {", *("  " + s for s in scalar), "}"]
    else:
        body += scalar
    tile_merge = [f"__shared__ {acc} sc_tile[{rows}][{width}];", "sc_tile[ty][tx] = acc;", "__syncthreads();",
                  "if (ty == 0) {", f"  for (int i = 1; i < {rows}; ++i) sc_merge(acc, sc_tile[i][tx]);", "}"]
    if lanes:
        body += tile_merge if rows > 1 else []
        leader = "ty == 0 && live"
    else:
        body += [f"__shared__ {acc} sc_smem[32];", "acc = sc_block_merge(acc, sc_smem);"]
        leader = "threadIdx.x == 0"
    finish = _finish_code(p, acc, M, f"{name}_st")
    head: list[str] = [f"__device__ float2 {name}_st[{G}];  // per group: (mean, rstd) or (max, 1/sum or log sum)"]
    if parts == 1:
        body += [f"if ({leader}) {{", *("  " + s for s in finish), "}"]
    else:
        # every block leaves its partial; the last block of a tile to finish combines them in order
        head += [f"__device__ {acc} {name}_part[{G * parts}];", f"__device__ unsigned int {name}_count[{tiles}];"]
        body += [f"if ({leader}) {name}_part[g * {parts}LL + part] = acc;",
                 "__threadfence();", "__shared__ bool sc_last;", "__syncthreads();",
                 f"if (threadIdx.x == 0) sc_last = atomicAdd(&{name}_count[tile], 1u) == {parts - 1}u;",
                 "__syncthreads();", "if (!sc_last) return;", "sc_init(acc);"]
        if lanes:
            body += [f"if (live) for (int i = ty; i < {parts}; i += {rows}) "
                     f"sc_merge(acc, sc_load_cg(&{name}_part[g * {parts}LL + i]));"]
            body += ["__syncthreads();", *tile_merge[1:]] if rows > 1 else []
        else:
            body += [f"for (int i = threadIdx.x; i < {parts}; i += {block}) "
                     f"sc_merge(acc, sc_load_cg(&{name}_part[g * {parts}LL + i]));",
                     "acc = sc_block_merge(acc, sc_smem);"]
        body += [f"if (threadIdx.x == 0) {name}_count[tile] = 0u;  // ready for the next launch",
                 f"if ({leader}) {{", *("  " + s for s in finish), "}"]
    params = ["const float* __restrict__ x", *(c for c, _ in p.finish_args)]
    args = [p.x.ptr, *(a for _, a in p.finish_args)]
    if vec:
        params.append("bool aligned")
        args.append(f"(reinterpret_cast<uintptr_t>({p.x.ptr}) & 15u) == 0")
    src = render_kernel("norm.cu.j2", head=head, block=block, name=name, params=params, body=body)
    launch = (f"{name}<<<{tiles * parts}, {block}, 0, stream>>>({', '.join(args)});\n"
              "SC_CUDA_CHECK(cudaGetLastError());")
    return name, src, launch


def _finish_code(p: Plan, acc: str, M: int, name_st: str) -> list[str]:
    """Per-group statements once ``acc`` holds the group's statistics (``g``, ``k`` in scope)."""
    if acc == "ScSoftmax":
        second = "logf(acc.s)" if p.kind == "log_softmax" else "1.0f / acc.s"
        return [f"{name_st}[g] = make_float2(acc.m, {second});"]
    return [f"const double mu = acc.s / {float(M)!r}, mean = (double)k + mu;",
            f"double var = acc.q / {float(M)!r} - mu * mu;",
            "if (var < 0.0) var = 0.0;  // rounding; NaN stays NaN",
            f"const float rstd = (float)(1.0 / sqrt(var + {literal(p.eps)}));",
            f"{name_st}[g] = make_float2((float)mean, rstd);", *p.finish]


def _apply_kernel(ctx: FamilyContext, p: Plan, stats: str) -> tuple[str, str, str]:
    """(kernel name, source, launch) of the elementwise pass writing ``p.out``."""
    assert p.out is not None
    name = ctx.kernel_name(p.node, "apply")
    lay = p.layout
    numel = prod(lay.sizes)
    inner = lay.sizes[-1] if lay.sizes else 1
    vw = 4 if inner % 4 == 0 else 1
    total = numel // vw
    operands = ["x", "g", *(k for k in ("w", "b", "rm", "rv") if k in p.params)]
    dims = [(n, {k: lay.strides[k][d] for k in operands}) for d, n in enumerate(lay.sizes)]
    if dims and vw > 1:
        dims[-1] = (dims[-1][0] // vw, {k: s * vw for k, s in dims[-1][1].items()})
    in_st = {k: (lay.strides[k][-1] if lay.sizes else 0) for k in operands}
    reads = {"x": p.x, **p.params}  # tensors loaded per element (the statistics come from the stats array)
    loaded = {k: f"v_{k}" for k in operands if k != "g"}
    # float4 loads where a tensor runs contiguously along the innermost dim from 16-byte boundaries
    # (the pointers' own alignment is checked at launch)
    vector = [k for k in loaded if vw == 4 and in_st[k] == 1 and reads[k].offset % 4 == 0
              and all(lay.strides[k][d] % 4 == 0 for d in range(len(lay.sizes) - 1))]
    block = ctx.block
    body = [f"const long long t = (long long)blockIdx.x * {block} + threadIdx.x;", f"if (t >= {total}LL) return;"]
    body += _offsets(dims, "t", "e", total >= 2**32 - 1, operands)
    body.append(f"float {', '.join(f'{v}[{vw}]' for v in loaded.values())};")

    def load(k: str, vec: bool) -> str:
        at = f"{k} + {reads[k].offset}LL + e_{k}"
        if vec:
            return (f"{{ const float4 q = __ldg(reinterpret_cast<const float4*>({at})); "
                    f"{loaded[k]}[0] = q.x; {loaded[k]}[1] = q.y; {loaded[k]}[2] = q.z; {loaded[k]}[3] = q.w; }}")
        return f"for (int i = 0; i < {vw}; ++i) {loaded[k]}[i] = __ldg({at} + i * {in_st[k]}LL);"

    if vector:
        body += ["if (aligned) {", *(f"  {load(k, k in vector)}" for k in loaded), "} else {",
                 *(f"  {load(k, False)}" for k in loaded), "}"]
    else:
        body += [load(k, False) for k in loaded]
    body += ["#pragma unroll", f"for (int i = 0; i < {vw}; ++i) {{"]
    loop: list[str] = []
    if p.kind == "running":
        loop += [f"const float rstd = 1.0f / sqrtf(v_rv[i] + (float){literal(p.eps)});",
                 "float y = (v_x[i] - v_rm[i]) * rstd;"]
    else:
        loop.append(f"const float2 st = {stats}[e_g + i * {in_st['g']}LL];")
        loop.append({"moments": "float y = (v_x[i] - st.x) * st.y;",
                     "softmax": "float y = expf(v_x[i] - st.x) * st.y;",
                     # a row of -inf only (a fully masked query) is 0, not NaN; a NaN row stays NaN
                     "safe_softmax": "float y = st.x == -INFINITY ? 0.0f : expf(v_x[i] - st.x) * st.y;",
                     "log_softmax": "float y = (v_x[i] - st.x) - st.y;"}[p.kind])
    for k, op in (("w", "*"), ("b", "+")):
        if k in p.params:
            loop.append(f"y = y {op} v_{k}[i];")
    loop.append("v_x[i] = y;")
    body += ["  " + s for s in loop] + ["}"]
    if vw == 4:
        body.append("*reinterpret_cast<float4*>(out + t * 4) = make_float4(v_x[0], v_x[1], v_x[2], v_x[3]);")
    else:
        body.append("out[t] = v_x[0];")
    params = ["const float* __restrict__ x", "float* __restrict__ out"]
    args = [p.x.ptr, p.out.ptr]
    for k in operands[2:]:
        params.append(f"const float* __restrict__ {k}")
        args.append(p.params[k].ptr)
    if vector:
        params.append("bool aligned")
        args.append(" && ".join(f"(reinterpret_cast<uintptr_t>({reads[k].ptr}) & 15u) == 0" for k in vector))
    src = render_kernel("norm.cu.j2", head=[], block=block, name=name, params=params, body=body)
    launch = (f"{name}<<<{-(-total // block)}, {block}, 0, stream>>>({', '.join(args)});\n"
              "SC_CUDA_CHECK(cudaGetLastError());")
    return name, src, launch


def emit(ctx: FamilyContext, p: Plan, what: str) -> KernelCall:
    call = KernelCall(kernels={HELPERS_NAME: HELPERS}, describe=what)
    launches: list[str] = []
    stats = ""
    if p.kind != "running":
        sname, ssrc, slaunch = _stats_kernel(ctx, p)
        stats = f"{sname}_st"
        call.kernels[sname] = ssrc
        launches.append(slaunch)
    if p.out is not None:
        aname, asrc, alaunch = _apply_kernel(ctx, p, stats)
        call.kernels[aname] = asrc
        launches.append(alaunch)
    call.launch = "\n".join(launches)
    return call
