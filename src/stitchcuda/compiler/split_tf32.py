"""3xTF32 by split operands on the library's TF32 tensor-core GEMMs (cuBLASLt, wgmma on Hopper).

Each operand x is split into two exactly representable TF32 values, ``big = tf32(x)`` and
``small = tf32(x - big)``; the product A.B is then ``A_big.B_big + A_big.B_small + A_small.B_big``,
which misses only ``A_small.B_small`` (about 2^-22 relative). One kernel writes both halves of an
operand next to each other along K (cuBLAS's TF32 path rounds fp32 operands to nearest, so the
halves must be exact TF32 themselves), so the two cross products are ONE TF32 GEMM of depth 2K,
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

// One operand's two TF32 halves (see split_tf32.py): the tensor cores read both unchanged, so
// only small.small is lost. Element (b, r, c) of the stored matrix goes to b*d_batch + r*d_row + c.
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

// The same, transposed through a 32x32 tile: element (b, r, c) goes to b*d_batch + c*d_row + r,
// both reads and writes coalesced.
__global__ void sc_split_tf32_t(const float* __restrict__ src, float* __restrict__ dst, int rows, int cols,
                                long long s_batch, long long s_row, long long d_batch, long long d_row,
                                long long off_big, long long off_small) {
  __shared__ float tile[32][33];
  const float* s = src + blockIdx.z * s_batch;
  float* d = dst + blockIdx.z * d_batch;
  const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = s[r * s_row + c];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float x = tile[threadIdx.x][j];
      const float big = sc_tf32_round(x);
      const float small = isfinite(x) ? sc_tf32_round(x - big) : 0.0f;
      const long long o = (long long)c * d_row + r;
      d[o + off_big] = big;
      d[o + off_small] = small;
    }
  }
}
"""


@dataclass(frozen=True)
class SplitOperand:
    """One operand as stored ([batch,] rows x cols, unit column stride) and where its halves go.

    The halves are always written in the layout cuBLAS's TF32 kernels run fastest on (measured on
    an H100: row-major A and row-major B, as torch's plain ``a @ b``; a transposed A or a linear's
    [N, K] weight as B cost up to 1.8x on the same GEMM), transposing where the source is stored
    the other way: A as [M, 2K] = [A_small | A_big], B as [2K, N] = [B_big ; B_small]."""

    src: str  # buffer identifier (+ offset)
    dst: str  # the scratch buffer both halves go to
    rows: int
    cols: int
    batch: int  # matrices to split: 1 where the operand is shared by every batch
    s_batch: int
    s_row: int
    transpose: bool  # the scratch holds the stored matrix transposed
    d_row: int  # the scratch's row stride
    off_big: int
    off_small: int
    size: int  # floats per matrix in the scratch (both halves)

    @property
    def d_batch(self) -> int:
        return self.size if self.batch > 1 else 0

    @property
    def scratch(self) -> int:  # floats of scratch it needs
        return self.size * self.batch

    def launch(self) -> str:
        if self.transpose:
            grid = f"dim3({(self.cols + 31) // 32}, {(self.rows + 31) // 32}, {self.batch})"
            return (f"sc_split_tf32_t<<<{grid}, dim3(32, 8), 0, stream>>>(a.{self.src}, a.{self.dst}, {self.rows}, "
                    f"{self.cols}, {self.s_batch}LL, {self.s_row}LL, {self.d_batch}LL, {self.d_row}LL, "
                    f"{self.off_big}LL, {self.off_small}LL);")
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


# Below these the split's two extra passes and second GEMM cost more than the tensor cores save
# (measured on an H100: K = 64, N = 32 and the 32 x 512 x 8000 steps of a GRU decoder all ran
# slower split than in fp32 SGEMM); such products stay on cuBLAS in the split variant.
MIN_SIDE = 128
MIN_MACS = 1 << 28


def worth_splitting(g: Gemm) -> bool:
    """Whether ``g`` is large enough, on every side, for split 3xTF32 to pay (and within the
    transposing split's grid: 65535 blocks of 32 rows, 65535 matrices)."""
    return (g.outer == 1 and min(g.m, g.n, g.k) >= MIN_SIDE and g.batch * g.m * g.n * g.k >= MIN_MACS
            and g.batch <= 65535 and max(g.m, g.n, g.k) <= 32 * 65535)


def plan_split(g: Gemm, scratch_a: str, scratch_b: str) -> SplitPlan:
    """The split of ``g`` (batch strided, no outer loop) into its two cuBLASLt GEMMs."""
    m, n, k = g.m, g.n, g.k
    a = SplitOperand(g.a, scratch_a, *((k, m) if g.a_trans else (m, k)), batch=g.batch if g.stride_a else 1,
                     s_batch=g.stride_a, s_row=g.ld_a or (m if g.a_trans else k), transpose=g.a_trans,
                     d_row=2 * k, off_big=k, off_small=0, size=2 * m * k)
    b = SplitOperand(g.b, scratch_b, *((n, k) if g.b_trans else (k, n)), batch=g.batch if g.stride_b else 1,
                     s_batch=g.stride_b, s_row=g.ld_b or (k if g.b_trans else n), transpose=g.b_trans,
                     d_row=n, off_big=0, off_small=k * n, size=2 * k * n)
    dense = {"a_trans": False, "b_trans": False, "ld_a": 2 * k, "ld_b": n, "stride_a": a.d_batch,
             "stride_b": b.d_batch}
    cross = replace(g, k=2 * k, a=a.dst, b=b.dst, epilogue="", bias="", **dense)
    main = replace(g, a=_at(a.dst, a.off_big), b=_at(b.dst, b.off_big), **dense)
    return SplitPlan(a, b, cross, main)


def _at(buf: str, offset: int) -> str:
    return buf + (f" + {offset}" if offset else "")
