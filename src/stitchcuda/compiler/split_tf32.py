"""3xTF32 by split operands on the library's TF32 tensor-core GEMMs (cuBLASLt, wgmma on Hopper).

Each operand x is split into two exactly representable TF32 values, ``big = tf32(x)`` and
``small = tf32(x - big)``; the product A.B is then ``A_big.B_big + A_big.B_small + A_small.B_big``,
which misses only ``A_small.B_small`` (about 2^-22 relative). One kernel writes both halves of an
operand next to each other along K, so the two cross products are ONE TF32 GEMM of depth 2K,
``[A_small | A_big] . [B_big ; B_small]``, and the big product a second one that adds it as C
(beta = 1) and applies the bias and activation in cuBLASLt's epilogue. The small terms are summed
in their own accumulator first: adding them into the big ones inside one GEMM loses bits in
Hopper's tensor-core accumulation (measured on an H100, 2026-11: max error relative to the
largest output 3e-5 against 8e-5, fp32 SGEMM 4e-6, plain TF32 3e-4 at 4096^3; 2.6x SGEMM's speed).

CUTLASS's own 3xTF32 (:mod:`cutlass_gemm`) runs on the older mma.sync path at about 1.4x SGEMM
with SGEMM's accuracy; the variant search measures both and the tolerance decides."""

from __future__ import annotations

from dataclasses import dataclass, replace

from stitchcuda.compiler.lowered import Gemm

KERNEL = r"""
// Round to the nearest TF32 (10-bit mantissa), leaving inf and NaN as they are.
__device__ __forceinline__ float sc_tf32_round(float x) {
  unsigned int u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return __uint_as_float(u);
}

// One operand's two TF32 halves, written next to each other along K (see split_tf32.py): the
// tensor cores read both unchanged, so only small.small is lost.
__global__ void sc_split_tf32(const float* __restrict__ src, float* __restrict__ dst, long long rows,
                              long long cols, long long total, long long s_batch, long long s_row,
                              long long d_batch, long long d_row, long long off_big, long long off_small) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long c = i % cols, r = (i / cols) % rows, b = i / (cols * rows);
    const float x = src[b * s_batch + r * s_row + c];
    const float big = sc_tf32_round(x);
    const float small = isfinite(x) ? sc_tf32_round(x - big) : 0.0f;
    const long long d = b * d_batch + r * d_row + c;
    dst[d + off_big] = big;
    dst[d + off_small] = small;
  }
}
"""


@dataclass(frozen=True)
class SplitOperand:
    """How one operand is stored ([batch,] rows x cols, unit column stride) and where its split goes."""

    src: str  # buffer identifier (+ offset)
    dst: str  # the scratch buffer both halves go to
    rows: int
    cols: int
    batch: int  # matrices to split: 1 where the operand is shared by every batch
    s_batch: int
    s_row: int
    k_is_cols: bool  # K runs along the stored rows: the halves sit side by side; else one above the other
    small_first: bool  # A's halves are [small | big], B's [big ; small]: the depth-2K GEMM pairs them crosswise

    @property
    def d_row(self) -> int:
        return 2 * self.cols if self.k_is_cols else self.cols

    @property
    def d_batch(self) -> int:
        return 2 * self.rows * self.cols if self.batch > 1 else 0

    @property
    def second(self) -> int:  # offset of the second half
        return self.cols if self.k_is_cols else self.rows * self.cols

    @property
    def off_big(self) -> int:
        return self.second if self.small_first else 0

    @property
    def off_small(self) -> int:
        return 0 if self.small_first else self.second

    @property
    def scratch(self) -> int:  # floats of scratch it needs
        return 2 * self.rows * self.cols * self.batch

    def launch(self) -> str:
        total = self.batch * self.rows * self.cols
        blocks = min((total + 255) // 256, 1 << 20)
        return (f"sc_split_tf32<<<{blocks}, 256, 0, stream>>>(a.{self.src}, a.{self.dst}, {self.rows}LL, "
                f"{self.cols}LL, {total}LL, {self.s_batch}LL, {self.s_row}LL, {self.d_batch}LL, {self.d_row}LL, "
                f"{self.off_big}LL, {self.off_small}LL);")


@dataclass(frozen=True)
class SplitPlan:
    a: SplitOperand
    b: SplitOperand
    cross: Gemm  # [A_small | A_big] . [B_big ; B_small], depth 2K, into the output
    main: Gemm  # A_big . B_big + the output (C), with the epilogue


def plan_split(g: Gemm, scratch_a: str, scratch_b: str) -> SplitPlan:
    """The split of ``g`` (batch strided, no outer loop) into its two cuBLASLt GEMMs."""
    a = SplitOperand(g.a, scratch_a, *((g.k, g.m) if g.a_trans else (g.m, g.k)),
                     batch=g.batch if g.stride_a else 1, s_batch=g.stride_a,
                     s_row=g.ld_a or (g.m if g.a_trans else g.k), k_is_cols=not g.a_trans, small_first=True)
    b = SplitOperand(g.b, scratch_b, *((g.n, g.k) if g.b_trans else (g.k, g.n)),
                     batch=g.batch if g.stride_b else 1, s_batch=g.stride_b,
                     s_row=g.ld_b or (g.k if g.b_trans else g.n), k_is_cols=g.b_trans, small_first=False)
    cross = replace(g, k=2 * g.k, a=a.dst, b=b.dst, ld_a=a.d_row, ld_b=b.d_row, stride_a=a.d_batch,
                    stride_b=b.d_batch, epilogue="", bias="")
    main = replace(g, a=_at(a.dst, a.off_big), b=_at(b.dst, b.off_big), ld_a=a.d_row, ld_b=b.d_row,
                   stride_a=a.d_batch, stride_b=b.d_batch)
    return SplitPlan(a, b, cross, main)


def _at(buf: str, offset: int) -> str:
    return buf + (f" + {offset}" if offset else "")
