"""Reductions over any dims of any layout: sum, mean, prod, amax/amin, max/min (values and indices),
argmax/argmin, var/std (and their ``_mean`` pairs), vector norms, logsumexp, any/all.

Every operator is a *state* with an identity, an update by one element and a combine of two states
(:class:`Spec`); one kernel generator lays any of them out on the GPU. The input's dims are split
into kept dims (one output element per combination) and reduced dims, neighbouring dims of the
same kind merged where memory allows, so most reductions become ``outputs x extent`` with one
stride each. The layout then picks the mapping that reads memory in order:

- ``team``: the reduced dims are innermost in memory (a row sum, a full reduction): a warp per
  output (a block when the extent reaches 1024) strides over the extent, neighbouring lanes read
  neighbouring elements, and the team combines through shuffles and shared memory;
- ``lanes``: a kept dim is innermost (a sum over dim 1 of ``[B, C, W]``): neighbouring threads
  take neighbouring outputs, so each step of their loops over the extent reads one contiguous
  run; when outputs are few, the threads of a block also split the extent among them. Walks
  whose steps lie far apart in memory run two rows per block and, for value-only reductions, at
  most 1024 threads per SM (dynamic shared memory asked for only to cap residency): measured
  faster on an H100, the DRAM pages being opened fewer at a time;
- either one is *split* when even so the GPU would sit mostly idle (a full reduction of a large
  tensor): a grid dimension cuts the extent into slices whose states land in a static
  ``__device__`` scratch array, and a second kernel (a warp per output) combines them.

Each thread keeps a batch of loads in flight (issued together, then folded in order).
Numerics follow PyTorch's CUDA kernels: sums and means (a batch of float loads summed in float
first), products and norms accumulate in double,
var/std sum deviations from the output's first element in double (no cancellation), max/min
propagate NaN, and (value, index) pairs combine under a total order -- a NaN beats any number, the
larger value wins, equal values take the smaller index -- so the first maximum's (or first NaN's)
index comes out whatever order the team combines in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.ir.ops import C_TYPES
from stitchcuda.compiler.lowering.cuda_files import render_kernel
from stitchcuda.compiler.lowering.kernel_call import FamilyContext, KernelCall, Strided
from stitchcuda.compiler.lowering.registry import lowering

RESIDENT = 132 * 2048  # threads an H100 keeps resident: fewer than half of these leaves it idle
TEAM_BLOCK_EXTENT = 1024  # extents from here on get a block per output, below a warp
SERIAL_EXTENT = 16  # extents up to here: one thread per output
FAR_STRIDE = 4096  # bytes between reduced neighbours from which a lanes walk caps its occupancy
SPLIT_MAX_SLICES = 1024
COMBINE_BLOCK = 128  # the combine kernel: a warp per output
SCRATCH_MAX = 1 << 22  # elements of one scratch array (per state field)
UNROLL = 16  # float loads a thread keeps in flight (8 of wider types)
FULL = "0xffffffffu"
IDX_NONE = "0x7fffffffffffffffLL"


def fail(node: Node, why: str) -> Unsupported:
    return Unsupported(f"{node.name} ({node.op}.{node.overload}): {why}")


def bind(node: Node) -> dict[str, Any]:
    """The node's arguments by schema name (positional or keyword, defaults filled in)."""
    try:
        import torch

        packet = getattr(torch.ops.aten, node.op.split(".", 1)[1])
        schema = getattr(packet, node.overload)._schema
    except Exception as exc:  # an overload this torch does not know
        raise fail(node, f"no schema ({type(exc).__name__})") from exc
    bound: dict[str, Any] = {}
    for i, a in enumerate(schema.arguments):
        if not a.kwarg_only and i < len(node.args):
            bound[a.name] = node.args[i]
        elif a.name in node.kwargs:
            bound[a.name] = node.kwargs[a.name]
        else:
            bound[a.name] = a.default_value if a.has_default_value() else None
    return bound


def norm_dims(node: Node, raw: Any, rank: int) -> list[int]:
    """Reduced dims, sorted: ``None`` or ``[]`` mean every dim; negative dims count from the end."""
    if raw is None or raw == [] or rank == 0:
        return list(range(rank))
    items = [raw] if isinstance(raw, int) else list(raw)
    dims = set()
    for d in items:
        if not isinstance(d, int) or isinstance(d, bool) or not -rank <= d < rank:
            raise fail(node, f"dim {d!r} for a rank-{rank} input")
        dims.add(d % rank)
    return sorted(dims)


# -- the states ---------------------------------------------------------------------------------------

@dataclass
class Spec:
    """A reduction as a state: fields ``(name, C type, identity)``; ``update`` folds in one element
    ``v`` (of C type ``load``) at flat reduced index ``r``; ``combine`` folds ``o_<field>`` into
    ``<field>``; ``results`` are C expressions of each output. With ``shift`` the fields see
    ``K``, the output's first element, as a double (variance sums deviations from it)."""

    fields: list[tuple[str, str, str]]
    load: str
    update: str
    combine: str
    results: list[str]
    shift: bool = False
    start: str = ""  # statements after the state is declared (FIRST: the thread's first index)
    fold: str = ""  # an operator that pre-combines a batch of loads in the load type (one update each)


def _sum(acc: str, load: str, result: str = "s") -> Spec:
    if load == "float":  # a batch of floats summed in float, then once into the double: fewer conversions
        return Spec([("s", acc, "0")], load, "s += (double)v;", "s += o_s;", [result], fold="+")
    return Spec([("s", acc, "0")], load, "s += v;", "s += o_s;", [result])


def _extreme(value_t: str, largest: bool, absolute: bool = False) -> Spec:
    """amax/amin and the full max/min: the extreme value, NaN winning over any number."""
    cmp = ">" if largest else "<"
    ident = "-INFINITY" if largest else "INFINITY"
    take = "fabs(v)" if absolute else "v"
    return Spec([("m", value_t, ident)], value_t,
                f"{{ const {value_t} a = {take}; if (a != a || a {cmp} m) m = a; }}",
                f"if (o_m != o_m || o_m {cmp} m) m = o_m;", ["m"])


def _better(av: str, ai: str, bv: str, bi: str, cmp: str) -> str:
    """C condition: (av, ai) beats (bv, bi) -- NaN first, then the value, then the smaller index."""
    return (f"(({av}) != ({av}) ? (({bv}) == ({bv}) || ({ai}) < ({bi})) : "
            f"(({bv}) == ({bv}) && (({av}) {cmp} ({bv}) || (({av}) == ({bv}) && ({ai}) < ({bi})))))")


def _arg_extreme(value_t: str, largest: bool, results: list[str]) -> Spec:
    cmp = ">" if largest else "<"
    ident = "-INFINITY" if largest else "INFINITY"
    # A thread meets its indices in increasing order, so its own updates need no index test: it
    # starts at its first index (a thread with none starts past the end and loses every tie).
    return Spec([("m", value_t, ident), ("i", "long long", IDX_NONE)], value_t,
                f"if (v {cmp} m || (v != v && m == m)) {{ m = v; i = r; }}",
                f"if ({_better('o_m', 'o_i', 'm', 'i', cmp)}) {{ m = o_m; i = o_i; }}", results,
                start="i = FIRST;")


def _moments(length: int, correction: float, results: list[str]) -> Spec:
    """Sums of deviations from K and of their squares: var = (s2 - s1^2 / n) / max(n - correction, 0)."""
    n = f"{float(length)!r}"
    dev = f"(s2 - s1 * s1 / {n})"
    den = max(float(length) - float(correction), 0.0)  # torch's divisor: 0 gives inf or NaN, as there
    var = f"(({dev} < 0.0 ? 0.0 : {dev}) / {den!r})"  # rounding may dip below 0; NaN passes
    names = {"var": var, "std": f"sqrt({var})", "mean": f"(K + s1 / {n})"}
    return Spec([("s1", "double", "0"), ("s2", "double", "0")], "double",
                "{ const double d = v - K; s1 += d; s2 += d * d; }", "s1 += o_s1; s2 += o_s2;",
                [names[r] for r in results], shift=True)


def _logsumexp() -> Spec:
    """Online: the running max m and s = sum exp(x - m), rescaled whenever m grows."""
    return Spec(
        [("m", "float", "-INFINITY"), ("s", "double", "0")], "float",
        "if (v > m) { s = s * (double)expf(m - v) + 1.0; m = v; } "
        "else { s += (v == m) ? 1.0 : (double)expf(v - m); }",
        "{ const float nm = o_m > m ? o_m : m; "
        "s = s * (m == nm ? 1.0 : (double)expf(m - nm)) + o_s * (o_m == nm ? 1.0 : (double)expf(o_m - nm)); "
        "m = nm; }",
        ["log(s) + (double)m"])


def _vector_norm(node: Node, p: Any, value_t: str) -> Spec:
    if p is None:
        p = 2
    if isinstance(p, str):  # inf may arrive as text
        try:
            p = float(p)
        except ValueError:
            raise fail(node, f"norm order {p!r}") from None
    if not isinstance(p, (int, float)) or isinstance(p, bool):
        raise fail(node, f"norm order {p!r}")
    p = float(p)
    if p == math.inf or p == -math.inf:
        return _extreme(value_t, p > 0, absolute=True)
    if p == 0:
        return Spec([("s", "double", "0")], "double", "s += (v != 0.0) ? 1.0 : 0.0;", "s += o_s;", ["s"])
    if p == 1:
        return Spec([("s", "double", "0")], "double", "s += fabs(v);", "s += o_s;", ["s"])
    if p == 2:
        return Spec([("s", "double", "0")], "double", "s += v * v;", "s += o_s;", ["sqrt(s)"])
    return Spec([("s", "double", "0")], "double", f"s += pow(fabs(v), {p!r});", "s += o_s;",
                [f"pow(s, {1.0 / p!r})"])


def _spec(node: Node, args: dict[str, Any], x: Strided, length: int) -> Spec:
    op, over = node.op, node.overload
    floating = x.ctype == "float"
    value_t = "float" if floating else "double"  # integers compare exactly as doubles below 2^53
    out_float = node.out[0].dtype == "float32"
    if op == "aten.sum":
        return _sum("double", x.ctype if floating else "double") if out_float else _sum("long long", "long long")
    if op == "aten.mean":
        if not out_float:
            raise fail(node, f"mean to {node.out[0].dtype}")
        return _sum("double", x.ctype if floating else "double", f"s / {float(length)!r}")
    if op == "aten.prod":
        return Spec([("s", "double" if out_float else "long long", "1")], "double" if out_float else "long long",
                    "s *= v;", "s *= o_s;", ["s"])
    if op in ("aten.amax", "aten.amin") or (op in ("aten.max", "aten.min") and over == "default"):
        return _extreme(value_t, op in ("aten.amax", "aten.max"))
    if op in ("aten.max", "aten.min"):
        return _arg_extreme(value_t, op == "aten.max", ["m", "i"])
    if op in ("aten.argmax", "aten.argmin"):
        return _arg_extreme(value_t, op == "aten.argmax", ["i"])
    if op in ("aten.var", "aten.std", "aten.var_mean", "aten.std_mean"):
        correction = args.get("correction")
        if correction is None:
            correction = 1 if args.get("unbiased", True) in (True, None) else 0
        if not isinstance(correction, (int, float)):
            raise fail(node, f"correction {correction!r}")
        first = "std" if op.startswith("aten.std") else "var"
        return _moments(length, float(correction), [first, "mean"] if op.endswith("_mean") else [first])
    if op == "aten.linalg_vector_norm":
        return _vector_norm(node, args.get("ord"), value_t)
    if op == "aten.norm":
        return _vector_norm(node, args.get("p"), value_t)
    if op == "aten.logsumexp":
        return _logsumexp()
    if op in ("aten.any", "aten.all"):
        flag = "|" if op == "aten.any" else "&"
        return Spec([("f", "int", "0" if op == "aten.any" else "1")], "double", f"f {flag}= (v != 0.0);",
                    f"f {flag}= o_f;", ["f"])
    raise fail(node, "not a reduction this family knows")


def _dims_of(node: Node, args: dict[str, Any], rank: int) -> list[int]:
    op, over = node.op, node.overload
    if op in ("aten.max", "aten.min"):
        if over == "default":
            return list(range(rank))
        if over != "dim":
            raise fail(node, "only the full reduction and the dim overload (values, indices)")
    if op == "aten.norm" and "dim" not in args:
        return list(range(rank))
    return norm_dims(node, args.get("dim"), rank)


# -- geometry ---------------------------------------------------------------------------------------

@dataclass
class Dim:
    size: int
    stride: int  # in the input
    out: int = 0  # stride in the (contiguous) output, kept dims only


def split_dims(x: Strided, reduced: list[int]) -> tuple[list[Dim], list[Dim]]:
    """Kept and reduced dims in logical order, size-1 dims dropped, neighbours merged where the
    input's strides allow (a merged dim enumerates the same elements in the same order)."""
    kept: list[Dim] = []
    red: list[Dim] = []
    last_kind: bool | None = None
    for d, (size, stride) in enumerate(zip(x.shape, x.strides, strict=True)):
        if size == 1:
            continue
        is_red = d in reduced
        group = red if is_red else kept
        if last_kind is is_red and group and group[-1].stride == stride * size:
            group[-1] = Dim(group[-1].size * size, stride)
        else:
            group.append(Dim(size, stride))
        last_kind = is_red
    acc = 1
    for k in reversed(kept):
        k.out = acc
        acc *= k.size
    return kept, red


def offset_code(dims: list[Dim], flat: str, name: str, out_name: str | None = None) -> str:
    """C statements declaring ``long long name`` (and ``out_name``): the input (and output) offset
    of the flat index ``flat`` over ``dims`` in row-major order."""
    if not dims:
        return f"const long long {name} = 0;" + (f" const long long {out_name} = 0;" if out_name else "")
    if len(dims) == 1:
        text = f"const long long {name} = ({flat}) * {dims[0].stride}LL;"
        return text + (f" const long long {out_name} = ({flat}) * {dims[0].out}LL;" if out_name else "")
    lines = [f"long long {name} = 0;" + (f" long long {out_name} = 0;" if out_name else ""),
             f"{{ long long q_ = {flat};"]
    for i, d in enumerate(reversed(dims)):
        c = "q_" if i == len(dims) - 1 else f"(q_ % {d.size}LL)"
        step = f"  {{ const long long c_ = {c}; {name} += c_ * {d.stride}LL;"
        step += f" {out_name} += c_ * {d.out}LL;" if out_name else ""
        step += " }" + ("" if i == len(dims) - 1 else f" q_ /= {d.size}LL;")
        lines.append(step)
    lines.append("}")
    return "\n    ".join(lines)


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


@dataclass
class Plan:
    mode: str  # "team" or "lanes"
    block: int
    team: int = 32  # team: threads per output
    per_block: int = 1  # team: outputs per block
    xlanes: int = 1  # lanes: neighbouring outputs per block
    ylanes: int = 1  # lanes: threads sharing one output's extent
    slices: int = 1  # grid.y slices of the extent (a second kernel combines them)
    smem: int = 0  # dynamic shared memory (bytes) asked for only to cap the blocks resident per SM


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _cap_smem(block: int) -> int:
    """Dynamic shared memory that leaves room for only ``1024 // block`` blocks on an SM (228 KB,
    1 KB reserved per block); 0 where that would take more than the 48 KB a launch gets unasked."""
    per_sm = 1024 // block
    if per_sm < 3:
        return 0
    return (228 // (per_sm + 1)) * 1024


def plan(kept: list[Dim], red: list[Dim], outputs: int, length: int, block: int, fields: int,
         indexed: bool = False) -> Plan:
    inner_red = min((abs(d.stride) for d in red if d.stride), default=None)
    inner_kept = min((d for d in kept if d.stride), key=lambda d: abs(d.stride), default=None)
    lanes = length <= SERIAL_EXTENT or (inner_kept is not None and (
        inner_red is None or abs(inner_kept.stride) < inner_red) and (inner_kept.size >= 32 or inner_red != 1))
    if lanes:
        x = min(block, _pow2_at_least(outputs))
        y = block // x
        while y > 1 and (outputs * y > 2 * RESIDENT or y * 8 > length):
            y //= 2
        p = Plan("lanes", x * y, xlanes=x, ylanes=y)
        if inner_red is not None and inner_red * 4 >= FAR_STRIDE and outputs >= RESIDENT // 4 and length >= 64:
            # Every step of every thread opens another DRAM page: measured on an H100 (sum, max and
            # argmax over dim 1 of [128, 4096, 4095]), two rows per block read faster, and at most
            # 1024 threads per SM 15% faster still for the value-only reductions (the index ones,
            # slower per element, already pace their requests and lose by the cap).
            if y == 1 and x >= 64:
                x, y = x // 2, 2
                p = Plan("lanes", x * y, xlanes=x, ylanes=y)
            p.smem = 0 if indexed else _cap_smem(p.block)
        blocks = -(-outputs // x)
        work = length // y
    else:
        team = block if length >= TEAM_BLOCK_EXTENT else 32
        p = Plan("team", block, team=team, per_block=block // team)
        blocks = -(-outputs // p.per_block)
        work = length // team
    if blocks * p.block < RESIDENT // 2 and work >= 64:
        slices = min(-(-RESIDENT // (blocks * p.block)), work // 32, SPLIT_MAX_SLICES)
        if slices > 1 and slices * outputs <= SCRATCH_MAX and fields:
            p.slices = slices
    return p


# -- kernels ----------------------------------------------------------------------------------------

def _decl(spec: Spec, prefix: str = "") -> str:
    return " ".join(f"{t} {prefix}{n} = {i};" for n, t, i in spec.fields)


def _warp_reduce(spec: Spec) -> str:
    shuffles = " ".join(f"const {t} o_{n} = __shfl_down_sync({FULL}, {n}, s_);" for n, t, _ in spec.fields)
    return f"#pragma unroll\n    for (int s_ = 16; s_ > 0; s_ >>= 1) {{ {shuffles} {spec.combine} }}"


def _finish(spec: Spec, outs: list[tuple[int, str, str]], where: str) -> str:
    """Write each read output at offset ``where``."""
    return " ".join(f"y{i}[{where}] = ({ctype})({spec.results[i]});" for i, _, ctype in outs)


def _params(x: Strided, outs: list[tuple[int, str, str]]) -> str:
    return ", ".join([f"const {x.ctype}* __restrict__ x", *(f"{c}* __restrict__ y{i}" for i, _, c in outs)])


def _shift(spec: Spec, x: Strided) -> str:
    return "const double K = (double)x[base];" if spec.shift else ""


def _loop(spec: Spec, red: list[Dim], first: str, step: int, length: int) -> str:
    """The thread's walk over its reduced indices ``first, first + step, ...``: a batch of loads issued
    together before their updates (the loads are independent, the updates in order)."""
    def load(k: int) -> str:
        return (f"{{ const long long r = r0 + {k * step}LL; {offset_code(red, 'r', 'roff')} "
                f"v_{k} = ({spec.load})x[base + roff]; }}")

    def update(k: int) -> str:
        return f"{{ const long long r = r0 + {k * step}LL; const {spec.load} v = v_{k}; {spec.update} }}"

    unroll = UNROLL if spec.load == "float" else UNROLL // 2  # wide loads: fewer registers
    start = spec.start.replace("FIRST", f"({first})")
    if spec.fold:
        f = spec.fold
        value = f" {f} ".join(f"v_{k}" for k in range(unroll))
        folded = f"{{ const long long r = r0; const {spec.load} v = {value}; {spec.update} }}"
        updates = [folded]
    else:
        updates = [update(k) for k in range(unroll)]
    batch = "\n        ".join([f"{spec.load} {', '.join(f'v_{k}' for k in range(unroll))};",
                                *(load(k) for k in range(unroll)), *updates])
    return f"""long long r0 = {first};
    {start}
    for (; r0 + {(unroll - 1) * step}LL < {length}LL; r0 += {unroll * step}LL) {{
        {batch}
    }}
    for (; r0 < {length}LL; r0 += {step}LL) {{
        const long long r = r0; {offset_code(red, 'r', 'roff')}
        const {spec.load} v = ({spec.load})x[base + roff];
        {spec.update}
    }}"""


def main_kernel(name: str, spec: Spec, p: Plan, x: Strided, kept: list[Dim], red: list[Dim],
                outputs: int, length: int, outs: list[tuple[int, str, str]]) -> str:
    b = p.block
    scratch = p.slices > 1
    if scratch:
        store = " ".join(f"{name}_p_{n}[(long long)blockIdx.y * {outputs}LL + o] = {n};" for n, _, _ in spec.fields)
    if p.mode == "team":
        t = p.team
        head = (f"const long long o = (long long)blockIdx.x * {p.per_block} + threadIdx.x / {t};\n"
                f"    const int t = threadIdx.x % {t};\n"
                + (f"    if (o >= {outputs}LL) return;  // whole warps: a warp is one output's team\n"
                   if p.per_block > 1 and outputs % p.per_block else ""))
        first = f"(long long)blockIdx.y * {t} + t" if scratch else "t"
        body = f"""{head}    {offset_code(kept, "o", "kept", "out")}
    const long long base = {x.offset}LL + kept;
    {_shift(spec, x)}
    {_decl(spec)}
    {_loop(spec, red, first, t * p.slices, length)}
    {_warp_reduce(spec)}"""
        if t > 32:
            nw = t // 32
            smem = " ".join(f"__shared__ {ty} sm_{n}[{nw}];" for n, ty, _ in spec.fields)
            put = " ".join(f"sm_{n}[threadIdx.x >> 5] = {n};" for n, _, _ in spec.fields)
            get = " ".join(f"{n} = (threadIdx.x & 31) < {nw} ? sm_{n}[threadIdx.x & 31] : ({ty})({i});"
                           for n, ty, i in spec.fields)
            body += f"""
    {smem}
    if ((threadIdx.x & 31) == 0) {{ {put} }}
    __syncthreads();
    if (threadIdx.x >= 32) return;
    {get}
    {_warp_reduce(spec)}"""
        body += f"""
    if (t == 0) {{ {store if scratch else _finish(spec, outs, "out")} }}"""
    else:
        y, xl = p.ylanes, p.xlanes
        first = f"(long long)blockIdx.y * {y} + ty" if scratch else "ty"
        body = f"""const int tx = threadIdx.x % {xl}, ty = threadIdx.x / {xl};
    const long long o = (long long)blockIdx.x * {xl} + tx;
    const bool live = o < {outputs}LL;
    {_decl(spec)}
    long long base = 0, out = 0;
    {"double K = 0.0;" if spec.shift else ""}
    if (live) {{
      {offset_code(kept, "o", "kept", "kout")}
      base = {x.offset}LL + kept; out = kout;
      {"K = (double)x[base];" if spec.shift else ""}
      {_loop(spec, red, first, y * p.slices, length)}
    }}"""
        if y > 1:
            smem = " ".join(f"__shared__ {ty} sm_{n}[{b}];" for n, ty, _ in spec.fields)
            put = " ".join(f"sm_{n}[threadIdx.x] = {n};" for n, _, _ in spec.fields)
            get = " ".join(f"const {ty} o_{n} = sm_{n}[k_ * {xl} + tx];" for n, ty, _ in spec.fields)
            body += f"""
    {smem}
    {put}
    __syncthreads();
    if (ty != 0) return;
    for (int k_ = 1; k_ < {y}; ++k_) {{ {get} {spec.combine} }}"""
        body += f"""
    if (ty == 0 && live) {{ {store if scratch else _finish(spec, outs, "out")} }}"""
    scratch_decl = "".join(f"__device__ {t} {name}_p_{n}[{p.slices * outputs}];\n" for n, t, _ in spec.fields) \
        if scratch else ""
    return render_kernel("reduce_main.cu.j2", scratch_decl=scratch_decl, b=b, name=name, params=_params(x, outs),
                         body=body)


def combine_kernel(name: str, main: str, spec: Spec, p: Plan, x: Strided, kept: list[Dim], outputs: int,
                   outs: list[tuple[int, str, str]]) -> str:
    """A warp per output folds the slices' states from the scratch arrays and writes the outputs."""
    b = COMBINE_BLOCK
    loads = " ".join(f"const {t} o_{n} = {main}_p_{n}[(long long)g_ * {outputs}LL + o];" for n, t, _ in spec.fields)
    return render_kernel("reduce_combine.cu.j2", b=b, name=name, params=_params(x, outs), warps=b // 32,
                         outputs=outputs, decl=_decl(spec), slices=p.slices, loads=loads, combine=spec.combine,
                         warp_reduce=_warp_reduce(spec), offsets=offset_code(kept, "o", "kept", "out"),
                         shift=("const long long base = " + str(x.offset) + "LL + kept; " + _shift(spec, x)
                                if spec.shift else ""),
                         finish=_finish(spec, outs, "out"))


def reduce_call(ctx: FamilyContext, node: Node, x: Strided, dims: list[int], spec: Spec) -> KernelCall:
    """Kernels and launches of ``spec`` over ``dims`` of ``x`` into the node's outputs."""
    names = ctx.outputs(node)
    if len(names) != len(spec.results):
        raise fail(node, f"{len(names)} outputs, the reduction makes {len(spec.results)}")
    outs: list[tuple[int, str, str]] = []
    ptrs: list[str] = []
    for i, value in enumerate(names):
        if value is None:
            continue
        dtype = node.out[i].dtype
        if dtype not in C_TYPES:
            raise fail(node, f"output {i} of dtype {dtype}")
        buf = ctx.write(value, dtype)
        outs.append((i, value, buf.ctype))
        ptrs.append(buf.ptr)
    if not outs:
        return KernelCall(describe=f"{node.op.split('.', 1)[1]}: no output is read")
    kept, red = split_dims(x, dims)
    outputs, length = _numel(d.size for d in kept), _numel(d.size for d in red)
    if outputs != node.out[0].numel:
        raise fail(node, f"{outputs} outputs from the geometry, {node.out[0].numel} in the graph")
    what = node.op.split(".", 1)[1]
    if outputs == 0:
        return KernelCall(describe=f"{what}: empty output")
    p = plan(kept, red, outputs, length, ctx.block, len(spec.fields), any(n == "i" for n, _, _ in spec.fields))
    name = ctx.kernel_name(node, "reduce")
    kernels = {name: main_kernel(name, spec, p, x, kept, red, outputs, length, outs)}
    args = ", ".join([x.ptr, *ptrs])
    grid_x = -(-outputs // (p.per_block if p.mode == "team" else p.xlanes))
    launch = [f"{name}<<<dim3({grid_x}, {p.slices}), {p.block}, {p.smem}, stream>>>({args});",
              "SC_CUDA_CHECK(cudaGetLastError());"]
    if p.slices > 1:
        fin = ctx.kernel_name(node, "combine")
        kernels[fin] = combine_kernel(fin, name, spec, p, x, kept, outputs, outs)
        launch += [f"{fin}<<<{-(-outputs // (COMBINE_BLOCK // 32))}, {COMBINE_BLOCK}, 0, stream>>>({args});",
                   "SC_CUDA_CHECK(cudaGetLastError());"]
    how = (f"{'a block' if p.team > 32 else 'a warp'} per output" if p.mode == "team"
           else ("a thread" if p.ylanes == 1 else f"{p.ylanes} threads") + " per output, neighbouring outputs coalesced")
    if p.slices > 1:
        how += f", extent split in {p.slices} slices + a combine kernel"
    return KernelCall(kernels=kernels, launch="\n".join(launch),
                      describe=f"{what} over {length} elements for {outputs} outputs ({how})")


REDUCTIONS = ("aten.sum", "aten.mean", "aten.prod", "aten.amax", "aten.amin", "aten.max", "aten.min",
              "aten.argmax", "aten.argmin", "aten.var", "aten.std", "aten.var_mean", "aten.std_mean",
              "aten.linalg_vector_norm", "aten.norm", "aten.logsumexp", "aten.any", "aten.all")


@lowering(*REDUCTIONS)
def lower_reduction(ctx: FamilyContext, node: Node) -> KernelCall:
    if node.op in ("aten.max", "aten.min") and node.overload not in ("default", "dim"):
        raise fail(node, "only the full reduction and the dim overload (values, indices)")
    args = bind(node)
    if not isinstance(args.get("self"), str):
        raise fail(node, "the input is not a tensor")
    x = ctx.read(args["self"])
    dims = _dims_of(node, args, len(x.shape))
    length = _numel(x.shape[d] for d in dims)
    spec = _spec(node, args, x, length)
    if node.op in ("aten.max", "aten.min") and node.overload == "dim" and ctx.outputs(node)[1:] == [None]:
        # the values alone (max(x, dim)[0]): no index to carry
        value_t = "float" if x.ctype == "float" else "double"
        spec = _extreme(value_t, node.op == "aten.max")
        spec.results = ["m", "m"]  # the second is never written
    return reduce_call(ctx, node, x, dims, spec)
