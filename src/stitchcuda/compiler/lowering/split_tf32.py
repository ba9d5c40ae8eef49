"""3xTF32 by split operands on the library's TF32 tensor-core GEMMs (cuBLASLt, wgmma on Hopper).

Each operand x is split into two exactly representable TF32 values, ``big = tf32(x)`` and
``small = tf32(x - big)``; the product A.B is then ``A_big.B_big + A_big.B_small + A_small.B_big``,
which misses only ``A_small.B_small`` (about 2^-22 relative). One kernel writes both halves of an
operand next to each other along K (cuBLAS's TF32 path rounds fp32 operands to nearest, so the
halves must be exact TF32 themselves), so the two cross products are ONE TF32 GEMM of depth 2K,
``[A_big | A_small] . [B_small ; B_big]``, and the big product a second one that adds it as C
(beta = 1) and applies the bias and activation in cuBLASLt's epilogue. The small terms are summed
in their own accumulator first: adding them into the big ones inside one GEMM loses bits in
Hopper's tensor-core accumulation (measured on an H100, 2026-11: max error relative to the
largest output 3e-5 against 8e-5, fp32 SGEMM 4e-6, plain TF32 3e-4 at 4096^3; 2.6x SGEMM's speed).

CUTLASS's own 3xTF32 (:mod:`cutlass_gemm`) runs on the older mma.sync path at about 1.4x SGEMM
with SGEMM's accuracy; the variant search measures both and the tolerance decides.

Convolutions split along their reduction's channels in the same way, in one cuDNN TF32 call over
three times the input channels: ``[x_big | x_small | x_big] * [w_big | w_big | w_small]``
(:func:`plan_conv_split`). A convolution's reduction (channels x filter taps, at most a few
thousand deep) is far shallower than a GEMM's, so the three products share one accumulator."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from stitchcuda.compiler.lowering.cost import TABLES, conv_paths, gemm_paths
from stitchcuda.compiler.lowering.cuda_files import cuda_file
from stitchcuda.compiler.lowering.lowered import Gemm
from stitchcuda.gpu_specs import DEFAULT, NominalPeaks

KERNEL = cuda_file("split_tf32.cuh")


@dataclass(frozen=True)
class SplitOperand:
    """One operand as stored ([batch,] rows x cols, unit column stride) and where its halves go.

    The halves are always written in the layout cuBLAS's TF32 kernels run fastest on (measured on
    an H100: row-major A and row-major B, as torch's plain ``a @ b``; a transposed A or a linear's
    [N, K] weight as B cost up to 1.8x on the same GEMM), transposing where the source is stored
    the other way: A as [M, 2K] = [A_big | A_small], B as [2K, N] = [B_small ; B_big] (rows padded to 16 bytes)."""

    src: str  # buffer identifier (+ offset)
    dst: str  # the scratch buffer both halves go to
    rows: int
    cols: int
    batch: int  # matrices to split along the (inner) batch: 1 where the operand is shared by every batch
    s_batch: int
    s_row: int
    transpose: bool  # the scratch holds the stored matrix transposed
    d_row: int  # the scratch's row stride
    off_big: int
    off_small: int
    size: int  # floats per matrix in the scratch (all its copies)
    off_big2: int = -1  # a second copy of the big half (the one-GEMM split of a shallow product), -1: none
    packed: bool = False  # a weight split once and kept (packing.py): not split in the forward
    outer: int = 1  # a second batch dimension (attention's batch outside its heads), written as one
    s_outer: int = 0

    @property
    def matrices(self) -> int:
        return self.batch * self.outer

    @property
    def d_batch(self) -> int:
        return self.size if self.matrices > 1 else 0

    @property
    def scratch(self) -> int:  # floats of scratch it needs
        return self.size * self.matrices

    def launch(self) -> str:
        if self.transpose:
            grid = f"dim3({(self.cols + 31) // 32}, {(self.rows + 31) // 32}, {self.matrices})"
            return (f"sc_split_tf32_t<<<{grid}, dim3(32, 8), 0, stream>>>(a.{self.src}, a.{self.dst}, {self.rows}, "
                    f"{self.cols}, {self.s_batch}LL, {self.s_row}LL, {self.d_batch}LL, {self.d_row}LL, "
                    f"{self.off_big}LL, {self.off_small}LL, {self.off_big2}LL, {self.batch}LL, {self.s_outer}LL);")
        total = self.matrices * self.rows * self.cols
        blocks = min((total + 255) // 256, 1 << 20)
        scalar = (f"sc_split_tf32<<<{blocks}, 256, 0, stream>>>(a.{self.src}, a.{self.dst}, {self.rows}LL, "
                  f"{self.cols}LL, {total}LL, {self.s_batch}LL, {self.s_row}LL, {self.d_batch}LL, {self.d_row}LL, "
                  f"{self.off_big}LL, {self.off_small}LL, {self.off_big2}LL, {self.batch}LL, {self.s_outer}LL);")
        steps = (self.cols, self.s_row, self.s_batch, self.s_outer, self.d_row, self.d_batch, self.off_big,
                 self.off_small, max(self.off_big2, 0), _offset(self.dst))
        if any(x % 4 for x in steps):
            return scalar
        cols4, rows_total = self.cols // 4, self.matrices * self.rows
        tx = min(256, -(-cols4 // 32) * 32)
        ty = 256 // tx
        grid = f"dim3({-(-cols4 // tx)}, {min(-(-rows_total // ty), 65535)})"
        vector = (f"sc_split_tf32_v4<<<{grid}, dim3({tx}, {ty}), 0, stream>>>(a.{self.src}, a.{self.dst}, "
                  f"{rows_total}LL, {self.rows}LL, {cols4}, {self.s_batch}LL, {self.s_row}LL, {self.d_batch}LL, "
                  f"{self.d_row}LL, {self.off_big}LL, {self.off_small}LL, {self.off_big2}LL, {self.batch}LL, "
                  f"{self.s_outer}LL);")
        # the source's own alignment is known only at run time (a view can start anywhere)
        return (f"if (reinterpret_cast<uintptr_t>(a.{self.src}) % 16 == 0) {{ {vector} }} "
                f"else {{ {scalar} }}")


@dataclass(frozen=True)
class SplitPlan:
    a: SplitOperand
    b: SplitOperand
    cross: Gemm | None  # [A_big | A_small] . [B_small ; B_big], depth 2K, into the output
    main: Gemm  # A_big . B_big + the output (C), with the epilogue; alone: all three products, depth 3K


# Up to this depth the three products run as ONE GEMM of depth 3K, [A_big | A_small | A_big] .
# [B_big ; B_big ; B_small]: a second GEMM would read and write the whole output again, which is
# most of a shallow product's time (M = N = 32768, K = 64: 4.3 GB of output), and so short a
# reduction loses nothing to Hopper's accumulation.
ONE_GEMM_MAX_K = 256
MIN_K = 16
SMALL_K = 128  # between ONE_GEMM_MAX_K and this, the two-GEMM form's reductions are too short


# Past this depth the big product's own accumulation on Hopper's tensor cores (fewer bits than
# fp32's FMA, see the module's docstring) costs more than strict's 1e-4 allows: 3e-5 of the largest
# output at K = 4096, growing with K. Deeper products take CUTLASS's 3xTF32 (mma.sync, SGEMM's
# accuracy) or SGEMM.
MAX_K = 8192


def splittable(g: Gemm) -> bool:
    """Whether ``g`` can run split: batch dimensions that fold into one, deep enough but not too
    deep (:data:`MAX_K`), within the transposing split's grid (65535 blocks of 32 rows, 65535
    matrices). Whether it pays is the cost model's question (:func:`worth_splitting`)."""
    deep_enough = (g.k >= SMALL_K and g.k <= MAX_K) or MIN_K <= g.k <= ONE_GEMM_MAX_K
    matrices = g.outer * g.batch
    return (not g.no_split and batches_fold(g) and deep_enough and matrices <= 65535
            and max(g.m, g.n, g.k) <= 32 * 65535)


def worth_splitting(g: Gemm, table: NominalPeaks = TABLES[DEFAULT]) -> bool:
    """Whether ``g`` can run split and the cost model gives the split less time than fp32 SGEMM
    (measured on an H100: N = 32 and the 32 x 512 x 8000 steps of a GRU decoder ran slower split)."""
    if not splittable(g):
        return False
    paths = gemm_paths(g, table, ["cublas", "split"])
    return paths["split"] < paths["cublas"]


def batches_fold(g: Gemm) -> bool:
    """Whether ``g``'s two batch dimensions (if two) become one in its split: the split writes each
    operand's matrices densely, so an operand must vary along both or neither, and the output
    must already be dense across them (attention's scores are; its P.V output, heads inside
    tokens, is not)."""
    if g.outer == 1:
        return True
    return all(bool(inner) == bool(outer) for inner, outer in ((g.stride_a, g.outer_a), (g.stride_b, g.outer_b))) \
        and g.outer_c == g.batch * g.stride_c


def one_batch(g: Gemm) -> Gemm:
    """The split GEMMs' batch: the two dimensions as one (see :func:`batches_fold`)."""
    return replace(g, batch=g.outer * g.batch, outer=1, outer_a=0, outer_b=0, outer_c=0)


def plan_split(g: Gemm, scratch_a: str, scratch_b: str) -> SplitPlan:
    """The split of ``g`` (batch strided, two batch dimensions made one) into its cuBLASLt GEMMs:
    two, or one for a shallow product."""
    n, k = g.n, g.k
    if k <= ONE_GEMM_MAX_K:
        return _plan_one_gemm(g, scratch_a, scratch_b)
    # Rows padded to 16 bytes and the big halves first (A_big at column 0, B_big at an aligned
    # row): every pointer and leading dimension the two GEMMs see is 16-byte aligned, as
    # cuBLASLt's fast TF32 kernels ask (L1/8's 8205 x 2949 x 5921 still runs slowly split: its
    # dimensions, not multiples of 4, cost two thirds of the rate: padded_gemm.py, cost.py).
    lda, ldb = _aligned(2 * k), _aligned(n)
    a, b = _operands(g, scratch_a, scratch_b, lda, ldb, (0, k, -1), (k * ldb, 0, -1), copies=2)
    g = one_batch(g)
    dense = {"a_trans": False, "b_trans": False, "ld_a": lda, "ld_b": ldb, "stride_a": a.d_batch,
             "stride_b": b.d_batch}
    # [A_big | A_small] . [B_small ; B_big] = A_big.B_small + A_small.B_big
    cross = replace(g, k=2 * k, a=a.dst, b=b.dst, epilogue="", bias="", **dense)
    main = replace(g, a=_at(a.dst, a.off_big), b=_at(b.dst, b.off_big), **dense)
    return SplitPlan(a, b, cross, main)


def _plan_one_gemm(g: Gemm, scratch_a: str, scratch_b: str) -> SplitPlan:
    """A shallow product's split: A as [M, 3K] = [A_big | A_small | A_big], B as [3K, N] =
    [B_big ; B_big ; B_small], one GEMM of depth 3K with the epilogue."""
    k = g.k
    lda, ldb = _aligned(3 * k), _aligned(g.n)
    a, b = _operands(g, scratch_a, scratch_b, lda, ldb, (0, k, 2 * k), (0, 2 * k * ldb, k * ldb), copies=3)
    g = one_batch(g)
    main = replace(g, k=3 * k, a=a.dst, b=b.dst, a_trans=False, b_trans=False, ld_a=lda, ld_b=ldb,
                   stride_a=a.d_batch, stride_b=b.d_batch)
    return SplitPlan(a, b, None, main)


def _operands(g: Gemm, scratch_a: str, scratch_b: str, lda: int, ldb: int, a_at: tuple[int, int, int],
              b_at: tuple[int, int, int], copies: int) -> tuple[SplitOperand, SplitOperand]:
    """Both operands' splits: A into [M, lda] rows, B into [copies * K, ldb]; ``*_at`` are the
    (big, small, second big or -1) offsets of the copies."""
    m, n, k = g.m, g.n, g.k
    a = SplitOperand(g.a, scratch_a, *((k, m) if g.a_trans else (m, k)), batch=g.batch if g.stride_a else 1,
                     s_batch=g.stride_a, s_row=g.ld_a or (m if g.a_trans else k), transpose=g.a_trans,
                     d_row=lda, off_big=a_at[0], off_small=a_at[1], size=m * lda, off_big2=a_at[2],
                     outer=g.outer if g.outer_a else 1, s_outer=g.outer_a)
    b = SplitOperand(g.b, scratch_b, *((n, k) if g.b_trans else (k, n)), batch=g.batch if g.stride_b else 1,
                     s_batch=g.stride_b, s_row=g.ld_b or (k if g.b_trans else n), transpose=g.b_trans,
                     d_row=ldb, off_big=b_at[0], off_small=b_at[1], size=copies * k * ldb, off_big2=b_at[2],
                     outer=g.outer if g.outer_b else 1, s_outer=g.outer_b)
    return a, b


def _offset(buf: str) -> int:
    return int(buf.split(" + ")[1]) if " + " in buf else 0


def _aligned(floats: int) -> int:
    return -(-floats // 4) * 4


def _at(buf: str, offset: int) -> str:
    return buf + (f" + {offset}" if offset else "")


@dataclass(frozen=True)
class ConvSplit:
    """A convolution as 3xTF32 by split channels, all channels-last (cuDNN's TF32 kernels run on
    NHWC; on NCHW they transform through a workspace larger than the program's limit): the input
    as [n, HW, 3C] = [x_big | x_small | x_big] per group, the weight as [w_big | w_big | w_small] in
    cuDNN's NHWC filter layout, the output [n, PQ, K] in scratch, transposed back into ``out``."""

    x: str  # the input (for a transposed convolution, the gradient it runs backward-data on)
    weight: str
    x3: str  # scratch: the input's halves
    w3: str  # scratch: the weight's halves
    y: str  # scratch: cuDNN's channels-last output
    n: int
    c: int  # input channels (the reduction's, all groups)
    cg: int  # per group
    hw: int  # input positions
    k: int  # output channels
    pq: int  # output positions
    w_dims: tuple[int, int, int, int]  # the weight as a contiguous [d0, d1, d2, d3]
    w_strides: tuple[int, int, int, int, int]  # where each source index, and the copy j, go in w3
    w_packed: bool = False  # the weight's halves made once and kept (packing.py), not in the forward
    copies: int = 3  # input channels cuDNN sees per channel: [big | small | big]
    data_type: str = "CUDNN_DATA_FLOAT"

    @property
    def x_scratch(self) -> int:
        return 3 * self.n * self.c * self.hw

    @property
    def w_scratch(self) -> int:
        return 3 * math.prod(self.w_dims)

    @property
    def y_scratch(self) -> int:
        return self.n * self.k * self.pq

    def split_launches(self) -> list[str]:
        grid = f"dim3({(self.hw + 31) // 32}, {(self.c + 31) // 32}, {self.n})"
        return [f"sc_split3_nhwc<<<{grid}, dim3(32, 8), 0, stream>>>(a.{self.x}, a.{self.x3}, {self.c}, {self.cg}, "
                f"{self.hw}LL, 0b010);", *([] if self.w_packed else [self.weight_launch()])]

    def weight_launch(self) -> str:
        total = math.prod(self.w_dims)
        d, t = self.w_dims, self.w_strides
        return (f"sc_split3_weight<<<{min((total + 255) // 256, 1 << 20)}, 256, 0, stream>>>(a.{self.weight}, "
                f"a.{self.w3}, {d[1]}LL, {d[2]}LL, {d[3]}LL, {t[0]}LL, {t[1]}LL, {t[2]}LL, {t[3]}LL, {t[4]}LL, "
                f"{total}LL, 0b100);")

    def to_nchw(self, out: str) -> str:
        grid = f"dim3({(self.pq + 31) // 32}, {(self.k + 31) // 32}, {self.n})"
        return f"sc_nhwc_to_nchw<<<{grid}, dim3(32, 8), 0, stream>>>(a.{self.y}, a.{out}, {self.k}, {self.pq}LL);"


MIN_CONV_CHANNELS = 16  # per group: depthwise and 3-channel stems stay fp32 (measured 1.3-3x slower split)
# The split convolution's three products share ONE accumulator over 3 x its reduction (channels x
# taps), and Hopper's tensor cores add into it with fewer bits than fp32's FMA: past this depth the
# small halves' products are lost again. Measured on an H200: torchvision's VGG-16 (512-channel
# 3x3 convolutions, a depth of 4608, no batch norm between them) missed strict's 1e-4 split.
MAX_CONV_DEPTH = 2304


def splittable_conv(c: Any) -> bool:
    """Whether the convolution ``c`` (a :class:`lowered.Conv`) can run split: enough channels a
    group, and cuDNN's int-counted descriptors and the kernels' grids fit three times its channels."""
    per_group = c.c // c.groups
    depth = per_group * math.prod(c.kernel)
    x = c.c * math.prod(c.size)
    fits = 3 * max(x, c.k * depth) <= 2 ** 31 - 1 and c.n <= 65535 and c.c <= 32 * 65535
    return c.chunks == 1 and per_group >= MIN_CONV_CHANNELS and depth <= MAX_CONV_DEPTH and fits


def worth_splitting_conv(c: Any, table: NominalPeaks = TABLES[DEFAULT]) -> bool:
    """Whether ``c`` can run split and the cost model gives it less time than cuDNN's fp32 kernels.
    Measured on an H100: 7x on a diffusion block's 3x3 convolutions, 2.1x on a stride-2 transposed
    one, even on 1 -> 128 channel-heavy outputs (L1/63), slower on 64-channel 3x3
    (conv_residual_block) and 1x1 convolutions of large images."""
    if not splittable_conv(c):
        return False
    paths = conv_paths(c, table, ["cublas", "split"])
    return paths["split"] < paths["cublas"]


def plan_conv_split(c: Any, scratch_x: str, scratch_w: str, scratch_y: str) -> ConvSplit:
    """The channel split of ``c`` (a :class:`lowered.Conv`): its input (for a transposed one, the
    gradient it runs backward-data on) and weight, channels-last; cuDNN then runs it with
    ``3 * c.c`` input channels on TF32 tensor cores."""
    g, cg, taps = c.groups, c.c // c.groups, math.prod(c.kernel)
    if c.transposed:  # weight [c_in, c_out/g, *taps] as [g, cg, kg, taps]; NHWC filter [3 c_in, *taps, kg]
        kg = c.k // g
        dims = (g, cg, kg, taps)
        strides = (3 * cg * taps * kg, taps * kg, 1, kg, cg * taps * kg)
    else:  # weight [c_out, cg, *taps] as [1, c_out, cg, taps]; NHWC filter [c_out, *taps, 3 cg]
        dims = (1, c.k, cg, taps)
        strides = (0, taps * 3 * cg, 1, 3 * cg, cg)
    return ConvSplit(c.x, c.weight, scratch_x, scratch_w, scratch_y, n=c.n, c=c.c, cg=cg, hw=math.prod(c.size),
                     k=c.k, pq=math.prod(c.out_size), w_dims=dims, w_strides=strides)
