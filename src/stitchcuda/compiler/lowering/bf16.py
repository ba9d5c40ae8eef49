"""bf16 operands with fp32 accumulation on tensor cores, for GEMMs and convolutions (``paper`` only).

Each operand is rounded once to bf16 (8 significant bits: a relative error up to 2^-9) and the
tensor cores accumulate its products in fp32, so a product's error is about 2^-9 of its output's
scale: far outside strict's 1e-4, usually inside ``paper``'s 1e-2 for one layer, and compounding
over a deep network. The Verifier judges each program as it judges any other; the variant search
tries this one after TF32 (``agents/offline.variants``).

- GEMM: one kernel writes each operand as bf16 in the layout the split uses (row-major A [M, K],
  row-major B [K, N], rows padded to 16 bytes); a weight's copy is made once and kept
  (:mod:`packing`). Then ONE cuBLASLt GEMM, bf16 A and B, fp32 C and D, ``CUBLAS_COMPUTE_32F``,
  the bias and activation in its epilogue: the output is fp32, as the program's.
- Convolution: the input as channels-last bf16, the filter in cuDNN's NHWC layout as bf16 (made
  once where it is a parameter), cuDNN's bf16 tensor-core kernels with an fp32 compute type, then
  the output back to fp32 NCHW. cuDNN's descriptors have no bf16-in, fp32-out configuration, so
  the output is rounded to bf16 once more (another 2^-9) before it is widened.

Half the bytes of fp32 and twice TF32's tensor-core rate: where a product or convolution is
compute-bound the cost model (:mod:`cost`, path ``bf16``) gives it this path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from stitchcuda.compiler.lowering.cuda_files import cuda_file
from stitchcuda.compiler.lowering.lowered import Gemm
from stitchcuda.compiler.lowering.split_tf32 import SplitPlan, batches_fold, one_batch

KERNEL = cuda_file("bf16_convert.cuh")


def _bf16(buf: str) -> str:
    return f"reinterpret_cast<__nv_bfloat16*>(a.{buf})"


def _floats(elements: int) -> int:
    """Scratch floats for ``elements`` bf16 values, padded to 16 bytes."""
    return -(-elements // 8) * 4


@dataclass(frozen=True)
class Bf16Operand:
    """One GEMM operand as stored ([batch,] rows x cols, unit column stride) and its bf16 copy:
    row-major, transposed where the source is stored the other way (as :class:`SplitOperand`)."""

    src: str
    dst: str  # a scratch or pack buffer (floats; the copy is bf16, from its start)
    rows: int
    cols: int
    batch: int  # matrices along the (inner) batch: 1 where every batch shares the operand
    s_batch: int
    s_row: int
    transpose: bool
    d_row: int  # the copy's row stride, in bf16 elements
    size: int  # bf16 elements a matrix
    packed: bool = False  # a weight converted once and kept (packing.py)
    outer: int = 1
    s_outer: int = 0

    @property
    def matrices(self) -> int:
        return self.batch * self.outer

    @property
    def d_batch(self) -> int:
        return self.size if self.matrices > 1 else 0

    @property
    def scratch(self) -> int:  # floats
        return _floats(self.size * self.matrices)

    def launch(self) -> str:
        if self.transpose:
            grid = f"dim3({(self.cols + 31) // 32}, {(self.rows + 31) // 32}, {self.matrices})"
            return (f"sc_to_bf16_t<<<{grid}, dim3(32, 8), 0, stream>>>(a.{self.src}, {_bf16(self.dst)}, {self.rows}, "
                    f"{self.cols}, {self.s_batch}LL, {self.s_row}LL, {self.d_batch}LL, {self.d_row}LL, "
                    f"{self.batch}LL, {self.s_outer}LL);")
        total = self.matrices * self.rows * self.cols
        return (f"sc_to_bf16<<<{min((total + 255) // 256, 1 << 20)}, 256, 0, stream>>>(a.{self.src}, "
                f"{_bf16(self.dst)}, {self.rows}LL, {self.cols}LL, {total}LL, {self.s_batch}LL, {self.s_row}LL, "
                f"{self.d_batch}LL, {self.d_row}LL, {self.batch}LL, {self.s_outer}LL);")


def bf16_able(g: Gemm) -> bool:
    """Whether ``g`` can run on bf16 copies: batch dimensions that fold into one (as the split's),
    within the transposing kernel's grid."""
    return batches_fold(g) and g.outer * g.batch <= 65535 and max(g.m, g.n, g.k) <= 32 * 65535


def plan_bf16(g: Gemm, scratch_a: str, scratch_b: str) -> SplitPlan:
    """``g`` on bf16 copies of its operands: A as [M, lda], B as [K, ldb], one cuBLASLt GEMM (no
    cross product: :attr:`SplitPlan.cross` is None) that keeps ``g``'s output, bias and epilogue."""
    m, n, k = g.m, g.n, g.k
    lda, ldb = -(-k // 8) * 8, -(-n // 8) * 8
    a = Bf16Operand(g.a, scratch_a, *((k, m) if g.a_trans else (m, k)), batch=g.batch if g.stride_a else 1,
                    s_batch=g.stride_a, s_row=g.ld_a or (m if g.a_trans else k), transpose=g.a_trans, d_row=lda,
                    size=m * lda, outer=g.outer if g.outer_a else 1, s_outer=g.outer_a)
    b = Bf16Operand(g.b, scratch_b, *((n, k) if g.b_trans else (k, n)), batch=g.batch if g.stride_b else 1,
                    s_batch=g.stride_b, s_row=g.ld_b or (k if g.b_trans else n), transpose=g.b_trans, d_row=ldb,
                    size=k * ldb, outer=g.outer if g.outer_b else 1, s_outer=g.outer_b)
    main = replace(one_batch(g), a=a.dst, b=b.dst, a_trans=False, b_trans=False, ld_a=lda, ld_b=ldb,
                   stride_a=a.d_batch, stride_b=b.d_batch, bf16=True)
    return SplitPlan(a, b, None, main)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ConvBf16:
    """A convolution on bf16 copies, all channels-last: the input [n, HW, C], the filter in cuDNN's
    NHWC layout, cuDNN's bf16 output [n, PQ, K] in scratch, widened back into ``out`` (NCHW fp32).
    The same members as :class:`split_tf32.ConvSplit`, with one copy of the channels."""

    x: str
    weight: str
    x3: str  # scratch: the input's bf16 copy
    w3: str  # scratch or pack: the filter's
    y: str  # scratch: cuDNN's bf16 output
    n: int
    c: int
    hw: int
    k: int
    pq: int
    w_dims: tuple[int, int, int, int]
    w_strides: tuple[int, int, int, int]
    w_packed: bool = False
    copies: int = 1  # input channels cuDNN sees per channel (ConvSplit's: 3)
    data_type: str = "CUDNN_DATA_BFLOAT16"

    @property
    def x_scratch(self) -> int:
        return _floats(self.n * self.c * self.hw)

    @property
    def w_scratch(self) -> int:
        return _floats(math.prod(self.w_dims))

    @property
    def y_scratch(self) -> int:
        return _floats(self.n * self.k * self.pq)

    def split_launches(self) -> list[str]:
        grid = f"dim3({(self.hw + 31) // 32}, {(self.c + 31) // 32}, {self.n})"
        return [f"sc_nhwc_bf16<<<{grid}, dim3(32, 8), 0, stream>>>(a.{self.x}, {_bf16(self.x3)}, {self.c}, "
                f"{self.hw}LL);", *([] if self.w_packed else [self.weight_launch()])]

    def weight_launch(self) -> str:
        total = math.prod(self.w_dims)
        d, t = self.w_dims, self.w_strides
        return (f"sc_weight_bf16<<<{min((total + 255) // 256, 1 << 20)}, 256, 0, stream>>>(a.{self.weight}, "
                f"{_bf16(self.w3)}, {d[1]}LL, {d[2]}LL, {d[3]}LL, {t[0]}LL, {t[1]}LL, {t[2]}LL, {t[3]}LL, {total}LL);")

    def to_nchw(self, out: str) -> str:
        grid = f"dim3({(self.pq + 31) // 32}, {(self.k + 31) // 32}, {self.n})"
        return (f"sc_nhwc_bf16_to_nchw<<<{grid}, dim3(32, 8), 0, stream>>>({_bf16(self.y)}, a.{out}, {self.k}, "
                f"{self.pq}LL);")


def bf16_conv_able(c: Any) -> bool:
    """Whether the convolution ``c`` (a :class:`lowered.Conv`) can run on bf16 copies: one call,
    channels a multiple of 8 a group (cuDNN's bf16 NHWC kernels read 16-byte vectors of channels;
    a 3-channel stem stays fp32), and the kernels' grids fit."""
    per_group = c.c // c.groups
    kg = c.k // c.groups
    return (c.chunks == 1 and per_group % 8 == 0 and kg % 8 == 0 and c.n <= 65535 and c.c <= 32 * 65535
            and c.k <= 32 * 65535)


def plan_conv_bf16(c: Any, scratch_x: str, scratch_w: str, scratch_y: str) -> ConvBf16:
    """The bf16 copies of ``c`` (a :class:`lowered.Conv`); for a transposed one, its input is the
    gradient cuDNN runs backward-data on, as in :func:`split_tf32.plan_conv_split`."""
    g, cg, taps = c.groups, c.c // c.groups, math.prod(c.kernel)
    if c.transposed:  # weight [c_in, c_out/g, *taps] as [g, cg, kg, taps]; NHWC filter [c_in, *taps, kg]
        kg = c.k // g
        dims = (g, cg, kg, taps)
        strides = (cg * taps * kg, taps * kg, 1, kg)
    else:  # weight [c_out, cg, *taps] as [1, c_out, cg, taps]; NHWC filter [c_out, *taps, cg]
        dims = (1, c.k, cg, taps)
        strides = (0, taps * cg, 1, cg)
    return ConvBf16(c.x, c.weight, scratch_x, scratch_w, scratch_y, n=c.n, c=c.c, hw=math.prod(c.size), k=c.k,
                    pq=math.prod(c.out_size), w_dims=dims, w_strides=strides)
