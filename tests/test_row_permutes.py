"""A linear over a permute of its rows reads the rows in their own order, the permute moving to its
output (schedule/row_permutes.py): nn.MultiheadAttention with batch_first=True transposes its input
before the input projection, and that transpose was a copy kernel before every such product."""

from __future__ import annotations

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.capture.graph import capture
from stitchcuda.compiler.emit.codegen import CodegenOptions
from stitchcuda.compiler.schedule.row_permutes import commute_row_permutes
from stitchcuda.compiler.schedule.simplify import drop_identity_clones
from tests.test_offline_codegen import simulate, task_from

MHA = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(64, 4, batch_first=True)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


def get_inputs():
    return [torch.randn(2, 16, 64)]


def get_init_inputs():
    return []
'''

# the rows' order cannot be a view here: B and the width are merged after the product
MERGED = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x):
        y = self.proj(x.transpose(0, 1))
        return y.view(y.shape[0], -1) * 2.0


def get_inputs():
    return [torch.randn(3, 5, 32)]


def get_init_inputs():
    return []
'''


def test_the_input_projection_reads_the_rows_as_they_are():
    compiled = compile_task(task_from("mha_batch_first", MHA))
    assert any(n.name.endswith("__rows") for n in compiled.graph.nodes) and not compiled.isolated
    first = compiled.groups[0]
    assert first.kind == "gemm"  # no copy kernel ahead of the product
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


@pytest.mark.parametrize("source", [MERGED])
def test_a_layout_the_readers_cannot_view_is_left_as_it_was(source):
    graph = drop_identity_clones(capture(task_from("merged_rows", source)))
    assert commute_row_permutes(graph) is graph
    compiled = compile_task(task_from("merged_rows", source))
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


PACKED_PIECE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """The key/value projection of a packed in_proj weight, as nn.MultiheadAttention's cross-attention
    takes it: the second piece of a split of the weight and of the bias."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(192, 64) * 0.1)
        self.b = nn.Parameter(torch.randn(192) * 0.1)

    def forward(self, memory):
        _, w_kv = self.w.split([64, 128])
        _, b_kv = self.b.split([64, 128])
        return torch.nn.functional.linear(memory, w_kv, b_kv) * 2.0


def get_inputs():
    return [torch.randn(2, 24, 64)]


def get_init_inputs():
    return []
'''

CROSS = MHA.replace("def forward(self, x):\n        return self.attn(x, x, x, need_weights=False)[0]",
                    "def forward(self, x, memory):\n        return self.attn(x, memory, memory, need_weights=False)[0]"
                    ).replace("return [torch.randn(2, 16, 64)]", "return [torch.randn(2, 16, 64), torch.randn(2, 24, 64)]")


@pytest.mark.parametrize("source", [PACKED_PIECE, CROSS])
@pytest.mark.parametrize("options", [CodegenOptions(), CodegenOptions(cublaslt=False),
                                     CodegenOptions(cutlass=True, cublaslt=False, gpu="H200")])
def test_a_linear_over_a_piece_of_a_weight_reads_that_piece(source, options):
    """The product read the piece's weight from the parameter's start (its bias from the piece's):
    the first rows of the weight, 1.4 relative off. Cross-attention is a packed weight's second piece."""
    assert CROSS != MHA
    compiled = compile_task(task_from("packed_piece", source))
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, options)
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5
