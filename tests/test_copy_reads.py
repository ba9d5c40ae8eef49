"""Copies read only through views that are strided views of the value beneath them
(schedule/copy_reads.py): nn.MultiheadAttention's packed Q/K/V copy goes, the products or the one
attention kernel read the projection straight, and every program still computes its reference
(run on the CPU through the IR evaluator and an emulation of the library calls)."""

from __future__ import annotations

import pytest
import torch

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.capture.graph import capture
from stitchcuda.compiler.ir.expr import Unsupported
from stitchcuda.compiler.lowering.lowered import CodegenOptions
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.compiler.schedule.simplify import simplify
from tests.test_offline_codegen import simulate, task_from

_INPUTS = "\n\ndef get_init_inputs():\n    return []\n"

MHA = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x):
        return self.net(x, x, x, need_weights=False)[0]

def get_inputs():
    return [torch.randn(2, 6, 32)]
''' + _INPUTS

# the packed heads laid out by a copy, then each of q, k, v picked from it; the copy before the
# output projection merges heads and sequence in an order no strides give, so it stays
PACKED_HEADS = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(24, 72)
        self.proj = nn.Linear(24, 24)

    def forward(self, x):
        b, s, e = x.shape
        qkv = self.qkv(x).view(b, s, 3, 3, 8).permute(2, 0, 3, 1, 4).contiguous()
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.softmax(q @ k.transpose(-2, -1) * 8 ** -0.5, dim=-1) @ v
        return self.proj(att.transpose(1, 2).contiguous().view(b, s, e))

def get_inputs():
    return [torch.randn(2, 5, 24)]
''' + _INPUTS

# a copy of a transposed value read as rows of another shape: a real layout, which stays
REAL_LAYOUT = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 8)

    def forward(self, x):
        y = x * 2.0
        return self.fc(y.transpose(1, 2).contiguous().view(x.shape[0], -1, 12))

def get_inputs():
    return [torch.randn(2, 12, 6)]
''' + _INPUTS


def _ops(graph):
    return [n.op for n in graph.nodes]


@pytest.mark.parametrize("fused_attention", [False, True])
def test_multihead_attentions_packed_copy_goes_and_the_program_still_computes_it(fused_attention):
    task = task_from("mha", MHA)
    graph = simplify(capture(task))
    strided = [n for n in graph.nodes if n.op == "stitchcuda.buffer_view"]
    assert len(strided) == 3, "q, k^T and v each one strided view of the in-projection"
    sources = {n.args[0] for n in strided}
    assert len(sources) == 1 and graph.meta(next(iter(sources))[1:]).shape == [2, 6, 96]
    clones = [n for n in graph.nodes if n.op == "aten.clone"]
    assert len(clones) == 1, "only the copy before the out-projection (heads merged with the sequence) stays"
    got, expected = simulate(task, graph, fuse(graph), CodegenOptions(fused_attention=fused_attention))
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


def test_the_copy_goes_in_every_launch_count():
    compiled = compile_task(task_from("mha", MHA))

    def launches(fused: bool) -> int:
        low = compiled.lowering(CodegenOptions(fused_attention=fused))
        return sum(1 for lg in low.groups for x in lg.launches() if x.kind != "alias" and not x.hoisted)

    assert (launches(False), launches(True)) == (6, 4)


def test_packed_heads_picked_from_a_copy_read_the_projection():
    task = task_from("packed", PACKED_HEADS)
    graph = simplify(capture(task))
    assert _ops(graph).count("stitchcuda.buffer_view") == 3
    assert _ops(graph).count("aten.clone") == 1  # the one before the projection stays
    got, expected = simulate(task, graph, fuse(graph))
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


TWO_COPIES = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 24)

    def forward(self, x):
        y = self.fc(x).view(2, 3, 4, 6).permute(0, 2, 1, 3).contiguous()  # a copy that goes ...
        z = y[:, 1].permute(2, 0, 1).contiguous()  # ... and a copy of a view of it, which stays
        return z[0] * 2.0

def get_inputs():
    return [torch.randn(2, 3, 8)]
''' + _INPUTS


def test_a_copy_of_a_view_of_a_dropped_copy_keeps_a_consistent_graph():
    task = task_from("two_copies", TWO_COPIES)
    graph = simplify(capture(task))
    names = {n.name for n in graph.nodes} | {p.name for p in graph.placeholders}
    assert all(v in names for n in graph.nodes for v in n.inputs())
    assert _ops(graph).count("stitchcuda.buffer_view") == 1 and _ops(graph).count("aten.clone") == 1
    got, expected = simulate(task, graph, fuse(graph))
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


def test_a_copy_read_as_rows_of_another_layout_stays():
    task = task_from("layout", REAL_LAYOUT)
    graph = simplify(capture(task))
    assert "stitchcuda.buffer_view" not in _ops(graph) and "aten.clone" in _ops(graph)
    got, expected = simulate(task, graph, fuse(graph))
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


USER_AS_STRIDED = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        y = x * 2.0
        return y.as_strided((3, 4, 5), (8, 5, 1)) + 1.0

def get_inputs():
    return [torch.randn(4, 12)]
''' + _INPUTS


def test_a_models_own_as_strided_stays_refused():
    """Its strides count over the storage under its operand, which the program's buffers need not
    share (a transpose lowered alone is a copy of its own): the buffer view is the compiler's alone."""
    with pytest.raises(Unsupported, match="as_strided"):
        compile_task(task_from("windows", USER_AS_STRIDED))
