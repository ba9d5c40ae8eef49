"""3xTF32 by split operands (``CodegenOptions(split_tf32=True)``): which GEMMs take it, how each
operand's two TF32 halves are laid out for the depth-2K cross GEMM and the big one, what the
program emits, that the Verifier's precision detection names it 3xTF32, and (nvcc) that the
programs compile. The halves' arithmetic itself is checked in numpy, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from stitchcuda.compiler.check import cuda_source
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.lowering.lowered import Conv, Gemm
from stitchcuda.compiler.lowering.split_tf32 import (
    plan_conv_split,
    plan_split,
    worth_splitting,
    worth_splitting_conv,
)
from stitchcuda.verify.precision import X3TF32, arithmetic_of
from tests.test_cutlass_programs import _gemms
from tests.test_cutlass_programs import _lowered as lowered

SPLIT = CodegenOptions(split_tf32=True)


def _lowered(name: str, options: CodegenOptions = SPLIT):
    return lowered(name, options)


def _tf32(x: np.ndarray) -> np.ndarray:  # the kernel's rounding, in numpy
    u = x.astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def test_the_halves_are_exact_tf32_and_the_product_misses_only_small_small():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 256), dtype=np.float32), rng.standard_normal((256, 32), dtype=np.float32)
    (ab, bb) = _tf32(a), _tf32(b)
    as_, bs = _tf32(a - ab), _tf32(b - bb)
    for half in (ab, as_, bb, bs):
        assert not (half.view(np.uint32) & np.uint32(0x1FFF)).any()  # 10 mantissa bits: tensor cores read them as is
    ref = a.astype(np.float64) @ b.astype(np.float64)
    three = (ab.astype(np.float64) @ bb + ab.astype(np.float64) @ bs + as_.astype(np.float64) @ bb)
    plain = ab.astype(np.float64) @ bb
    err = lambda y: np.abs(y - ref).max() / np.abs(ref).max()  # noqa: E731
    assert err(three) < 1e-6 < 1e-4 < err(plain)


def test_operand_layouts_for_the_cross_and_big_gemms():
    # linear: A [M, K] row-major as is; B = W^T stored as W [N, K]: transposed into [2K, N], the
    # layout cuBLAS's TF32 kernels run fastest on
    g = Gemm(1, 8, 16, 300, "x", "w", a_trans=False, b_trans=True, out="o")
    plan = plan_split(g, "xa", "xb")
    assert (plan.a.transpose, plan.a.d_row, plan.a.off_big, plan.a.off_small) == (False, 600, 0, 300)
    assert (plan.b.transpose, plan.b.rows, plan.b.cols, plan.b.d_row, plan.b.off_small, plan.b.off_big) == (
        True, 16, 300, 16, 0, 4800)
    for part in (plan.cross, plan.main):
        assert (part.a_trans, part.b_trans, part.ld_a, part.ld_b) == (False, False, 600, 16)
    assert (plan.cross.k, plan.cross.a, plan.cross.b) == (600, "xa", "xb")
    assert (plan.main.k, plan.main.a, plan.main.b) == (300, "xa", "xb + 4800")
    assert "sc_split_tf32_t<<<dim3(10, 1, 1), dim3(32, 8)" in plan.b.launch()
    # bmm with B [K, N] row-major: no transpose; a shared operand splits once
    g = Gemm(4, 8, 16, 300, "x", "y", a_trans=False, b_trans=False, out="o", stride_a=2400, stride_b=0, stride_c=128)
    plan = plan_split(g, "xa", "xb")
    assert (plan.b.transpose, plan.b.off_big, plan.b.d_row, plan.b.batch, plan.b.d_batch) == (False, 4800, 16, 1, 0)
    assert (plan.a.batch, plan.a.d_batch, plan.cross.stride_a, plan.main.stride_b) == (4, 4800, 4800, 0)


def _place(op, src: np.ndarray) -> np.ndarray:
    """What the kernels write, in numpy: element (b, r, c) of the stored matrix at its place."""
    dst = np.zeros(op.scratch, np.float32)
    for b in range(op.matrices):
        for r in range(op.rows):
            for c in range(op.cols):
                x = src[(b // op.batch) * op.s_outer + (b % op.batch) * op.s_batch + r * op.s_row + c]
                big = _tf32(np.float32(x))
                small = _tf32(np.float32(x - big))
                o = b * op.d_batch + (c * op.d_row + r if op.transpose else r * op.d_row + c)
                dst[o + op.off_big], dst[o + op.off_small] = big, small
                if op.off_big2 >= 0:
                    dst[o + op.off_big2] = big
    return dst


def test_rows_are_padded_so_every_pointer_and_leading_dimension_is_16_byte_aligned():
    plan = plan_split(Gemm(1, 8205, 5921, 2949, "x", "y", a_trans=False, b_trans=False, out="o"), "xa", "xb")
    assert (plan.a.d_row, plan.b.d_row) == (5900, 5924)
    for part in (plan.cross, plan.main):
        offsets = [int(p.split(" + ")[1]) if " + " in p else 0 for p in (part.a, part.b)]
        assert part.ld_a % 4 == part.ld_b % 4 == 0 and all(o % 4 == 0 for o in offsets)
    assert plan.b.scratch == 2 * 2949 * 5924 and plan.a.scratch == 8205 * 5900


@pytest.mark.parametrize("a_trans,b_trans", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("m,n,k", [(5, 7, 6), (3, 5, 7), (4, 6, 300)])
def test_the_two_gemms_on_the_halves_give_the_product(a_trans, b_trans, m, n, k):
    """Emulate the kernels and both GEMMs on their strided views: A.B to 3xTF32 accuracy."""
    rng = np.random.default_rng(1)
    A, B = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    stored_a = (A.T if a_trans else A).copy().ravel()
    stored_b = (B.T if b_trans else B).copy().ravel()
    plan = plan_split(Gemm(1, m, n, k, "A", "B", a_trans, b_trans, out="C"), "xa", "xb")
    xa, xb = _place(plan.a, stored_a), _place(plan.b, stored_b)

    def view(buf: np.ndarray, at: str, rows: int, cols: int, ld: int) -> np.ndarray:
        off = int(at.split(" + ")[1]) if " + " in at else 0
        return np.lib.stride_tricks.as_strided(buf[off:], (rows, cols), (ld * 4, 4)).astype(np.float64)

    c = view(xa, plan.main.a, m, plan.main.k, plan.main.ld_a) @ view(xb, plan.main.b, plan.main.k, n, plan.main.ld_b)
    if plan.cross is not None:
        c += view(xa, plan.cross.a, m, 2 * k, plan.cross.ld_a) @ view(xb, plan.cross.b, 2 * k, n, plan.cross.ld_b)
    ref = A.astype(np.float64) @ B
    assert np.abs(c - ref).max() / np.abs(ref).max() < 1e-6


def test_aligned_operands_split_four_columns_a_thread_with_a_run_time_check():
    plan = plan_split(Gemm(1, 4096, 4096, 4096, "a", "b", False, False, out="c"), "xa", "xb")
    launch = plan.a.launch()
    assert launch.startswith("if (reinterpret_cast<uintptr_t>(a.a) % 16 == 0) { sc_split_tf32_v4<<<dim3(4, 4096)")
    assert "else { sc_split_tf32<<<" in launch  # a view starting anywhere still splits
    odd = plan_split(Gemm(1, 8205, 5921, 2949, "a", "b", False, False, out="c"), "xa", "xb")
    assert odd.a.launch().startswith("sc_split_tf32<<<")  # K = 2949: rows not in 16-byte steps


def test_a_shallow_product_splits_into_one_gemm_of_depth_3k():
    """K = 64 (L1/7: a 32768 x 32768 output): a second GEMM would read and write the output again."""
    plan = plan_split(Gemm(1, 32768, 32768, 64, "a", "b", a_trans=False, b_trans=False, out="c"), "xa", "xb")
    assert plan.cross is None and plan.main.k == 192 and (plan.main.ld_a, plan.main.ld_b) == (192, 32768)
    assert (plan.a.off_big, plan.a.off_small, plan.a.off_big2) == (0, 64, 128)
    assert (plan.b.off_big, plan.b.off_big2, plan.b.off_small) == (0, 64 * 32768, 128 * 32768)
    assert worth_splitting(Gemm(1, 32768, 32768, 32, "a", "b", False, False, out="c"))
    assert not worth_splitting(Gemm(1, 32768, 512, 13, "a", "b", False, False, out="c"))  # too shallow


def test_mlp_runs_split_with_bias_and_activation_in_the_epilogue():
    task, compiled, low = _lowered("mlp")
    gemms = _gemms(low)
    assert gemms and all(g.split is not None for g in gemms)
    assert not low.uses_blas and len(low.lt_gemms) == 2 * len(gemms)
    scratch = {ident: shape[0] for ident, shape in low.intermediates if ident.startswith("x_split")}
    assert scratch == {"x_split_a": max(g.split.a.scratch for g in gemms)}  # one, for the largest activation
    packs = {ident: shape[0] for ident, shape in low.intermediates if ident.startswith("x_pack")}
    assert sorted(packs.values()) == sorted(g.split.b.scratch for g in gemms)  # each weight's halves, kept
    assert all(p.fast_tf32 for p in low.lt_gemms)
    assert any(g.split.main.epilogue.endswith("BIAS") for g in gemms)
    assert all(not g.split.cross.bias for g in gemms)  # the bias is added once, by the big GEMM
    program = generate(task, compiled.graph, compiled.groups, SPLIT)
    cuda = cuda_source(program)
    assert "sc_split_tf32<<<" in cuda and "CUBLAS_COMPUTE_32F_FAST_TF32" in cuda and "cublasSgemm" not in cuda
    assert "3xTF32 split operands" in program
    assert arithmetic_of(program) == [X3TF32]  # not plain TF32: the split is visible to the Verifier


def test_attention_scores_split_with_their_two_batch_dimensions_made_one():
    """Q.K^T of a fused QKV projection [b, s, 3, h, d]: heads (stride d) inside the batch (stride
    s * 3hd). The split writes both operands' matrices densely, b * h of them, and one batched
    GEMM writes the scores (dense over both); P.V, whose output puts heads inside tokens, stays on
    one pointer-array SGEMM, as do products too narrow to split (N = d = 16 here)."""
    b, s, h, d = 2, 5, 3, 4
    rng = np.random.default_rng(2)
    qkv = rng.standard_normal(b * s * 3 * h * d, dtype=np.float32)
    g = Gemm(h, s, s, d, "qkv", f"qkv + {h * d}", a_trans=False, b_trans=True, out="scores", stride_a=d,
             stride_b=d, stride_c=s * s, ld_a=3 * h * d, ld_b=3 * h * d, outer=b, outer_a=s * 3 * h * d,
             outer_b=s * 3 * h * d, outer_c=h * s * s)
    plan = plan_split(g, "xa", "xb")
    assert (plan.main.batch, plan.main.outer, plan.main.stride_c) == (b * h, 1, s * s)
    assert (plan.a.matrices, plan.b.matrices, plan.a.s_outer) == (b * h, b * h, s * 3 * h * d)
    xa = _place(plan.a, qkv)
    xb = _place(plan.b, qkv[h * d:])
    x4 = qkv.reshape(b, s, 3, h, d).astype(np.float64)
    for i in range(b * h):
        av = xa[i * plan.a.d_batch:][:s * plan.main.ld_a].reshape(s, plan.main.ld_a)[:, :plan.main.k]
        bv = xb[i * plan.b.d_batch:][:plan.main.k * plan.main.ld_b].reshape(plan.main.k, plan.main.ld_b)[:, :s]
        q, k = x4[i // h, :, 0, i % h], x4[i // h, :, 1, i % h]
        ref = q @ k.T
        assert np.abs(av.astype(np.float64) @ bv - ref).max() / np.abs(ref).max() < 1e-6
    # the output's two dimensions do not fold (P.V into [b, s, h, d]): no split
    assert not worth_splitting(Gemm(12, 512, 512, 512, "p", "v", False, False, out="o", stride_a=512 * 512,
                                    stride_b=64, stride_c=64, outer=8, outer_a=12 * 512 * 512, outer_b=512 * 2304,
                                    outer_c=512 * 768))


def test_products_split_where_one_strided_call_does():
    task, compiled, low = _lowered("transformer_block")
    gemms = _gemms(low)
    qk, pv = (g for g in gemms if g.outer > 1 or (g.split is not None and g.split.main.batch > 1))
    assert qk.split is not None and qk.split.main.batch == 96  # 8 x 12 score matrices, one GEMM
    assert pv.split is None and pv.n == 64  # N = head dim: too narrow to pay
    assert low.uses_blas and sum(g.split is not None for g in gemms) == 5
    cuda = cuda_source(generate(task, compiled.graph, compiled.groups, SPLIT))
    assert "cublasSgemmBatched(" in cuda and "sc_batch_ptrs<<<" in cuda and "for (int o = 0; o < 8" not in cuda
    plan = plan_split(Gemm(12, 512, 512, 64, "q", "k", False, True, out="s", stride_a=32768, stride_b=32768,
                           stride_c=262144), "xa", "xb")
    assert plan.cross is None  # head dim 64: one GEMM of depth 192, batch-strided
    assert (plan.main.batch, plan.main.k, plan.main.stride_a, plan.main.stride_b) == (12, 192, 98304, 98304)


def test_small_products_stay_on_cublas_in_the_split_variant():
    """Where the split cannot pay (M or N under 128, K under 16, under 2^28 multiply-adds) the variant keeps SGEMM."""
    _, _, gru = _lowered("gru_decoder")
    assert all(g.split is None for g in _gemms(gru))  # 32 x 512 x 8000 per step
    _, _, emb = _lowered("embedding_mlp")
    split = {(g.m, g.n, g.k) for g in _gemms(emb) if g.split is not None}
    kept = {(g.m, g.n, g.k) for g in _gemms(emb) if g.split is None}
    assert (32768, 256, 512) in split and (32768, 512, 13) in kept and (17, 17, 64) in kept
    assert all(min(s) >= 128 for s in split)


def test_the_default_variant_has_no_split():
    task, compiled, low = _lowered("mlp", CodegenOptions())
    assert all(g.split is None for g in _gemms(low))
    assert "sc_split_tf32" not in generate(task, compiled.graph, compiled.groups, CodegenOptions())


def _halves(x: np.ndarray, small_at: int) -> list[np.ndarray]:
    big = _tf32(x)
    small = _tf32(x - big)
    return [small if small_at >> j & 1 else big for j in range(3)]


def _split_input(plan, x: np.ndarray) -> np.ndarray:
    """sc_split3_nhwc, in numpy, read back as NCHW [n, 3C, H, W]."""
    n, c, h, w = x.shape
    out = np.zeros(3 * x.size, np.float32)
    for ci in range(c):
        g, cc = divmod(ci, plan.cg)
        for j, half in enumerate(_halves(x[:, ci].astype(np.float32), 0b010)):
            ch = g * 3 * plan.cg + j * plan.cg + cc
            for b in range(n):
                out[b * 3 * c * h * w + ch:(b + 1) * 3 * c * h * w:3 * c] = half[b].ravel()
    return out.reshape(n, h, w, 3 * c).transpose(0, 3, 1, 2)


def _split_weight(plan, w: np.ndarray) -> np.ndarray:
    """sc_split3_weight, in numpy: the flat NHWC filter it writes."""
    out = np.zeros(3 * w.size, np.float32)
    flat = w.astype(np.float32).ravel()
    t = plan.w_strides
    for i, idx in enumerate(np.ndindex(*plan.w_dims)):
        at = sum(a * b for a, b in zip(idx, t[:4], strict=True))
        for j, half in enumerate(_halves(flat[i:i + 1], 0b100)):
            out[at + j * t[4]] = half[0]
    return out


def _conv(x: np.ndarray, w: np.ndarray, groups: int) -> np.ndarray:
    """A valid, stride-1 grouped 2-d convolution in float64: x [N, C, H, W], w [K, C/g, R, S]."""
    n, c, h, wd = x.shape
    k, cg, r, s_ = w.shape
    out = np.zeros((n, k, h - r + 1, wd - s_ + 1))
    for o in range(k):
        g = o // (k // groups)
        for i in range(r):
            for j in range(s_):
                patch = x[:, g * cg:(g + 1) * cg, i:i + out.shape[2], j:j + out.shape[3]].astype(np.float64)
                out[:, o] += np.einsum("nchw,c->nhw", patch, w[o, :, i, j].astype(np.float64))
    return out


@pytest.mark.parametrize("groups", [1, 2])
def test_a_convolution_over_the_split_channels_gives_the_convolution(groups):
    """Emulate the channels-last split of input and weight and one convolution over three times the
    channels (cuDNN's grouping kept): the convolution to 3xTF32 accuracy, where plain TF32 misses."""
    rng = np.random.default_rng(2)
    n, c, k, h = 2, 8, 4, 6
    x = rng.standard_normal((n, c, h, h), dtype=np.float32)
    w = rng.standard_normal((k, c // groups, 3, 3), dtype=np.float32)
    conv = Conv(0, n, c, k, (h, h), (h - 2, h - 2), (3, 3), (0, 0), (1, 1), (1, 1), groups, False, "x", "w")
    plan = plan_conv_split(conv, "xa", "xb", "xc")
    x3 = _split_input(plan, x)
    w3 = _split_weight(plan, w).reshape(k, 3, 3, 3 * c // groups).transpose(0, 3, 1, 2)  # KRSC -> KCRS
    ref = _conv(x, w, groups)
    err = lambda y: np.abs(y - ref).max() / np.abs(ref).max()  # noqa: E731
    assert err(_conv(x3, w3, groups)) < 1e-6 < 1e-4 < err(_conv(_tf32(x), _tf32(w), groups))
    assert (plan.x_scratch, plan.w_scratch, plan.y_scratch) == (3 * x.size, 3 * w.size, n * k * (h - 2) ** 2)


def test_a_transposed_convolutions_weight_splits_along_its_input_channels():
    """Weight [c_in, c_out/g, R, S] of a transposed convolution: its halves in cuDNN's NHWC filter
    layout [3 c_in, R, S, c_out/g], group by group."""
    rng = np.random.default_rng(3)
    c, k, g = 8, 6, 2
    w = rng.standard_normal((c, k // g, 2, 2), dtype=np.float32)
    conv = Conv(0, 2, c, k, (4, 4), (8, 8), (2, 2), (0, 0), (2, 2), (1, 1), g, True, "x", "w")
    plan = plan_conv_split(conv, "xa", "xb", "xc")
    w3 = _split_weight(plan, w).reshape(3 * c, 2, 2, k // g).transpose(0, 3, 1, 2)
    cg = c // g
    for ci in range(c):
        gi, cc = divmod(ci, cg)
        for j, half in enumerate(_halves(w[ci], 0b100)):
            assert np.array_equal(w3[gi * 3 * cg + j * cg + cc], half)


def test_convolutions_split_where_the_reduction_is_deep_enough():
    _, _, cnn = _lowered("small_cnn")
    assert [c.split is not None for c in cnn.convs] == [False, True, True]  # the 3-channel stem stays fp32
    _, _, dw = _lowered("depthwise_separable")  # depthwise: a pointwise kernel; the 1x1 is a GEMM, left unsplit
    assert dw.convs == []
    assert [(g.batch, g.m, g.n, g.k, g.split) for g in _gemms(dw)] == [(32, 256, 112 * 112, 128, None)]
    _, _, diffusion = _lowered("diffusion_resblock")  # the 3x3s (128 and 256 channels) pay
    assert [(c.kernel, c.split is not None) for c in diffusion.convs] == [((3, 3), True), ((3, 3), True)]
    assert not worth_splitting_conv(Conv(0, 1, 64, 64, (4, 4), (4, 4), (1, 1), (0, 0), (1, 1), (1, 1), 1, False,
                                         "x", "w"))  # 2^16 multiply-adds
    task, compiled, _ = _lowered("small_cnn")
    program = generate(task, compiled.graph, compiled.groups, SPLIT)
    cuda = cuda_source(program)
    assert cuda.count("sc_split3_nhwc<<<") == cuda.count("sc_split3_weight<<<") == cuda.count("sc_nhwc_to_nchw<<<") == 2
    assert "CUDNN_TENSOR_OP_MATH" in cuda and "CUDNN_FMA_MATH" in cuda and "CUDNN_TENSOR_NHWC" in cuda
    assert "3xTF32 (split channels)" in program and arithmetic_of(program) == [X3TF32]
    plain = generate(task, compiled.graph, compiled.groups, CodegenOptions())
    assert "sc_split3" not in plain and "CUDNN_TENSOR_OP_MATH" not in cuda_source(plain)


@pytest.mark.nvcc
def test_split_programs_compile_for_sm90(tmp_path):
    from tests.test_offline_codegen import _compile_together

    sources = []
    for name in ("mlp", "transformer_block", "lm_head_nll", "unet_tiny"):
        task, compiled, _ = _lowered(name)
        sources.append(cuda_source(generate(task, compiled.graph, compiled.groups, SPLIT)))
    _compile_together(sources, tmp_path)


SPLIT_CONV_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.grouped = nn.Conv2d(32, 64, 3, padding=1, groups=2)
        self.up = nn.ConvTranspose2d(64, 32, 2, stride=2)
        self.vol = nn.Conv3d(16, 24, 3, padding=1)

    def forward(self, x, v):
        return torch.relu(self.up(self.grouped(x))), self.vol(v)


def get_inputs():
    return [torch.randn(4, 32, 20, 20), torch.randn(2, 16, 6, 8, 8)]


def get_init_inputs():
    return []
'''


@pytest.mark.gpu
def test_split_convolutions_keep_fp32_accuracy_on_the_gpu(tmp_path, monkeypatch):
    """Grouped 2-d, transposed and 3-d convolutions, each split (the cost model overruled: these
    are small), built and run: within 2e-5 of the float64 result, where TF32 alone is ~1e-3 off."""
    import importlib.util

    import torch

    from stitchcuda.compiler import compile_task
    from stitchcuda.compiler.lowering import lower_conv
    from stitchcuda.task import resolve_tasks

    monkeypatch.setattr(lower_conv, "worth_splitting_conv", lambda c, *_: c.chunks == 1)
    path = tmp_path / "split_convs.py"
    path.write_text(SPLIT_CONV_TASK)
    (task,) = resolve_tasks(str(path))
    compiled = compile_task(task)
    program = generate(task, compiled.graph, compiled.groups, SPLIT)
    assert program.count("3xTF32 (split channels)") >= 3
    (tmp_path / "program.py").write_text(program)
    spec = importlib.util.spec_from_file_location("split_conv_program", tmp_path / "program.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    task_module = importlib.util.module_from_spec(importlib.util.spec_from_file_location("split_conv_task", path))
    task_module.__spec__.loader.exec_module(task_module)
    torch.manual_seed(0)
    reference = task_module.Model().cuda()
    torch.manual_seed(0)
    ours = module.ModelNew().cuda()
    inputs = [t.cuda() for t in task_module.get_inputs()]
    with torch.no_grad():
        got = ours(*inputs)
        exact = reference.double()(*[t.double() for t in inputs])
    for g, e in zip(got, exact, strict=True):
        assert ((g.double() - e).abs().max() / e.abs().max()).item() < 2e-5
