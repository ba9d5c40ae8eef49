"""Attention as one kernel (``templates/kernels/attention.cu.j2``, ``CodegenOptions.fused_attention``):
Q.K^T, the elementwise work between it and the softmax (a scale, an additive or boolean mask, a
position bias), the softmax over the keys and P.V, with flash attention's online softmax, in fp32
FMAs. The scores never reach memory and the three launches of the GEMM path (two batched SGEMMs
around a row kernel) are one. Q, K and V are read through their strides, so a head's rows come
straight out of a QKV product; the output is written in the layout of the views after P.V.

Whether one kernel beats cuBLAS's products depends on the shapes and the GPU (a short sequence's
three launches cost more than its arithmetic; a long one's products run near cuBLAS's peak), so
the first step verifies the program with it beside the one without, and keeps the faster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stitchcuda.compiler.capture.graph import Node
from stitchcuda.compiler.ir.expr import IDENTITY, VIEWS, Expr, Unsupported, leaf, numel, view_expr
from stitchcuda.compiler.ir.formulas import is_pointwise, pointwise_expr
from stitchcuda.compiler.ir.group import FusionGroup
from stitchcuda.compiler.ir.ops import RESHAPES
from stitchcuda.compiler.lowering.lower_context import LowerContext
from stitchcuda.compiler.lowering.lowered import Lowered, to_ident
from stitchcuda.compiler.lowering.regroup import common_split, onto

SOFTMAXES = {"aten.softmax": False, "aten._safe_softmax": True}  # op -> a row of -inf gives 0 (not NaN)


@dataclass(frozen=True)
class AttentionTile:
    """A block's work: ``bq`` query rows, keys ``bk`` at a time, ``ty`` x ``tx`` threads."""

    bq: int
    bk: int
    ty: int
    tx: int

    def shared_bytes(self, d: int, dv: int) -> int:
        """Q's rows, a tile of keys (rows padded by one float), a tile of values, its probabilities."""
        return 4 * (self.bq * (d + 1) + self.bk * (d + 1) + self.bk * dv + self.bq * (self.bk + 1))


# the widest head (of Q.K's depth and V's width) each tile takes; every one fits 48 KiB of shared
# memory, the most a launch may ask without an opt-in
TILES = ((32, AttentionTile(64, 64, 16, 16)), (64, AttentionTile(32, 32, 16, 8)), (128, AttentionTile(32, 16, 16, 8)))


@dataclass(frozen=True)
class AttentionOperand:
    """One matrix per batch entry of buffer ``value``: element ``(b, r, c)`` at ``offset``, plus the
    flat batch index ``b`` unravelled row-major over ``batch`` (size, stride) pairs, ``r * row``
    and ``c * col``."""

    value: str
    offset: int
    batch: tuple[tuple[int, int], ...]
    row: int
    col: int


@dataclass
class FusedAttention:
    """What the kernel computes: ``out = softmax(score) . v`` per batch entry, ``score`` the
    elementwise expression (over the scores' shape) of the value ``scores`` = ``alpha * q . k^T``."""

    name: str
    q: AttentionOperand  # [Sq, D]
    k: AttentionOperand  # [Sk, D]
    v: AttentionOperand  # [Sk, DV]
    out: AttentionOperand  # [Sq, DV]
    shape: tuple[int, ...]  # the scores' rows and keys after the batch dims ``score`` is read over
    d: int
    dv: int
    alpha: float
    scores: str
    score: Expr
    safe: bool
    tile: AttentionTile

    @property
    def q_tiles(self) -> int:
        return -(-self.shape[-2] // self.tile.bq)

    @property
    def blocks(self) -> int:
        return numel(self.shape[:-2]) * self.q_tiles


def _operand(e: Expr, batch: tuple[int, ...], where: str, swap: bool = False) -> AttentionOperand:
    """``e`` (a read, its last two dims swapped where ``swap``) as an operand over ``batch``: a plain
    read right-aligned to it (stride 0 where it broadcasts), a read regrouping batch dims (repeated
    key and value heads) unravelled over its own."""
    lf = e.leaf if e.op == "leaf" else None
    if lf is None or not lf.plain:
        raise Unsupported(f"{where}: an operand computed inside the group")
    shape, strides, outer = list(lf.shape), list(lf.strides), list(e.shape)
    if swap:
        for x in (shape, strides, outer):
            x[-2], x[-1] = x[-1], x[-2]
    if shape == outer:
        lead = len(batch) - (len(outer) - 2)
        if lead < 0:
            raise Unsupported(f"{where}: an operand of more batch dims than its product")
        pairs = []
        for d, size in enumerate(batch):
            k = d - lead
            if k >= 0 and shape[k] not in (1, size):
                raise Unsupported(f"{where}: an operand of {shape} over batch {list(batch)}")
            pairs.append((size, strides[k] if k >= 0 and shape[k] != 1 else 0))
    elif tuple(outer[:-2]) == batch and numel(shape[:-2]) == numel(batch) and shape[-2:] == outer[-2:]:
        pairs = list(zip(shape[:-2], strides[:-2], strict=True))
    else:
        raise Unsupported(f"{where}: an operand read as {shape} for {outer}")
    return AttentionOperand(lf.value, lf.offset, tuple(pairs), strides[-2], strides[-1])


def _broadcast(e: Expr, shape: tuple[int, ...]) -> Expr:
    """``e`` read over the whole of ``shape`` (each read's broadcast dims at stride 0), so that
    ``regroup.onto`` can re-read it over a finer split of the batch dims."""
    if e.op == "const":
        return e
    if e.op == "leaf":
        lf = e.leaf
        if lf is None or not lf.plain:
            raise Unsupported("a gathered or guarded read over regrouped scores")
        return leaf(lf.value, shape, lf.effective_strides(shape), lf.offset)
    if e.op == "ref":
        raise Unsupported("a step value over regrouped scores")
    return Expr(e.op, tuple(_broadcast(a, shape) for a in e.args), shape=tuple(shape))


def _score(cx: LowerContext, env: dict[str, Expr], qk: Node, middle: list[Node]) -> tuple[Expr, tuple[int, ...], bool]:
    """The expression the softmax takes, with the scaled Q.K^T a read of ``qk``'s value; the shape it
    is read over (the scores' rows and keys after batch dims that every reshape of the scores on the
    way merges from: a shifted-window mask is added through [B * W, H, N, N] -> [B, W, H, N, N] and
    back); and whether the softmax is the safe one. Only elementwise work and views lie between."""
    s_shape = cx.shape(qk.name)
    *work, last = middle
    frame: tuple[int, ...] | None = s_shape[:-2]
    for n in work:  # the reshapes of values as large as the scores, of the same rows and keys
        out = cx.shape(n.name)
        if n.op in VIEWS and out[-2:] == s_shape[-2:] and numel(out) == numel(s_shape) and frame is not None:
            split = common_split([frame, out[:-2]])
            frame = None if split is None else tuple(d for d in split if d != 1)
    if frame is None:
        raise Unsupported(f"{qk.name}: the scores are reshaped to batch dims no one shape merges from")
    frame = (*frame, *s_shape[-2:])
    derived = {qk.name: onto(leaf(qk.name, s_shape), frame)}  # over ``frame``
    for n in work:
        where = f"{n.name} ({n.op})"
        arg = cx.arg(env, where)
        reads = [a[1:] for a in n.args if isinstance(a, str) and a.startswith("%")]
        if not any(r in derived for r in reads):  # a mask's preparation: over its own shape
            if n.op in VIEWS and n.op not in IDENTITY:
                env[n.name] = view_expr(n, arg(n.args[0]))
            elif is_pointwise(n.op) or n.op in IDENTITY:
                env[n.name] = pointwise_expr(n, arg)
            else:
                raise Unsupported(f"{where} between Q.K^T and the softmax")
            continue
        out = cx.shape(n.name)
        if n.op in VIEWS and n.op not in IDENTITY:
            if out[-2:] != s_shape[-2:] or numel(out) != numel(s_shape) or n.op not in RESHAPES:
                raise Unsupported(f"{where}: a view of the scores that moves their rows or keys")
            derived[n.name] = derived[n.args[0][1:]]  # the same elements, read over ``frame`` already
            continue
        if not (is_pointwise(n.op) or n.op in IDENTITY) or out[-2:] != s_shape[-2:] or numel(out) != numel(s_shape):
            raise Unsupported(f"{where} between Q.K^T and the softmax")

        def over_frame(a: object, where: str = where, out: tuple[int, ...] = out, arg: Any = arg) -> Expr:
            name = a[1:] if isinstance(a, str) and a.startswith("%") else None
            if name in derived:
                return derived[name]
            return onto(_broadcast(arg(a), out), frame)

        derived[n.name] = pointwise_expr(n, over_frame)
    if last.op not in SOFTMAXES or len(last.args) > 2 and last.args[2] is not None or last.kwargs.get("dtype"):
        raise Unsupported(f"{last.name} ({last.op}): not a float32 softmax")
    if last.args[1] % len(s_shape) != len(s_shape) - 1:
        raise Unsupported(f"{last.name}: a softmax over dim {last.args[1]}, not the keys")
    source = last.args[0][1:] if isinstance(last.args[0], str) else ""
    if source not in derived:
        raise Unsupported(f"{last.name}: a softmax of something other than the scores")
    score = derived[source]
    for lf in score.leaves():
        lf.effective_strides(frame)  # raises where a read does not broadcast over the frame
    return score, frame, SOFTMAXES[last.op]


def fused_attention(cx: LowerContext, g: FusionGroup, qk: Node, pv: Node, middle: list[Node], env: dict[str, Expr],
                    alpha: float, final: str, strides: tuple[int, ...]) -> Lowered:
    """The attention group as one kernel; raises Unsupported where it cannot be (the GEMM path then
    lowers it): a head wider than 128, an operand computed inside the group, work between Q.K^T
    and the softmax that is not elementwise, a softmax not over the keys."""
    if not middle or pv.args[0] != f"%{middle[-1].name}":
        raise Unsupported(f"{pv.name}: its left operand is not the softmax")
    s_shape = cx.shape(qk.name)
    batch = s_shape[:-2]
    arg = cx.arg(env, f"{qk.name} ({qk.op})")
    q_read = arg(qk.args[0])
    q = _operand(q_read, batch, f"{qk.name}: Q")
    k = _operand(arg(qk.args[1]), batch, f"{qk.name}: K^T", swap=True)
    v = _operand(cx.arg(env, f"{pv.name} ({pv.op})")(pv.args[1]), batch, f"{pv.name}: V")
    pv_shape = cx.shape(pv.name)
    d, dv = q_read.shape[-1], pv_shape[-1]
    if tuple(pv_shape[:-2]) != batch or pv_shape[-2] != s_shape[-2] or min(s_shape[-2:]) == 0 or d == 0:
        raise Unsupported(f"{pv.name}: P.V of {list(pv_shape)} after scores of {list(s_shape)}")
    tile = next((t for width, t in TILES if max(d, dv) <= width), None)
    if tile is None:
        raise Unsupported(f"a head of {max(d, dv)} (one kernel takes up to {TILES[-1][0]})")
    score, frame, safe = _score(cx, env, qk, middle)
    cx.buffer(final)
    out = AttentionOperand(final, 0, tuple(zip(batch, strides[:-2], strict=True)), strides[-2], strides[-1])
    rec = FusedAttention(f"k_{to_ident(qk.name)}_attention", q, k, v, out, frame, d, dv, alpha, qk.name, score, safe, tile)
    if rec.blocks >= 2 ** 31:
        raise Unsupported(f"{rec.blocks} blocks")
    work = ", ".join(n.op.removeprefix("aten.") for n in middle)
    return Lowered(g, "attention", attention=rec, describe=f"Q.K^T -> {work} -> P.V as one kernel (online softmax) "
                                                           f"into {final}")
