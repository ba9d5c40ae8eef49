"""Matrices copied through 16-byte rows around a big product (``compiler/lowering/aligned_rows.py``):
which matrices are staged, where the copies go, that the emitted program copies in the right order
(the copies and both GEMMs emulated on the CPU), and (GPU) that the product comes out in place."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.lowering.aligned_rows import STAGE_MIN_MACS, StagedMatrix, staging
from stitchcuda.compiler.lowering.lowered import Gemm
from stitchcuda.compiler.lowering.split_tf32 import plan_split

SCRATCH = ("xa", "xb", "xc")


def _copy(text: str, flat: dict[str, np.ndarray]) -> None:
    """What one emitted cudaMemcpy2DAsync does, on flat float buffers."""
    args = [x.strip() for x in text.split("cudaMemcpy2DAsync(")[1].split(")")[0].split(",")]
    (dst, dpitch, src, spitch, width, rows) = args[:6]

    def at(name: str) -> tuple[np.ndarray, int]:
        base, *off = name.removeprefix("a.").split(" + ")
        return flat[base], int(off[0]) if off else 0

    (d, do), (s, so) = at(dst), at(src)
    dp, sp, w = int(dpitch) // 4, int(spitch) // 4, int(width) // 4
    for r in range(int(rows)):
        d[do + r * dp: do + r * dp + w] = s[so + r * sp: so + r * sp + w]


@pytest.mark.parametrize("batch", [1, 3])
def test_an_output_with_unaligned_rows_is_written_to_aligned_scratch_and_copied_out(batch):
    g = Gemm(batch, 8205, 5921, 2949, "x", "y", a_trans=False, b_trans=False, out="o",
             stride_a=8205 * 2949 if batch > 1 else 0, stride_c=8205 * 5921 if batch > 1 else 0)
    staged = staging(plan_split(g, "xa", "xb").main, SCRATCH, operands=False)
    assert staged.a is staged.b is None and staged.out == StagedMatrix("xc", "o", batch * 8205, 5921, 5924, 5921)
    moved = staged.apply(g)
    assert (moved.out, moved.ld_c, moved.stride_c) == ("xc", 5924, 8205 * 5924 if batch > 1 else 0)
    assert staged.after() == ["SC_CUDA_CHECK(cudaMemcpy2DAsync(a.o, 23684, a.xc, 23696, 23684, "
                              f"{batch * 8205}, cudaMemcpyDeviceToDevice, stream));"]


def test_unaligned_operands_are_copied_into_aligned_rows_first():
    g = Gemm(1, 8205, 5921, 2949, "x", "w", a_trans=False, b_trans=True, out="o")  # B as a linear's [N, K] weight
    staged = staging(g, SCRATCH)
    assert staged.a == StagedMatrix("xa", "x", 8205, 2949, 2952, 2949)
    assert staged.b == StagedMatrix("xb", "w", 5921, 2949, 2952, 2949)
    moved = staged.apply(g)
    assert (moved.a, moved.ld_a, moved.b, moved.ld_b, moved.b_trans) == ("xa", 2952, "xb", 2952, True)
    assert staged.before()[0].startswith("SC_CUDA_CHECK(cudaMemcpy2DAsync(a.xa, 11808, a.x, 11796, 11796, 8205,")


def test_what_is_left_as_it_is():
    assert staging(Gemm(1, 4096, 4096, 300, "x", "y", False, False, out="o"), SCRATCH) is None  # all aligned
    assert staging(Gemm(1, 4096, 4096, 300, "x", "y", False, False, out="o + 3"), SCRATCH).out is not None
    small = Gemm(1, 64, 255, 300, "x", "y", False, False, out="o")
    assert STAGE_MIN_MACS > 64 * 255 * 300 and staging(small, SCRATCH) is None  # microseconds either way
    # output matrices that are not one dense run of rows: one 2-d copy cannot place them (B still can)
    sparse = Gemm(2, 4096, 4095, 300, "x", "y", False, False, out="o", stride_a=4096 * 300, stride_c=4096 * 4096)
    assert staging(sparse, SCRATCH).out is None and staging(sparse, SCRATCH, operands=False) is None
    shared_b = Gemm(4, 4096, 4095, 300, "x", "y", False, False, out="o", stride_a=4096 * 300, stride_c=4096 * 4095)
    staged = staging(shared_b, SCRATCH)
    assert staged.b.rows == 300 and staged.apply(shared_b).stride_b == 0  # one B for every matrix, staged once
    assert staged.out.rows == 4 * 4096 and staged.apply(shared_b).stride_c == 4096 * 4096


ODD_MATMUL_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(2050, 1030), torch.randn(1030, 2049)]


def get_init_inputs():
    return []
'''


def _odd_matmul_program(tmp_path, options: CodegenOptions):
    from stitchcuda.compiler import compile_task
    from stitchcuda.task import resolve_tasks

    path = tmp_path / "odd_matmul.py"
    path.write_text(ODD_MATMUL_TASK)
    (task,) = resolve_tasks(str(path))
    compiled = compile_task(task)
    return generate(task, compiled.graph, compiled.groups, options)


def test_the_split_program_copies_its_output_after_both_gemms(tmp_path):
    src = cuda_source(_odd_matmul_program(tmp_path, CodegenOptions(split_tf32=True)))
    body = src[src.index("cublasLtMatmul(P.lt, P.lt_desc0"):]
    assert body.index("P.lt_desc1") < body.index("cudaMemcpy2DAsync(a.o_") < body.index("return")
    assert "CUDA_R_32F, 2049, 2050, 2052)" in src  # D's layout: rows of 2052 floats in scratch


def test_a_tf32_program_stages_all_three_and_computes_the_product(tmp_path):
    """The TF32 program's launches replayed on the CPU: both operands copied in, the SGEMM on the
    aligned copies, the output copied out: the product, every column in place."""
    src = cuda_source(_odd_matmul_program(tmp_path, CodegenOptions(tf32=True)))
    lines = [x.strip() for x in src.splitlines() if "cudaMemcpy2DAsync(" in x or "cublasSgemm(" in x]
    assert [("copy" if "Memcpy" in x else "gemm") for x in lines] == ["copy", "copy", "gemm", "copy"]
    assert "8208, 8196, 2050," in lines[-1]  # the output's copy: 2050 rows of 2049 floats out of 2052-float rows
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2050, 1030), dtype=np.float32), rng.standard_normal((1030, 2049), dtype=np.float32)
    gemm = lines[2].split("cublasSgemm(")[1].split(")")[0].split(",")

    def source_of(copy: str) -> str:
        return copy.split(",")[2].strip().removeprefix("a.")

    flat = {source_of(lines[0]): a.ravel().copy(), source_of(lines[1]): b.ravel().copy()}
    for name in ("x_split_a", "x_split_b", "x_split_c", "o_matmul"):
        flat[name] = np.full(2052 * 2050, np.nan, np.float32)
    for line in lines[:2]:
        _copy(line, flat)
    # cublasSgemm(blas, opB, opA, n, m, k, alpha, B, ldb, A, lda, beta, C, ldc): row-major C = A.B
    _, _, _, n, m, k, _, pb, ldb, pa, lda, _, pc, ldc = [x.strip() for x in gemm]
    n, m, k, ldb, lda, ldc = map(int, (n, m, k, ldb, lda, ldc))
    A = np.lib.stride_tricks.as_strided(flat[pa.removeprefix("a.")], (m, k), (lda * 4, 4))
    B = np.lib.stride_tricks.as_strided(flat[pb.removeprefix("a.")], (k, n), (ldb * 4, 4))
    C = flat[pc.removeprefix("a.")]
    for r in range(m):
        C[r * ldc: r * ldc + n] = (A[r].astype(np.float64) @ B).astype(np.float32)
    _copy(lines[3], flat)
    out_name = lines[3].split("cudaMemcpy2DAsync(a.")[1].split(",")[0]
    got = flat[out_name][: 2050 * 2049].reshape(2050, 2049)
    assert np.allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("options", [CodegenOptions(split_tf32=True), CodegenOptions(tf32=True)],
                         ids=["split", "tf32"])
def test_staged_programs_give_the_product_on_the_gpu(tmp_path, options):
    """[2050 x 1030] . [1030 x 2049], split (output staged) and TF32 (all three staged), built and
    run: within each arithmetic's accuracy of the float64 product, every column in place."""
    import torch

    program = _odd_matmul_program(tmp_path, options)
    assert "cudaMemcpy2DAsync(" in program
    (tmp_path / "program.py").write_text(program)
    spec = importlib.util.spec_from_file_location(f"odd_matmul_{id(options)}", tmp_path / "program.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a, b = torch.randn(2050, 1030, device="cuda"), torch.randn(1030, 2049, device="cuda")
    with torch.no_grad():
        got = module.ModelNew().cuda()(a, b)
    exact = a.double() @ b.double()
    error = ((got.double() - exact).abs().max() / exact.abs().max()).item()
    assert error < (2e-6 if options.split_tf32 else 2e-3)


@pytest.mark.nvcc
def test_staged_programs_compile_for_sm90(tmp_path):
    from tests.test_offline_codegen import _compile_together

    _compile_together([cuda_source(_odd_matmul_program(tmp_path, o))
                       for o in (CodegenOptions(split_tf32=True), CodegenOptions(tf32=True))], tmp_path)
