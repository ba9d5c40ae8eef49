"""A big TF32 product on cuBLAS, its dimensions padded to multiples of 4 in scratch.

cuBLAS's tensor-core kernels ran a product whose M, N or K is not a multiple of 4 at about a third
of their rate, whether or not every matrix's rows were 16-byte aligned. Measured on an H200
(2026-11): KernelBench's L1/8, [8205 x 2949] . [2949 x 5921], in TF32 at 118 TFLOP/s (2.4 ms,
with its operands and output copied into aligned rows first: 2.8 ms), where L1/1 (4096^3) and L1/2
(2048 x 4096 x 8192) reached 343 and 386. Here such a product runs on copies padded to multiples of
4: each operand copied into scratch by one pitched ``cudaMemcpy2DAsync`` (capturable in a CUDA
graph), the padding of K zeroed (its products add nothing), the padding of M and N left as it is
(its rows and columns of the output are never copied out), and the output copied back. That reads
and writes each matrix once more: small beside a product of at least :data:`STAGE_MIN_MACS`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stitchcuda.compiler.lowering.lowered import Gemm

# Below this many multiply-adds the product takes microseconds whatever its kernel: the copies'
# launches would cost more than the faster kernel saves.
STAGE_MIN_MACS = 1 << 30


@dataclass(frozen=True)
class StagedMatrix:
    """``rows`` x ``cols`` floats, ``ld`` apart at ``buf``, ``ld_scratch`` apart in ``scratch``; the
    scratch copy has ``zero_rows`` more rows and ``zero_cols`` more columns of zeros (K's padding)."""

    scratch: str
    buf: str
    rows: int
    cols: int
    ld_scratch: int
    ld: int
    zero_rows: int = 0
    zero_cols: int = 0

    @property
    def floats(self) -> int:  # scratch it needs, rounded up to whole rows of 4 (M's or N's padding)
        return -(-(self.rows + self.zero_rows) // 4) * 4 * self.ld_scratch

    def copy(self, into_scratch: bool) -> list[str]:
        (dst, dpitch), (src, spitch) = ((self.scratch, self.ld_scratch), (self.buf, self.ld))[:: 1 if into_scratch else -1]
        lines = [f"SC_CUDA_CHECK(cudaMemcpy2DAsync(a.{dst}, {4 * dpitch}, a.{src}, {4 * spitch}, {4 * self.cols}, "
                 f"{self.rows}, cudaMemcpyDeviceToDevice, stream));"]
        if into_scratch and self.zero_cols:
            lines.append(f"SC_CUDA_CHECK(cudaMemset2DAsync(a.{self.scratch} + {self.cols}, {4 * self.ld_scratch}, 0, "
                         f"{4 * self.zero_cols}, {self.rows + self.zero_rows}, stream));")
        if into_scratch and self.zero_rows:
            lines.append(f"SC_CUDA_CHECK(cudaMemsetAsync(a.{self.scratch} + {self.rows * self.ld_scratch}, 0, "
                         f"{4 * self.zero_rows * self.ld_scratch}, stream));")
        return lines


@dataclass(frozen=True)
class Staged:
    """A product on padded copies: operands copied in before, the output copied out after."""

    m: int  # the padded dimensions the GEMM runs on
    n: int
    k: int
    a: StagedMatrix | None = None
    b: StagedMatrix | None = None
    out: StagedMatrix | None = None

    def matrices(self) -> list[StagedMatrix]:
        return [x for x in (self.a, self.b, self.out) if x is not None]

    def before(self) -> list[str]:
        return [line for x in (self.a, self.b) if x is not None for line in x.copy(True)]

    def after(self) -> list[str]:
        return self.out.copy(False) if self.out is not None else []

    def apply(self, g: Gemm) -> Gemm:
        """``g`` on the padded copies."""
        at: dict = {"m": self.m, "n": self.n, "k": self.k}
        if self.a is not None:
            at.update(a=self.a.scratch, ld_a=self.a.ld_scratch)
        if self.b is not None:
            at.update(b=self.b.scratch, ld_b=self.b.ld_scratch)
        if self.out is not None:
            at.update(out=self.out.scratch, ld_c=self.out.ld_scratch)
        return replace(g, **at)


def _aligned(n: int) -> int:
    return -(-n // 4) * 4


def _offset(buf: str) -> int:
    return int(buf.split(" + ")[1]) if " + " in buf else 0


def padded(g: Gemm) -> bool:
    """Whether ``g`` runs on padded copies in a TF32 variant: one product, big, with M, N or K not a
    multiple of 4 (rows merely unaligned: copying them in did not pay, the module's docstring)."""
    return g.batch == 1 and g.outer == 1 and g.m * g.n * g.k >= STAGE_MIN_MACS \
        and (g.m % 4 != 0 or g.n % 4 != 0 or g.k % 4 != 0)


def staging(g: Gemm, scratch: tuple[str, str, str]) -> Staged | None:
    """How ``g`` (one product, no batch), where M, N or K is not a multiple of 4, runs on copies
    padded to multiples of 4 in ``scratch`` (for A, B and the output): every matrix that holds a
    padded dimension or whose rows are unaligned; None where no dimension needs padding, the
    product is small, or it is batched."""
    if not padded(g):
        return None
    m, n, k = _aligned(g.m), _aligned(g.n), _aligned(g.k)
    zero_k = k - g.k

    def unaligned(buf: str, ld: int) -> bool:
        return ld % 4 != 0 or _offset(buf) % 4 != 0

    a_rows, a_cols = (g.k, g.m) if g.a_trans else (g.m, g.k)
    b_rows, b_cols = (g.n, g.k) if g.b_trans else (g.k, g.n)
    lda, ldb, ldc = g.ld_a or a_cols, g.ld_b or b_cols, g.ld_c or g.n
    a = b = out = None
    if unaligned(g.a, lda) or (m, k) != (g.m, g.k):
        zero = (zero_k, 0) if g.a_trans else (0, zero_k)  # K's padding: rows of A^T, columns of A
        a = StagedMatrix(scratch[0], g.a, a_rows, a_cols, _aligned(a_cols + zero[1]), lda, *zero)
    if unaligned(g.b, ldb) or (n, k) != (g.n, g.k):
        zero = (0, zero_k) if g.b_trans else (zero_k, 0)
        b = StagedMatrix(scratch[1], g.b, b_rows, b_cols, _aligned(b_cols + zero[1]), ldb, *zero)
    if unaligned(g.out, ldc) or (m, n) != (g.m, g.n):
        out = StagedMatrix(scratch[2], g.out, g.m, g.n, n, ldc)
    return Staged(m, n, k, a, b, out)  # a padded dimension: one of them at least
