"""A big TF32 product on copies padded to multiples of 4 (``compiler/lowering/padded_gemm.py``):
which matrices are copied, where the copies and zeros go, that the emitted program computes the
product (its copies, memsets and SGEMM replayed on the CPU), and (GPU) that it does so there."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.lowering.lowered import Gemm
from stitchcuda.compiler.lowering.padded_gemm import STAGE_MIN_MACS, StagedMatrix, staging

SCRATCH = ("xa", "xb", "xc")


def _run(text: str, flat: dict[str, np.ndarray]) -> None:
    """What one emitted cudaMemcpy2DAsync, cudaMemset2DAsync or cudaMemsetAsync does, on flat float buffers."""
    call = text.split("(")[1]
    args = [x.strip() for x in text.split(call + "(")[1].split(")")[0].split(",")]

    def at(name: str) -> tuple[np.ndarray, int]:
        base, *off = name.removeprefix("a.").split(" + ")
        return flat[base], int(off[0]) if off else 0

    if call == "cudaMemsetAsync":
        (d, do), count = at(args[0]), int(args[2]) // 4
        d[do: do + count] = 0
        return
    if call == "cudaMemset2DAsync":
        (d, do), pitch, width, rows = at(args[0]), int(args[1]) // 4, int(args[3]) // 4, int(args[4])
        for r in range(rows):
            d[do + r * pitch: do + r * pitch + width] = 0
        return
    (d, do), dp, (s, so), sp, w, rows = at(args[0]), int(args[1]) // 4, at(args[2]), int(args[3]) // 4, \
        int(args[4]) // 4, int(args[5])
    for r in range(rows):
        d[do + r * dp: do + r * dp + w] = s[so + r * sp: so + r * sp + w]


def test_an_odd_product_runs_on_copies_padded_to_multiples_of_4():
    g = Gemm(1, 8205, 5921, 2949, "x", "w", a_trans=False, b_trans=True, out="o")  # B as a linear's [N, K] weight
    staged = staging(g, SCRATCH)
    assert (staged.m, staged.n, staged.k) == (8208, 5924, 2952)
    assert staged.a == StagedMatrix("xa", "x", 8205, 2949, 2952, 2949, zero_rows=0, zero_cols=3)  # K's padding zeroed
    assert staged.b == StagedMatrix("xb", "w", 5921, 2949, 2952, 2949, zero_rows=0, zero_cols=3)
    assert staged.out == StagedMatrix("xc", "o", 8205, 5921, 5924, 5921)  # M's and N's padding never copied out
    assert staged.a.floats == 8208 * 2952 and staged.out.floats == 8208 * 5924
    moved = staged.apply(g)
    assert (moved.m, moved.n, moved.k, moved.a, moved.ld_a, moved.b, moved.ld_b, moved.out, moved.ld_c) == \
        (8208, 5924, 2952, "xa", 2952, "xb", 2952, "xc", 5924)
    assert staged.before() == [
        "SC_CUDA_CHECK(cudaMemcpy2DAsync(a.xa, 11808, a.x, 11796, 11796, 8205, cudaMemcpyDeviceToDevice, stream));",
        "SC_CUDA_CHECK(cudaMemset2DAsync(a.xa + 2949, 11808, 0, 12, 8205, stream));",
        "SC_CUDA_CHECK(cudaMemcpy2DAsync(a.xb, 11808, a.w, 11796, 11796, 5921, cudaMemcpyDeviceToDevice, stream));",
        "SC_CUDA_CHECK(cudaMemset2DAsync(a.xb + 2949, 11808, 0, 12, 5921, stream));"]
    assert staged.after() == [
        "SC_CUDA_CHECK(cudaMemcpy2DAsync(a.o, 23684, a.xc, 23696, 23684, 8205, cudaMemcpyDeviceToDevice, stream));"]
    # A stored transposed ([K, M]) and B row-major ([K, N]): K's padding is rows of zeros
    t = staging(Gemm(1, 8204, 5920, 2949, "x", "w", a_trans=True, b_trans=False, out="o"), SCRATCH)
    assert (t.a.zero_rows, t.a.zero_cols, t.b.zero_rows, t.b.zero_cols, t.out) == (3, 0, 3, 0, None)
    assert t.before()[1] == "SC_CUDA_CHECK(cudaMemsetAsync(a.xa + 24193596, 0, 98448, stream));"  # 2949 rows of 8204


def test_what_is_left_as_it_is():
    assert staging(Gemm(1, 4096, 4096, 300, "x", "y", False, False, out="o"), SCRATCH) is None  # all aligned
    # dimensions of 4: rows at an unaligned offset are left (copying them in did not pay on L1/8)
    assert staging(Gemm(1, 4096, 4096, 300, "x", "y", False, False, out="o + 3"), SCRATCH) is None
    only_m = staging(Gemm(1, 4095, 4096, 300, "x", "y", False, False, out="o"), SCRATCH)
    assert only_m.b is None and only_m.a.zero_cols == 0 and (only_m.m, only_m.n, only_m.k) == (4096, 4096, 300)
    small = Gemm(1, 64, 255, 300, "x", "y", False, False, out="o")
    assert STAGE_MIN_MACS > 64 * 255 * 300 and staging(small, SCRATCH) is None  # microseconds either way
    batched = Gemm(2, 4096, 4095, 300, "x", "y", False, False, out="o", stride_a=4096 * 300, stride_c=4096 * 4095)
    assert staging(batched, SCRATCH) is None


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


def test_a_tf32_program_pads_the_product_and_computes_it(tmp_path):
    """The TF32 program's launches replayed on the CPU (the scratch starting as NaN): both operands
    copied in and K's padding zeroed, the SGEMM on the padded copies, the output copied out: the
    product, every column in place."""
    src = cuda_source(_odd_matmul_program(tmp_path, CodegenOptions(tf32=True)))
    lines = [x.strip() for x in src.splitlines() if "cudaMem" in x or "cublasSgemm(" in x]
    kinds = [x.split("(")[1] if "SC_CUDA" in x else "gemm" for x in lines]
    assert kinds == ["cudaMemcpy2DAsync", "cudaMemset2DAsync", "cudaMemcpy2DAsync", "cudaMemsetAsync", "gemm",
                     "cudaMemcpy2DAsync"]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2050, 1030), dtype=np.float32), rng.standard_normal((1030, 2049), dtype=np.float32)

    def source_of(copy: str) -> str:
        return copy.split(",")[2].strip().removeprefix("a.")

    flat = {source_of(lines[0]): a.ravel().copy(), source_of(lines[2]): b.ravel().copy()}
    for name in ("x_split_a", "x_split_b", "x_split_c", "o_matmul"):
        flat[name] = np.full(2052 * 2052, np.nan, np.float32)
    for line in lines[:4]:
        _run(line, flat)
    # cublasSgemm(blas, opB, opA, n, m, k, alpha, B, ldb, A, lda, beta, C, ldc): row-major C = A.B
    gemm = lines[4].split("cublasSgemm(")[1].split(")")[0].split(",")
    _, _, _, n, m, k, _, pb, ldb, pa, lda, _, pc, ldc = [x.strip() for x in gemm]
    n, m, k, ldb, lda, ldc = map(int, (n, m, k, ldb, lda, ldc))
    assert (m, n, k) == (2052, 2052, 1032)
    A = np.lib.stride_tricks.as_strided(flat[pa.removeprefix("a.")], (m, k), (lda * 4, 4))
    B = np.lib.stride_tricks.as_strided(flat[pb.removeprefix("a.")], (k, n), (ldb * 4, 4))
    C = flat[pc.removeprefix("a.")]
    with np.errstate(invalid="ignore"):
        for r in range(m):
            C[r * ldc: r * ldc + n] = (A[r].astype(np.float64) @ B).astype(np.float32)
    _run(lines[5], flat)
    got = flat[lines[5].split("cudaMemcpy2DAsync(a.")[1].split(",")[0]][: 2050 * 2049].reshape(2050, 2049)
    assert np.allclose(got, a.astype(np.float64) @ b, rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_a_padded_tf32_product_on_the_gpu(tmp_path):
    """[2050 x 1030] . [1030 x 2049] in TF32 on padded copies, built and run: within TF32's
    accuracy of the float64 product, every column in place, in eager mode and replayed in a graph."""
    import torch

    program = _odd_matmul_program(tmp_path, CodegenOptions(tf32=True))
    assert "cudaMemset2DAsync(" in program
    (tmp_path / "program.py").write_text(program)
    spec = importlib.util.spec_from_file_location("odd_matmul_tf32", tmp_path / "program.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a, b = torch.randn(2050, 1030, device="cuda"), torch.randn(1030, 2049, device="cuda")
    model = module.ModelNew().cuda()
    with torch.no_grad():
        got = model(a, b).clone()
        again = model(a, b)
    exact = a.double() @ b.double()
    for out in (got, again):
        assert ((out.double() - exact).abs().max() / exact.abs().max()).item() < 2e-3


@pytest.mark.nvcc
def test_staged_programs_compile_for_sm90(tmp_path):
    from tests.test_offline_codegen import _compile_together

    _compile_together([cuda_source(_odd_matmul_program(tmp_path, CodegenOptions(tf32=True)))], tmp_path)
