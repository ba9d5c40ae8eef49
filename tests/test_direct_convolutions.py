"""Convolutions that leave cuDNN: depthwise ones as one pointwise kernel (each output a sum of its
window's zero-padded taps, the epilogue in the same kernel), convolutions whose windows tile the
input (patch embeddings) as a copy of the patches, one GEMM and a kernel writing NCHW. Checked on the CPU through
the lowered program's simulation, in every variant that changes them; the generated CUDA's shape
is checked as text (nvcc compiles the bundled programs in test_offline_codegen)."""

from __future__ import annotations

import re

import pytest
import torch

from stitchcuda.compiler.capture.graph import capture
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate, lower
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.task.load import resolve_tasks
from tests.test_offline_codegen import cuda_source, simulate, task_from

DEPTHWISE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.strided = nn.Conv2d(6, 6, 3, stride=2, padding=1, groups=6)
        self.dilated = nn.Conv2d(6, 6, 5, padding=4, dilation=2, groups=6, bias=False)
        self.line = nn.Conv1d(4, 4, 3, padding=1, groups=4)
        self.valid = nn.Conv2d(3, 3, (3, 2), groups=3)
        self.bn = nn.BatchNorm2d(6)
        self.eval()

    def forward(self, x, y, z):
        return (torch.clamp(self.bn(self.strided(x)), 0, 6), self.dilated(x) * 2.0, torch.relu(self.line(y)),
                self.valid(z))


def get_inputs():
    return [torch.randn(2, 6, 9, 8), torch.randn(3, 4, 10), torch.randn(3, 7, 5)]


def get_init_inputs():
    return []
'''

PATCHES = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, 8, (4, 2), stride=(4, 2))  # 9 x 7: the last row and column are dropped
        self.line = nn.Conv1d(4, 6, 3, stride=3, bias=False)
        self.single = nn.Conv2d(5, 7, 2, stride=2)

    def forward(self, x, y, z):
        return torch.relu(self.embed(x)) + 1.0, self.line(y), self.single(z)


def get_inputs():
    return [torch.randn(2, 3, 9, 7), torch.randn(3, 4, 10), torch.randn(5, 6, 6)]


def get_init_inputs():
    return []
'''


def _check(task, options: CodegenOptions) -> list[str]:
    graph = capture(task)
    groups = fuse(graph)
    got, expected = simulate(task, graph, groups, options)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    low = lower(graph, groups, options)
    assert low.convs == []  # no cuDNN call
    return [g.describe for g in low.groups]


@pytest.mark.parametrize("options", [CodegenOptions(), CodegenOptions(vector_width=1),
                                     CodegenOptions(split_tf32=True)])
def test_depthwise_convolutions_are_pointwise_kernels_with_their_epilogue(options):
    """Stride, dilation, padding (taps outside the input read nothing and add 0), 1-d, a bias, an
    eval batch norm and clamp in the same kernel."""
    describes = _check(task_from("depthwise", DEPTHWISE), options)
    assert sum("as one pointwise kernel (each output its window's taps)" in d for d in describes) == 4
    assert any("epilogue bias p_strided_bias, aten.batch_norm, aten.clamp" in d for d in describes)


def test_a_depthwise_kernel_tests_only_the_taps_that_can_fall_outside():
    task = resolve_tasks("depthwise_separable")[0]  # 3 x 3, padding 1, over 112 x 112
    graph = capture(task)
    cuda = cuda_source(generate(task, graph, fuse(graph)))
    kernel = cuda[cuda.index("_g0_pointwise_v4("):]
    kernel = kernel[:kernel.index("\n}\n")]
    assert kernel.count("? x[") == 8  # the centre tap is read unguarded, as one float4
    assert "*reinterpret_cast<const float4*>(x + base)" in kernel
    # per-channel weights and batch-norm statistics: loaded once for the four elements of a thread
    assert kernel.count("// the same for the four elements") == 9 + 4


@pytest.mark.parametrize("options", [CodegenOptions(), CodegenOptions(split_tf32=True)])
def test_convolutions_whose_windows_tile_the_input_are_a_copy_and_a_gemm(options):
    describes = _check(task_from("patches", PATCHES), options)
    assert sum("as a GEMM over its patches" in d for d in describes) == 3
    assert any("[8 x 24] . [24 x 12], written NCHW with bias p_embed_bias, aten.relu, aten.add" in d
               for d in describes)


def test_a_vision_transformers_patch_embedding_splits_in_the_split_variant():
    task = resolve_tasks("vit_encoder")[0]
    graph = capture(task)
    low = lower(graph, fuse(graph), CodegenOptions(split_tf32=True))
    embed = next(g for g in low.groups if "patch_embed" in g.describe)
    assert embed.kind == "sequence" and [p.kind for p in embed.parts] == ["pointwise", "gemm", "pointwise"]
    gemm = embed.parts[1].gemm  # one product over the patches of all 32 images
    assert (gemm.batch, gemm.m, gemm.n, gemm.k) == (1, 768, 32 * 196, 768) and gemm.split is not None


def test_a_stencil_over_rows_not_a_multiple_of_four_runs_one_element_a_thread():
    """As KernelBench L1/82's valid 3 x 3 depthwise convolution leaves rows of 510: here the 1-d
    one's rows of 10 get no float4 form, the 2-d ones (rows of 4 and 8) keep it."""
    task = task_from("depthwise", DEPTHWISE)
    graph = capture(task)
    cuda = cuda_source(generate(task, graph, fuse(graph)))
    kernels = re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(", cuda)
    assert sorted(k for k in kernels if k + "_v4" not in kernels and not k.endswith("_v4")) == [
        k for k in kernels if k.endswith("_g2_pointwise")]
