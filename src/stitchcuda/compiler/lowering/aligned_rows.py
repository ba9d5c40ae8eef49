"""Matrices copied through rows of 16 bytes around a big product on tensor cores.

cuBLAS's and cuBLASLt's Hopper kernels (TMA loads and stores, wgmma) need every matrix's rows to
start 16 bytes apart, the output's included; with one of them unaligned the heuristics fall back
to Ampere's kernels at about a third of the rate. Measured on an H200 (2026-11): KernelBench's
L1/8, [8205 x 2949] . [2949 x 5921], ran its 3xTF32 split at 36 TFLOP/s of fp32 work with only
A and B padded (the split writes its halves in aligned rows), below eager's SGEMM at 44; its
plain TF32 ran at eager TF32's 118. Here an unaligned operand is copied into aligned rows of
scratch first, and an unaligned output is written to scratch and copied out afterwards, each by
one ``cudaMemcpy2DAsync`` (a pitched copy, capturable in a CUDA graph): one more read and write of
that matrix, small beside a product of at least :data:`STAGE_MIN_MACS`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from stitchcuda.compiler.lowering.lowered import Gemm

# Below this many multiply-adds the product takes microseconds whatever its kernel: a copy's
# launch would cost more than the faster kernel saves.
STAGE_MIN_MACS = 1 << 30


@dataclass(frozen=True)
class StagedMatrix:
    """``rows`` rows of ``cols`` floats, ``ld`` apart at ``buf``, and ``ld_scratch`` apart in ``scratch``."""

    scratch: str
    buf: str
    rows: int  # every matrix's rows, the batch folded in
    cols: int
    ld_scratch: int
    ld: int

    @property
    def floats(self) -> int:  # scratch it needs
        return self.rows * self.ld_scratch

    def copy(self, into_scratch: bool) -> str:
        (dst, dpitch), (src, spitch) = ((self.scratch, self.ld_scratch), (self.buf, self.ld))[:: 1 if into_scratch else -1]
        return (f"SC_CUDA_CHECK(cudaMemcpy2DAsync(a.{dst}, {4 * dpitch}, a.{src}, {4 * spitch}, {4 * self.cols}, "
                f"{self.rows}, cudaMemcpyDeviceToDevice, stream));")


@dataclass(frozen=True)
class Staged:
    """What of a product goes through aligned scratch: operands copied in before, the output copied out after."""

    a: StagedMatrix | None = None
    b: StagedMatrix | None = None
    out: StagedMatrix | None = None

    def matrices(self) -> list[StagedMatrix]:
        return [x for x in (self.a, self.b, self.out) if x is not None]

    def before(self) -> list[str]:
        return [x.copy(True) for x in (self.a, self.b) if x is not None]

    def after(self) -> list[str]:
        return [self.out.copy(False)] if self.out is not None else []

    def apply(self, g: Gemm) -> Gemm:
        """``g`` reading and writing the scratch copies."""
        at: dict = {}
        for side, staged, stride in (("a", self.a, g.stride_a), ("b", self.b, g.stride_b), ("c", self.out, g.stride_c)):
            if staged is not None:
                rows = staged.rows // g.batch if stride else staged.rows
                at.update({("out" if side == "c" else side): staged.scratch, f"ld_{side}": staged.ld_scratch,
                           f"stride_{side}": rows * staged.ld_scratch if stride else 0})
        return replace(g, **at)


def _aligned(floats: int) -> int:
    return -(-floats // 4) * 4


def _offset(buf: str) -> int:
    return int(buf.split(" + ")[1]) if " + " in buf else 0


def _matrix(buf: str, rows: int, cols: int, ld: int, batch: int, stride: int, scratch: str) -> StagedMatrix | None:
    """``buf``'s matrix (``batch`` of them ``stride`` apart, 0: one shared) through ``scratch``,
    where its rows are unaligned and its matrices one dense run of rows."""
    if ld % 4 == 0 and _offset(buf) % 4 == 0:
        return None
    if stride and batch > 1 and stride != rows * ld:
        return None
    return StagedMatrix(scratch, buf, rows * (batch if stride else 1), cols, _aligned(cols), ld)


def staging(g: Gemm, scratch: tuple[str, str, str], operands: bool = True) -> Staged | None:
    """What of ``g`` to stage through ``scratch`` (for A, B and the output): every unaligned matrix
    (only the output where not ``operands``); None where all are aligned, the product is small, or
    it spans two batch dimensions."""
    if g.outer > 1 or g.batch * g.m * g.n * g.k < STAGE_MIN_MACS:
        return None
    a_rows, a_cols = (g.k, g.m) if g.a_trans else (g.m, g.k)
    b_rows, b_cols = (g.n, g.k) if g.b_trans else (g.k, g.n)
    found = Staged(
        a=_matrix(g.a, a_rows, a_cols, g.ld_a or a_cols, g.batch, g.stride_a, scratch[0]) if operands else None,
        b=_matrix(g.b, b_rows, b_cols, g.ld_b or b_cols, g.batch, g.stride_b, scratch[1]) if operands else None,
        out=_matrix(g.out, g.m, g.n, g.ld_c or g.n, g.batch, g.stride_c or (g.m * (g.ld_c or g.n)), scratch[2]))
    return found if found.matrices() else None
