"""Training-mode batch norm split into its statistics and an elementwise normalisation
(schedule/batch_norm_split.py): the normalisation fuses with the ReLU or residual add after it (one
pass fewer over the tensor than a separate apply kernel), or is applied as a softmax's row kernel
loads its rows; the running statistics still follow; the programs compute the reference in
training mode (CPU simulation) and compile."""

from __future__ import annotations

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from tests.test_offline_codegen import assert_program_compiles, simulate, task_from

RESIDUAL = '''
import torch
import torch.nn as nn


class Model(nn.Module):  # a ResNet basic block, and a norm without affine parameters
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(8)
        self.plain = nn.BatchNorm2d(8, affine=False)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)) + x)
        return self.plain(y) * 2.0


def get_inputs():
    return [torch.randn(3, 8, 10, 12) * 2.0 + 0.5]


def get_init_inputs():
    return []
'''

SOFTMAX = '''
import torch
import torch.nn as nn


class Model(nn.Module):  # a conv block ending in batch norm, then a softmax over the width
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        return torch.softmax(self.bn(self.conv(x)), dim=-1)


def get_inputs():
    return [torch.randn(2, 4, 6, 40)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def residual():
    return compile_task(task_from("bn_residual", RESIDUAL))


def test_the_normalisation_joins_the_relu_and_the_residual_add(residual):
    source = residual.program()
    assert "_apply<<<" not in source  # no apply kernel of its own: the statistics kernels alone
    assert source.count("_stats<<<") == 3
    pointwise = [g for g in residual.groups if g.kind == "elementwise"]
    ops = [{residual.graph.node(n).op for n in g.nodes} for g in pointwise]
    assert {"aten.sub", "aten.mul", "aten.add", "aten.relu"} <= ops[1]  # bn2, the residual add and the ReLU
    assert len(pointwise) == 3  # one pass after each norm


@pytest.mark.parametrize("options", [CodegenOptions(), CodegenOptions(vector_width=4)])
def test_the_block_computes_the_reference_in_training_mode(residual, options):
    got, expected = simulate(residual.task, residual.graph, residual.groups, options, train=True)
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


def test_the_running_statistics_are_still_written_back(residual):
    mutated = set(residual.graph.mutations.values())
    assert {f"b_bn{i}_running_{s}" for i in (1, 2) for s in ("mean", "var")} <= mutated
    for item, (_, index) in residual.graph.getitems.items():
        if residual.graph.mutations.get(item, "").endswith("running_mean"):
            assert index == 3, item


def test_a_softmax_after_the_norm_normalises_as_it_loads_its_rows():
    compiled = compile_task(task_from("bn_softmax", SOFTMAX))
    rows = [g for g in compiled.groups if g.kind == "row_reduce"]
    assert len(rows) == 1 and "aten.sub" in {compiled.graph.node(n).op for n in rows[0].nodes}
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions(), train=True)
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


@pytest.mark.nvcc
def test_the_split_program_compiles(residual, tmp_path):
    assert_program_compiles(residual.program(), tmp_path)


@pytest.mark.gpu
def test_the_split_program_follows_the_reference_call_after_call_on_the_gpu(residual, tmp_path):
    """Training mode on the GPU: each call's output within 1e-5 of the reference's, and the running
    statistics both models carry forward equal after every call (the graph replayed from the third)."""
    import torch

    from tests.test_gpu import _reference_and_program

    torch.backends.cudnn.allow_tf32 = False
    scope, ref, new = _reference_and_program(residual.task, residual.program(), tmp_path / "bn_residual.py")
    with torch.no_grad():
        for call in range(4):
            torch.manual_seed(call)
            x = scope["get_inputs"]()[0].cuda()
            got, want = new(x), ref(x)
            assert ((got - want).abs().max() / want.abs().max()).item() < 1e-5, f"call {call}"
            for name, buffer in ref.named_buffers():
                if "running" in name:
                    torch.testing.assert_close(dict(new.named_buffers())[name], buffer, rtol=1e-5, atol=1e-6)
