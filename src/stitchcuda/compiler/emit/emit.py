"""The IR programs of the fused kernels (pointwise and row) as CUDA ``__global__`` functions and
their launches: index arithmetic for strided, broadcast, gathered and guarded reads, kernel
parameters, and deduplication of kernels that differ only in names."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from stitchcuda.compiler.ir.expr import (
    OPS,
    Expr,
    Leaf,
    Program,
    Unsupported,
    c_float,
    contiguous_strides,
    numel,
)
from stitchcuda.compiler.ir.formulas import row_scalar_leaf
from stitchcuda.compiler.lowering.attention_kernel import FusedAttention
from stitchcuda.compiler.lowering.cuda_files import TEMPLATES
from stitchcuda.compiler.lowering.gemm_calls import gemm_launch
from stitchcuda.compiler.lowering.lowered import CodegenOptions, Gemm, Lowering
from stitchcuda.templating import environment


def _offset(eff: tuple[int, ...], shape: tuple[int, ...], idx: str, base: int = 0) -> str:
    """C expression of the element offset of a read with effective strides ``eff`` at linear
    index ``idx`` of ``shape`` (dims merged where the read is contiguous or broadcast)."""
    dims: list[list[int]] = []
    for d, s in zip(shape, eff, strict=True):
        if d == 1:
            continue
        if dims and ((dims[-1][1] == s * d and s != 0) or (dims[-1][1] == 0 and s == 0)):
            dims[-1] = [dims[-1][0] * d, s]
        else:
            dims.append([d, s])
    terms, inner = [], 1
    for k in reversed(range(len(dims))):
        size, stride = dims[k]
        if stride:
            t = idx if inner == 1 else f"({idx} / {inner})"
            if k > 0:
                t = f"({t} % {size})"
            terms.append(t if stride == 1 else f"{t} * {stride}")
        inner *= size
    text = " + ".join(reversed(terms))
    if base:
        text = f"{text} {'+' if base > 0 else '-'} {abs(base)}" if text else str(base)
    return text or "0"


def _coord(shape: tuple[int, ...], dim: int, idx: str) -> str:
    """C expression of the coordinate along ``dim`` of linear index ``idx`` of ``shape``."""
    inner = numel(shape[dim + 1:])
    t = idx if inner == 1 else f"({idx} / {inner})"
    return f"({t} % {shape[dim]})" if numel(shape[:dim]) > 1 else t


def _load(lf: Leaf, low: Lowering, offset: Any, coord: Any) -> str:
    """C expression reading ``lf``: ``offset(leaf)`` gives a read's element offset and ``coord(axis)``
    the output coordinate along an axis counted from the end. Index reads go through
    ``sc_gather_at`` (bounds, wrapping; -1 when out of range) and ``sc_gather_load`` (NaN for -1); a
    guarded piece reads nothing outside its range and is -0.0 there (the identity of the sum), a
    window's tap nothing outside the input and is 0.0 there (zero padding)."""
    text = _read(lf, low, offset)
    if lf.window:
        inside = " && ".join(f"static_cast<unsigned>({coord(axis)}{f' * {step}' if step != 1 else ''}"
                             f"{f' + {shift}' if shift > 0 else f' - {-shift}' if shift else ''}) < {size}u"
                             for axis, step, shift, size in lf.window)
        text = f"(({inside}) ? {text} : 0.0f)"
    if lf.guard is None:
        return text
    axis, lo, hi = lf.guard
    c = coord(axis)
    cond = f"{c} == {lo}" if hi == lo + 1 else f"{c} < {hi}" if lo == 0 else f"{c} >= {lo}" \
        if hi == lf.shape[axis] else f"{c} >= {lo} && {c} < {hi}"
    return f"(({cond}) ? {text} : -0.0f)"


def _read(lf: Leaf, low: Lowering, offset: Any) -> str:
    """``lf``'s read (through its index reads), its guard and window left out."""
    ptr = low.storage[lf.value]
    if not lf.gathers:
        return f"{ptr}[{offset(lf)}]"
    at = f"static_cast<long long>({offset(lf)})"
    for g in lf.gathers:
        k = f"static_cast<long long>({low.storage[g.index.value]}[{offset(g.index)}])"
        at = f"sc_gather_at({at}, {k}, {g.bound}LL, {g.stride}LL, {'true' if g.wrap else 'false'})"
    return f"sc_gather_load({ptr}, {at})"


@dataclass(frozen=True)
class _Pieces:
    """Guarded reads emitted inline where they are used: ``reads`` their unguarded loads,
    ``coord(axis)`` the output coordinate their guards test."""
    reads: dict[Leaf, str]
    coord: Any


def _terms(e: Expr) -> list[Expr]:
    return [t for a in e.args for t in _terms(a)] if e.op == "add" else [e]


def _select(e: Expr, pieces: _Pieces) -> str | None:
    """A sum of guarded pieces that tile one axis (a concatenation) as a binary tree of selects on
    that coordinate, so each element evaluates one piece's index arithmetic and load instead of
    every piece's: the same value, since the other terms are -0.0 there. None if ``e`` is not
    such a sum."""
    terms = _terms(e)
    if len(terms) < 2 or any(t.op != "leaf" or t.leaf not in pieces.reads for t in terms):
        return None
    guards = sorted(((t.leaf.guard, t.leaf) for t in terms), key=lambda x: x[0])  # type: ignore[union-attr]
    axis = guards[0][0][0]
    size = guards[0][1].shape[axis]
    edge = 0
    for (ax, lo, hi), _ in guards:
        if ax != axis or lo != edge:
            return None
        edge = hi
    if edge != size:
        return None
    c = pieces.coord(axis)

    def tree(part: list[Any]) -> str:
        if len(part) == 1:
            return pieces.reads[part[0][1]]
        mid = len(part) // 2
        return f"(({c} < {part[mid][0][1]}) ? {tree(part[:mid])} : {tree(part[mid:])})"

    return tree(guards)


def _code(e: Expr, leafs: dict[Leaf, str], refs: dict[str, str], pieces: _Pieces | None = None) -> str:
    if e.op == "leaf":
        return leafs[e.leaf]  # type: ignore[index]
    if e.op == "const":
        return c_float(e.const)
    if e.op == "ref":
        return refs[e.ref]
    if e.op == "add" and pieces is not None and (chain := _select(e, pieces)) is not None:
        return chain
    return OPS[e.op][0].format(*(_code(a, leafs, refs, pieces) for a in e.args))


def _ctype(lf: Leaf, low: Lowering) -> str:
    """The register type of a read: int index values keep their type (only picks read them), the
    rest is float (a bool mask as 0.0f / 1.0f, a gathered value from its float table)."""
    c = low.ctypes.get(low.storage[lf.value], "float")
    return c if lf.plain and c in ("int64_t", "int32_t") else "float"


@dataclass
class _Kernel:
    source: str
    launch: str
    params: list[str]


def _shifts(prog: Program, low: Lowering, writes: list[str]) -> dict[str, int]:
    """Buffers all of whose reads are at affine offsets, the least of them positive: the launch
    passes the pointer advanced by that least offset and the kernel reads relative to it, so
    kernels that differ only in where they read (the steps of a recurrence, say) are the same."""
    offsets: dict[str, set[int]] = {}
    for lf in prog.leaves():
        for x in (lf, *(g.index for g in lf.gathers)):
            buf = low.storage[x.value]
            offsets.setdefault(buf, set()).add(x.offset if x is lf and not lf.gathers else -1)
    rows = {low.storage[v] for v, o in prog.write_offsets.items() if o}  # written through a pointer of its own
    return {b: min(o) for b, o in offsets.items() if -1 not in o and min(o) > 0 and (b not in writes or b in rows)}


def _shifted(lf: Leaf, low: Lowering, shifts: dict[str, int]) -> Leaf:
    return replace(lf, offset=lf.offset - shifts[low.storage[lf.value]]) if low.storage[lf.value] in shifts else lf


def _written(b: str, prog: Program, low: Lowering) -> str:
    """The kernel's name for the pointer it writes buffer ``b`` through: ``b`` itself, or ``b__w``
    where it writes at an offset into a buffer it also reads (the reads keep the buffer's start)."""
    reads = {low.storage[v] for lf in prog.leaves() for v in lf.reads()}
    starts = {low.storage[v] for v, o in prog.write_offsets.items() if o}
    return f"{b}__w" if b in reads and b in starts else b


def _params(prog: Program, low: Lowering, writes: list[str],
            shifts: dict[str, int] | None = None) -> tuple[list[str], list[str]]:
    """Kernel parameter declarations and the matching launch arguments (``a.<buffer>``)."""
    reads = list(dict.fromkeys(low.storage[v] for lf in prog.leaves() for v in lf.reads()))
    decls, args = [], []
    starts = {low.storage[v]: o for v, o in prog.write_offsets.items() if o}
    for b in reads:
        if b in writes and b not in starts:
            continue
        decls.append(f"const {low.ctypes.get(b, 'float')}* __restrict__ {b}")
        args.append(f"a.{b}" + (f" + {shifts[b]}" if shifts and b in shifts else ""))
    for b in writes:
        c = low.ctypes.get(b, "float")
        if b in starts and b in reads:  # a row of a buffer it also reads elsewhere (a recurrence's states)
            decls.append(f"{c}* __restrict__ {_written(b, prog, low)}")
            args.append(f"a.{b} + {starts[b]}")
            continue
        decls.append(f"{c}* {b}" if b in reads else f"{c}* __restrict__ {b}")
        args.append(f"a.{b}" + (f" + {starts[b]}" if b in starts else ""))
    return decls, args


class Emitter:
    def __init__(self, low: Lowering, options: CodegenOptions, prefix: str):
        self.low, self.options, self.prefix = low, options, prefix
        self.env = environment(TEMPLATES)
        if options.block % 32 or not 32 <= options.block <= 1024:
            raise Unsupported(f"block size {options.block}: must be a multiple of 32 in [32, 1024]")
        if options.vector_width not in (1, 4):
            raise Unsupported(f"vector width {options.vector_width}: must be 1 or 4")
        self._kernels: dict[str, str] = {}  # normalised source -> the name it was emitted under

    def _dedupe(self, name: str, source: str, decls: list[str]) -> tuple[str, str]:
        """(the kernel name to launch, the source to add: empty when an identical kernel, up to
        its name and parameter names, was emitted already)."""
        key = source.replace(name, "KERNEL")
        for k, d in enumerate(decls):
            key = re.sub(rf"\b{re.escape(d.split()[-1])}\b", f"p{k}", key)
        locals_ = list(dict.fromkeys(re.findall(r"\b[tvs]_\w+", key)))  # step values, named after graph nodes
        for k, tok in enumerate(locals_):
            key = re.sub(rf"\b{re.escape(tok)}\b", f"r{k}", key)
        if key in self._kernels:
            return self._kernels[key], ""
        self._kernels[key] = name
        return name, source

    def pointwise(self, gid: int | str, prog: Program) -> _Kernel:
        low, block = self.low, self.options.block
        shape = prog.shape
        total = numel(shape)
        writes = list(dict.fromkeys(low.storage[v] for v in prog.outputs))
        shifts = _shifts(prog, low, writes)
        decls, args = _params(prog, low, writes, shifts)
        idx_t = "int" if total < 2**31 - 8 else "long long"
        leaves = prog.leaves()
        leaf_vars = {lf: f"l{i}" for i, lf in enumerate(leaves)}
        refs = {s.name: f"t_{s.name}" for s in prog.steps}
        def offset(x: Leaf) -> str:
            return _offset(x.effective_strides(shape), shape, "i", x.offset)

        def coord(axis: int) -> str:
            return _coord(shape, len(shape) + axis, "i")

        moved = {lf: _shifted(lf, low, shifts) for lf in leaves}
        # the pieces of a concatenation are read inline, where a select picks the one to read
        pieces = _Pieces({lf: _read(moved[lf], low, offset) for lf in leaves if lf.guard is not None}, coord)
        leaf_vars.update({lf: _load(moved[lf], low, offset, coord) for lf in pieces.reads})
        inner = next((d for d in reversed(range(len(shape))) if shape[d] > 1), None)

        def quad(lf: Leaf) -> str:
            """The read at ``base`` where all four elements of a float4 step read the same value (a
            per-channel parameter over NCHW rows of a multiple of 4), so it is loaded once."""
            if not lf.plain or inner is None or shape[inner] % 4 or lf.effective_strides(shape)[inner]:
                return ""
            return _read(moved[lf], low, lambda x: _offset(x.effective_strides(shape), shape, "base", x.offset))

        loads = [(leaf_vars[lf], _ctype(lf, low), low.storage[lf.value], _load(moved[lf], low, offset, coord),
                  lf.plain and moved[lf].offset == 0 and lf.effective_strides(shape) == contiguous_strides(shape)
                  and low.storage[lf.value] not in low.ctypes, quad(lf)) for lf in leaves if lf not in pieces.reads]
        steps = [(refs[s.name], _code(s.expr, leaf_vars, refs, pieces)) for s in prog.steps]
        # an output stored through strides (a slice of a growing concatenation) at its element's offset
        stores = [(_written(low.storage[v], prog, low), refs[s],
                   _offset(prog.write_strides[v][0], shape, "i", prog.write_strides[v][1]) if v in prog.write_strides
                   else "i") for v, s in prog.outputs.items()]
        # A stencil (a depthwise convolution's or a pooling's taps: one buffer read at three or more
        # offsets) runs one element a thread unless its rows are a multiple of 4 (its per-channel
        # reads then load once per float4 step): a thread's four elements put its scalar tap reads
        # 16 bytes apart across a warp, four times the L1 wavefronts. Measured on an H100:
        # KernelBench L1/82, 84, 85 (rows of 510, 510, 250) ran 1.3-1.8x faster one element a
        # thread, 112- and 512-wide rows with a batch norm 3% slower.
        values = [lf.value for lf in leaves]
        stencil = any(values.count(v) >= 3 for v in set(values))
        vec = self.options.vector_width == 4 and total % 4 == 0 and total >= 4 and not prog.write_strides and not any(
            b in low.ctypes for b in writes) and (
            not stencil or (inner is not None and shape[inner] % 4 == 0))
        name = f"{self.prefix}_g{gid}_pointwise"
        source = self.env.get_template("pointwise.cu.j2").render(
            name=name, block=block, decls=decls, idx_t=idx_t, total=total, loads=loads, steps=steps,
            stores=stores, vec=vec)
        name, source = self._dedupe(name, source, decls)
        pointers = list(dict.fromkeys([a for a in args]))
        launch = self.env.get_template("launch_pointwise.cu.j2").render(
            name=name, block=block, total=total, args=args, vec=vec, pointers=pointers)
        return _Kernel(source, launch, decls)

    def row(self, gid: int | str, prog: Program) -> _Kernel:
        low = self.low
        shape = prog.shape
        n = shape[-1]
        rows = numel(shape) // n
        if n <= 256:
            team, block = 32, self.options.block
        else:
            block = self.options.block
            while -(-n // block) > 16 and block < 1024:
                block *= 2
            team = block
        per = -(-n // team)
        if per > 64:
            raise Unsupported(f"rows of {n} elements need {per} values per thread")
        writes = list(dict.fromkeys(low.storage[v] for v in prog.outputs))
        shifts = _shifts(prog, low, writes)
        decls, args = _params(prog, low, writes, shifts)
        lead = shape[:-1]
        leaves = prog.leaves()
        loads = []
        leaf_full: dict[Leaf, str] = {}
        leaf_row: dict[Leaf, str] = {}

        def offset(x: Leaf) -> str:
            eff = x.effective_strides(shape)
            base = _offset(eff[:-1], lead, "row", x.offset)
            col = "" if eff[-1] == 0 else ("c" if eff[-1] == 1 else f"c * {eff[-1]}")
            return " + ".join(t for t in (base if base != "0" else "", col) if t) or "0"

        def coord(axis: int) -> str:
            return "c" if axis == -1 else _coord(lead, len(lead) + axis + 1, "row")

        for i, lf in enumerate(leaves):
            scalar = row_scalar_leaf(lf, shape)
            loads.append((f"l{i}", _ctype(lf, low), _load(_shifted(lf, low, shifts), low, offset, coord), scalar))
            (leaf_row if scalar else leaf_full)[lf] = f"l{i}" if scalar else f"l{i}[j]"
        kinds = {s.name: s.kind for s in prog.steps}
        refs = {s: (f"v_{s}[j]" if k == "full" else f"s_{s}") for s, k in kinds.items()}
        body = []
        for s in prog.steps:
            code = _code(s.expr, {**leaf_full, **leaf_row}, refs)
            body.append((s.kind, s.name, code, s.reduce))
        stores = [(low.storage[v], prog.step(s).name, kinds[s]) for v, s in prog.outputs.items()]
        name = f"{self.prefix}_g{gid}_row"
        source = self.env.get_template("row.cu.j2").render(
            name=name, block=block, team=team, n=n, per=per, guard=n % team != 0, decls=decls, loads=loads,
            body=body, stores=stores, rows=rows)
        name, source = self._dedupe(name, source, decls)
        launch = (f"{name}<<<{-(-rows // (block // team))}, {block}, 0, stream>>>({', '.join(args)});\n"
                  "SC_CUDA_CHECK(cudaGetLastError());")
        return _Kernel(source, launch, decls)

    def gemm(self, g: Gemm) -> str:
        return gemm_launch(g)

    def attention(self, rec: FusedAttention) -> _Kernel:
        """An attention group's one kernel (templates/kernels/attention.cu.j2): the operands' offsets
        per batch entry, and the expression the softmax takes at coordinates (batch, ci, cj) with
        the scaled product ``sv`` where it reads the scores."""
        low, shape, tile = self.low, rec.shape, rec.tile
        names = [f"b{d}" for d in range(len(shape) - 2)] + ["ci", "cj"]

        def offset(x: Leaf) -> str:
            eff = x.effective_strides(shape)
            terms = [f"{c} * {s}LL" if s != 1 else c for c, s, n in zip(names[-len(eff):], eff, shape[-len(eff):],
                                                                       strict=True) if s and n != 1]
            return " + ".join([*terms, str(x.offset)] if x.offset or not terms else terms)

        def coord(axis: int) -> str:
            return names[axis]

        leaves = [lf for lf in dict.fromkeys(rec.score.leaves())]
        texts = {lf: "sv" if lf.value == rec.scores else f"static_cast<float>({_load(lf, low, offset, coord)})"
                 for lf in leaves}
        score = _code(rec.score, texts, {})
        operands = {"q": rec.q, "k": rec.k, "v": rec.v, "o": rec.out}
        reads = list(dict.fromkeys([low.storage[x.value] for x in (rec.q, rec.k, rec.v)] + [
            low.storage[v] for lf in leaves if lf.value != rec.scores for v in lf.reads()]))
        out = low.storage[rec.out.value]
        decls = [f"const {low.ctypes.get(b, 'float')}* __restrict__ {b}" for b in reads] + [f"float* __restrict__ {out}"]
        used = set(re.findall(r"\bb\d+\b", score))
        coords = []
        if used:  # the batch coordinates the mask reads take
            coords.append("  rest = batch;")
            for d in reversed(range(len(shape) - 2)):
                coords.append(f"  const long long b{d} = rest % {shape[d]}LL; rest /= {shape[d]}LL;")
        source = self.env.get_template("kernels/attention.cu.j2").render(
            name=rec.name, params=decls, bq=tile.bq, bk=tile.bk, ty=tile.ty, tx=tile.tx, d=rec.d, dv=rec.dv,
            sq=shape[-2], sk=shape[-1], q_tiles=rec.q_tiles, alpha=c_float(rec.alpha), score=score, safe=rec.safe,
            coords="\n".join(coords),
            bases=[(f"{k}_at", {"offset": x.offset, "dims": list(reversed(x.batch))}) for k, x in operands.items()],
            **{f"{k}_ptr": low.storage[x.value] for k, x in operands.items()},
            **{f"{k}_row": x.row for k, x in operands.items()}, **{f"{k}_col": x.col for k, x in operands.items()})
        name, source = self._dedupe(rec.name, source, decls)  # the same layer again: its kernel once
        args = [f"a.{b}" for b in reads] + [f"a.{out}"]
        launch = (f"{name}<<<{rec.blocks}, {tile.ty * tile.tx}, {tile.shared_bytes(rec.d, rec.dv)}, stream>>>"
                  f"({', '.join(args)});\nSC_CUDA_CHECK(cudaGetLastError());")
        return _Kernel(source, launch, decls)
