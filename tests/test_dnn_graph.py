"""Forward convolutions through cuDNN's graph API beside the legacy algorithm (CodegenOptions.dnn_graph,
templates/kernels/dnn_graph.cuh): which convolutions get a plan, the launch's fallback, an nvcc
build on the CPU, and on a GPU the program against float64 call after call (set-up, capture,
replay) with its time beside the legacy-only program's."""

from __future__ import annotations

import re

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from tests.test_offline_codegen import cuda_source, task_from

CONVS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """DenseNet's bottleneck 3x3 (128 -> 32 channels, BatchNorm and ReLU before it), then a strided,
    a grouped and a dilated convolution, a transposed one, and a 3-d one on a second input."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(128)
        self.dense = nn.Conv2d(128, 32, 3, padding=1, bias=False)
        self.strided = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.grouped = nn.Conv2d(64, 64, 3, padding=1, groups=4)
        self.dilated = nn.Conv2d(64, 64, 3, padding=2, dilation=2)
        self.up = nn.ConvTranspose2d(64, 16, 2, stride=2)
        self.volume = nn.Conv3d(4, 8, 3, padding=1)

    def forward(self, x, v):
        y = self.dense(torch.relu(self.bn(x)))
        y = self.dilated(self.grouped(torch.relu(self.strided(y))))
        return self.up(y), self.volume(v)


def get_inputs():
    return [torch.randn(4, 128, 28, 28), torch.randn(2, 4, 8, 12, 12)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def compiled():
    return compile_task(task_from("dnn_graph_convs", CONVS))


def test_only_forward_fp32_convolutions_get_a_plan(compiled):
    legacy, planned = (cuda_source(compiled.program(CodegenOptions(dnn_graph=on))) for on in (False, True))
    assert "ScDnnPlan" not in legacy and "cudnnBackend" not in legacy  # off: the program as it was
    forward = len(re.findall(r"cudnnConvolutionForward\(P\.dnn", planned))
    assert forward == 5 and "cudnnConvolutionBackwardData(P.dnn" in planned  # the transposed one stays legacy
    assert len(re.findall(r"= sc_pick_plan\(", planned)) == forward
    assert len(re.findall(r"if \(P\.dnn_plan\d+ && sc_dnn_aligned\(", planned)) == forward  # else: the legacy call
    assert len(re.findall(r"dnn_plan\d+\.reset\(\);", planned)) == forward  # before cudnnDestroy
    # the 3-d convolution's plan is made from 5-d dims
    assert re.search(r"const int64_t xd\[5\] = \{2, 4, 8, 12, 12\}", planned)


@pytest.mark.nvcc
def test_a_planned_program_compiles(compiled):
    from stitchcuda.compiler.check import compile_check

    result = compile_check(compiled.program(CodegenOptions(dnn_graph=True)))
    assert result.status == "compiled", result.detail


@pytest.mark.gpu
def test_planned_convolutions_match_float64_call_after_call(compiled, tmp_path):
    import torch

    from tests.test_gpu import _option_off_and_on

    torch.backends.cudnn.allow_tf32 = False
    times = _option_off_and_on(compiled, "dnn_graph", tmp_path)
    print(f"\nconvolutions: legacy algorithms {times[False]:.3f} ms, with the graph API's plans {times[True]:.3f} ms")
