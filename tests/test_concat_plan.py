"""Concatenations that grow one buffer (lowering/concat_plan.py): a dense block's chain of
concatenations, each layer copying only its own feature map into its slice and reading the
block so far as a strided view; run on the CPU as the program runs it, in training mode (batch
statistics over the strided view), and compiled with nvcc."""

from __future__ import annotations

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from stitchcuda.compiler.lowering.lower import lower
from tests.test_offline_codegen import assert_program_compiles, simulate, task_from

DENSE = '''
import torch
import torch.nn as nn


class Layer(nn.Module):
    def __init__(self, channels, growth):
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(channels), nn.Conv2d(channels, 2 * growth, 1, bias=False)
        self.norm2, self.conv2 = nn.BatchNorm2d(2 * growth), nn.Conv2d(2 * growth, growth, 3, padding=1, bias=False)

    def forward(self, features):
        joined = torch.cat(features, 1)
        x = self.conv1(torch.relu(self.norm1(joined)))
        return self.conv2(torch.relu(self.norm2(x))) + joined.mean((1, 2, 3), keepdim=True)


class Model(nn.Module):  # a dense block in training mode, as KernelBench leaves it
    def __init__(self, channels=8, growth=4, layers=3):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.layers = nn.ModuleList(Layer(channels + k * growth, growth) for k in range(layers))

    def forward(self, x):
        features = [torch.max_pool2d(self.stem(x), 2)]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1).mean((2, 3))


def get_inputs():
    return [torch.randn(2, 3, 12, 10)]


def get_init_inputs():
    return []
'''

# the same block, its concatenations read by a convolution straight away (no norm in front):
# a library call's operand must be a buffer of its own, so nothing is planned
CONV_READS = DENSE.replace("self.conv1(torch.relu(self.norm1(joined)))", "self.conv1(joined)")


@pytest.fixture(scope="module")
def dense():
    return compile_task(task_from("dense_block", DENSE))


def test_each_layer_copies_only_its_own_feature_map(dense):
    assert not dense.isolated  # the means over the views lower in their row kernels
    low = lower(dense.graph, dense.groups, CodegenOptions())
    copies = [g for g in low.groups if "growing buffer" in g.describe]
    # each layer's input; the block's output is read by its mean's row kernel, piece by piece
    assert len(copies) == 4
    regions = [g.program.output_shapes[g.group.nodes[0]][1] for g in copies]
    assert regions == [8, 4, 4, 4]  # channels copied: the stem's 8, then each layer's 4 new ones
    buffers = {low.storage[g.group.nodes[0]] for g in copies}
    assert len(buffers) == 1 and len(low.layouts) == 3  # one buffer; all but the largest are views of it


@pytest.mark.parametrize("options", [CodegenOptions(), CodegenOptions(vector_width=4)])
def test_the_block_computes_the_reference_in_training_mode(dense, options):
    got, expected = simulate(dense.task, dense.graph, dense.groups, options, train=True)
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


def test_a_concatenation_a_library_call_reads_stays_a_buffer_of_its_own():
    compiled = compile_task(task_from("dense_conv_reads", CONV_READS))
    assert CONV_READS != DENSE
    low = lower(compiled.graph, compiled.groups, CodegenOptions())
    assert not low.layouts
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions(), train=True)
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


@pytest.mark.nvcc
def test_the_growing_buffer_program_compiles(dense, tmp_path):
    assert_program_compiles(dense.program(), tmp_path)


BRANCHES = '''
import torch
import torch.nn as nn


class Model(nn.Module):  # Inception's block: branches whose last activations are concatenated
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(6, 4, 1)
        self.b = nn.Conv2d(6, 5, 3, padding=1)
        self.norm = nn.BatchNorm2d(5)
        self.head = nn.Conv2d(4 + 5 + 6, 3, 1)

    def forward(self, x):
        pooled = torch.max_pool2d(x, 3, 1, 1)
        joined = torch.cat([torch.tanh(self.a(x)) * 2.0, torch.relu(self.norm(self.b(x))), pooled], 1)
        return self.head(joined)


def get_inputs():
    return [torch.randn(2, 6, 9, 7)]


def get_init_inputs():
    return []
'''


def test_a_branch_activation_is_written_into_its_slice():
    compiled = compile_task(task_from("branches", BRANCHES))
    low = lower(compiled.graph, compiled.groups, CodegenOptions())
    written = {v: prog.write_strides[v] for g in low.groups for x in g.launches() if (prog := x.program) is not None
               for v in prog.write_strides}
    cat = next(n.name for n in compiled.graph.nodes if n.op == "aten.cat")
    pieces = [a[1:] for a in compiled.graph.node(cat).args[0]]
    per_image = 15 * 9 * 7
    assert written[pieces[1]] == ((per_image, 63, 7, 1), 4 * 63)  # the norm's ReLU, after the 4 channels before it
    (copies,) = [g for g in low.groups if "growing buffer" in g.describe]
    # copied: the product's epilogue (a library call's) and the pooling's (a family kernel's)
    assert [x.program.output_shapes[cat][1] for x in copies.launches()] == [4, 6]
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions(), train=True)
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5
