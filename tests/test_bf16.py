"""bf16 operands with fp32 accumulation (``CodegenOptions(bf16=True)``, ``paper`` only): which
products and convolutions the cost model gives it, how the copies are laid out, what the program
emits, that the Verifier names the arithmetic, that the variant search tries it under paper and
never under strict, and (nvcc) that the programs compile. Run on the GPU: tests/test_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest

from stitchcuda.agents.offline import variants
from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.lowering.bf16 import bf16_conv_able, plan_bf16, plan_conv_bf16
from stitchcuda.compiler.lowering.cost import TABLES, conv_paths, gemm_paths
from stitchcuda.compiler.lowering.lowered import Conv, Gemm
from stitchcuda.verify.precision import BF16_ACC32, TF32, arithmetic_of
from tests.test_cutlass_programs import _gemms
from tests.test_cutlass_programs import _lowered as lowered

BF16 = CodegenOptions(tf32=True, bf16=True, cost_model=True, cutlass=True)


def _place(op, src: np.ndarray) -> np.ndarray:
    """What the conversion kernel writes for one matrix: the stored matrix (transposed where the
    operand is) in rows of ``d_row``."""
    rows = src.T if op.transpose else src
    out = np.zeros((rows.shape[0], op.d_row))
    out[:, :rows.shape[1]] = rows
    return out


@pytest.mark.parametrize("a_trans,b_trans", [(False, True), (True, False), (False, False)])
def test_the_copies_are_row_major_and_one_gemm_gives_the_product(a_trans, b_trans):
    m, n, k = 5, 7, 12
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    g = Gemm(1, m, n, k, "x", "w", a_trans=a_trans, b_trans=b_trans, out="y")
    plan = plan_bf16(g, "x_split_a", "x_split_b")
    assert plan.cross is None and plan.main.bf16 and not plan.main.a_trans and not plan.main.b_trans
    assert plan.main.ld_a % 8 == 0 and plan.main.ld_b % 8 == 0  # 16-byte rows of bf16
    ca = _place(plan.a, a.T if a_trans else a)
    cb = _place(plan.b, b.T if b_trans else b)
    assert ca.shape == (m, plan.main.ld_a) and cb.shape == (k, plan.main.ld_b)
    np.testing.assert_allclose(ca[:, :k] @ cb[:, :n], a @ b, rtol=1e-12)


def test_a_convolutions_filter_goes_to_cudnns_nhwc_layout():
    conv = Conv(0, 2, 16, 24, (6, 6), (6, 6), (3, 3), (1, 1), (1, 1), (1, 1), 2, False, "x", "w")
    plan = plan_conv_bf16(conv, "x_split_a", "x_split_b", "x_split_c")
    w = np.arange(24 * 8 * 9).reshape(24, 8, 9)  # [c_out, cg, taps]
    out = np.zeros(w.size, int)
    for (k, c, t), v in np.ndenumerate(w):
        d, s = (0, k, c, t), plan.w_strides
        out[sum(i * st for i, st in zip(d, s, strict=True))] = v
    np.testing.assert_array_equal(out.reshape(24, 9, 8), w.transpose(0, 2, 1))  # [c_out, taps, cg]
    assert plan.copies == 1 and plan.data_type == "CUDNN_DATA_BFLOAT16"
    assert not bf16_conv_able(Conv(0, 2, 3, 24, (6, 6), (6, 6), (3, 3), (1, 1), (1, 1), (1, 1), 1, False, "x", "w"))


def test_the_cost_model_gives_bf16_to_compute_bound_products_and_keeps_small_ones():
    table = TABLES["H100"]
    big = Gemm(1, 4096, 4096, 4096, "x", "w", a_trans=False, b_trans=True, out="y")
    paths = gemm_paths(big, table, ["cublas", "bf16"], packed_b=True, tf32=True)
    assert paths["bf16"] < 0.7 * paths["cublas"]  # twice TF32's rate, the weight converted once
    thin = Gemm(1, 64, 64, 64, "x", "w", a_trans=False, b_trans=True, out="y")
    thin_paths = gemm_paths(thin, table, ["cublas", "bf16"], tf32=True)
    assert thin_paths["bf16"] > thin_paths["cublas"]  # the copies' launches cost more than they save
    conv = Conv(0, 32, 256, 256, (28, 28), (28, 28), (3, 3), (1, 1), (1, 1), (1, 1), 1, False, "x", "w")
    assert conv_paths(conv, table, ["cublas", "bf16"], packed_w=True, tf32=True)["bf16"] < \
        conv_paths(conv, table, ["cublas"], tf32=True)["cublas"]


def test_mlp_runs_on_bf16_copies_with_the_weights_converted_once():
    task, compiled, low = lowered("mlp", BF16)
    gemms = _gemms(low)
    assert gemms and all(g.split is not None and g.split.main.bf16 for g in gemms)
    assert all(g.split.b.packed and not g.split.a.packed for g in gemms)
    assert all(p.bf16 and not p.fast_tf32 for p in low.lt_gemms) and len(low.lt_gemms) == len(gemms)
    assert any(g.split.main.epilogue.endswith("BIAS") for g in gemms)
    program = generate(task, compiled.graph, compiled.groups, BF16)
    cuda = cuda_source(program)
    assert "#include <cuda_bf16.h>" in cuda and "CUDA_R_16BF" in cuda and "sc_to_bf16" in cuda
    assert "CUBLAS_COMPUTE_32F_FAST_TF32" not in cuda
    assert "bf16 operands on cuBLASLt tensor cores (fp32 accumulate)" in program
    assert "bf16 (fp32 accumulate)" in program  # the cost model's note
    assert arithmetic_of(program) == [BF16_ACC32]


def test_convolutions_run_channels_last_on_cudnns_bf16_kernels():
    task, compiled, low = lowered("diffusion_resblock", BF16)
    # the 128 -> 256 one saves less than the model's margin on bf16 (its copies against TF32's rate)
    assert [c.split.copies if c.split else None for c in low.convs] == [None, 1]
    program = generate(task, compiled.graph, compiled.groups, BF16)
    cuda = cuda_source(program)
    assert cuda.count("sc_nhwc_bf16<<<") == cuda.count("sc_nhwc_bf16_to_nchw<<<") == 1
    assert "CUDNN_DATA_BFLOAT16" in cuda and "CUDNN_TENSOR_NHWC" in cuda
    assert "cuDNN on bf16 tensor cores (fp32 accumulate" in program
    assert arithmetic_of(program) == [TF32, BF16_ACC32]


def test_bf16_only_under_paper_and_right_after_tf32():
    assert not any(o["bf16"] for o in variants("strict"))
    paper = variants("paper")
    assert paper[0]["tf32"] and paper[0]["cost_model"] and not paper[0]["bf16"]
    bf16 = [o for o in paper if o["bf16"]]
    assert bf16 and all(o["cost_model"] and o["tf32"] for o in bf16)
    assert paper.index(bf16[0]) < min(i for i, o in enumerate(paper) if not o["tf32"])


@pytest.mark.nvcc
def test_bf16_programs_compile_for_sm90(tmp_path):
    from tests.test_offline_codegen import _compile_together

    sources = []
    for name in ("mlp", "transformer_block", "diffusion_resblock"):
        task, compiled, _ = lowered(name, BF16)
        sources.append(cuda_source(generate(task, compiled.graph, compiled.groups, BF16)))
    _compile_together(sources, tmp_path)


def test_the_search_tries_bf16_next_where_a_library_kernel_leads_and_the_model_favours_it():
    from stitchcuda.agents.offline import Signals, choose_next

    paper = variants("paper")
    first_bf16 = next(i for i, o in enumerate(paper) if o["bf16"])
    estimates = [0.5 if o["bf16"] else 1.0 for o in paper]
    assert choose_next(paper, [0], Signals(top_origin="library"), base=0, estimates=estimates) == first_bf16
    slower = [2.0 if o["bf16"] else 1.0 for o in paper]  # another TF32 path first where bf16 costs more
    assert not paper[choose_next(paper, [0], Signals(top_origin="library"), base=0, estimates=slower)]["bf16"]
