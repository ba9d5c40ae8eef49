"""Outputs that are reshapes of a computed value (lowering/output_views.py): the value's own kernel
writes the output's buffer and the view is no kernel; a value two outputs view is copied for the
second; a value computed from the weights alone is then computed each call, not once with the packs."""

from __future__ import annotations

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.lowering.lower import lower
from tests.test_offline_codegen import assert_program_compiles, simulate, task_from

SOURCE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 24) / 5)
        self.scale = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        y = torch.relu(x @ self.w.t())
        z = torch.softmax(x, dim=-1)
        return (y.view(x.shape[0], -1), torch.flatten(z, 1), z.view(-1), torch.exp(self.scale).view(-1),
                (x * 2).sum(-1).unsqueeze(-1))

def get_inputs():
    return [torch.randn(5, 6, 24)]

def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def compiled():
    return compile_task(task_from("output_views", SOURCE))


def _copies(c):
    """The outputs whose group is lowered as a kernel, and those lowered as an alias."""
    low = lower(c.graph, c.groups)
    kinds = {}
    for lg in low.groups:
        for o in set(lg.group.nodes) & set(c.graph.outputs):
            kinds[o] = lg.kind
    return low, kinds


def test_a_reshape_of_a_computed_value_is_no_kernel(compiled):
    low, kinds = _copies(compiled)
    names = compiled.graph.outputs
    assert kinds[names[0]] == "alias"  # the product's epilogue writes the output
    # z is viewed by two outputs: the first takes its buffer, the second copies it
    assert [kinds[n] for n in names[1:3]] == ["alias", "pointwise"]
    # exp(scale), from the weights alone, is written into the output each call, not once with the packs
    assert kinds[names[3]] == "alias"
    exp = next(lg for lg in low.groups if any(compiled.graph.node(n).op == "aten.exp" for n in lg.group.nodes))
    assert not exp.hoisted
    assert kinds[names[4]] == "row"  # a view its row kernel writes through
    assert len({ident for _, ident, _ in low.outputs}) == len(names)


def test_the_outputs_computed_in_place_are_the_reference(compiled):
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups)
    for g, e in zip(got, expected, strict=True):
        assert ((g - e).abs().max() / e.abs().max()).item() < 1e-5


@pytest.mark.nvcc
def test_the_program_compiles(compiled, tmp_path):
    assert_program_compiles(compiled.program(), tmp_path)
