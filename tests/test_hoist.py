"""Projections of one input merged into one product (schedule/horizontal.py), and the work that
depends on the weights alone launched with the packs instead of on every call (lowering/hoist.py).
On the GPU: tests/test_gpu.py::test_packed_weights_follow_every_change."""

from __future__ import annotations

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
from stitchcuda.compiler.emit.program import program_spec, split_cuda
from stitchcuda.compiler.lowering.hoist import static_values
from stitchcuda.compiler.lowering.lower import lower
from stitchcuda.task.record import Task
from tests.test_offline_codegen import _compile_together, cuda_source

# attention with separate q/k/v projections, positions from a buffer through an embedding (what
# BERT does), and a gate/up pair without bias (Llama's MLP)
PROJECTIONS = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, d=64, heads=4, hidden=96, seq=16):
        super().__init__()
        self.heads = heads
        self.pos = nn.Embedding(seq, d)
        self.register_buffer("positions", torch.arange(seq).unsqueeze(0))
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        x = x + self.pos(self.positions[:, :s])
        split = lambda t: t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.down(F.silu(self.gate(x)) * self.up(x))


def get_inputs():
    return [torch.randn(2, 16, 64)]


def get_init_inputs():
    return []
'''


def _compiled(source: str = PROJECTIONS, name: str = "projections"):
    task = Task(name=name, source=source)
    return task, compile_task(task)


def test_linears_of_one_input_become_one_product_over_concatenated_weights():
    _, compiled = _compiled()
    graph = compiled.graph
    linears = [n for n in graph.nodes if n.op == "aten.linear"]
    merged = [n for n in linears if n.name.endswith("_merged")]
    # q/k/v (with bias) and gate/up (without) merged; o and down read other inputs
    assert len(merged) == 2 and len(linears) == 4
    widths = sorted(n.out[0].shape[-1] for n in merged)
    assert widths == [192, 192]
    cats = [n for n in graph.nodes if n.op == "aten.cat"]
    assert len(cats) == 3  # q/k/v weights and biases, gate/up weights
    slices = [n for n in graph.nodes if n.op == "aten.slice" and n.args[0] in {"%" + m.name for m in merged}]
    assert [(n.args[2], n.args[3]) for n in slices] == [(0, 64), (64, 128), (128, 192), (0, 96), (96, 192)]


def test_linears_of_different_widths_biases_or_returned_stay_apart():
    source = PROJECTIONS.replace("self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)",
                                 "self.v = nn.Linear(d, d), nn.Linear(d, d, bias=False), nn.Linear(d, d)")
    _, compiled = _compiled(source)
    merged = [n for n in compiled.graph.nodes if n.op == "aten.linear" and n.name.endswith("_merged")]
    assert sorted(n.out[0].shape[-1] for n in merged) == [128, 192]  # q and v; gate and up
    returned = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x), self.b(x)


def get_inputs():
    return [torch.randn(4, 8)]


def get_init_inputs():
    return []
'''
    _, compiled = _compiled(returned, "returned")
    assert not any(n.name.endswith("_merged") for n in compiled.graph.nodes)


def test_work_on_the_weights_alone_runs_with_the_packs():
    task, compiled = _compiled()
    static = static_values(compiled.graph)
    assert any(n.op == "aten.cat" for n in compiled.graph.nodes if n.name in static)
    assert not any(n.op == "aten.linear" and n.name in static for n in compiled.graph.nodes)
    low = lower(compiled.graph, compiled.groups, CodegenOptions())
    hoisted = [lg for lg in low.groups if lg.hoisted]
    assert len(hoisted) >= 3  # the concatenations and the position embedding
    assert all(lg.kind != "gemm" for lg in hoisted)
    program = generate(task, compiled.graph, compiled.groups, CodegenOptions())
    head, _ = split_cuda(cuda_source(program))
    packs = head[head.index("void pack_weights("):]
    per_call = head[head.index("void launch_all("):head.index("void pack_weights(")]
    assert packs.count("<<<") >= 3 and "from the weights alone: launched with the packs" in per_call
    # the key of the packs holds every tensor the hoisted launches read (weights, biases, the buffer)
    spec = program_spec(program)
    packed = {spec.names[i] for i in spec.packed}
    for name in ("p_q_weight", "p_k_bias", "p_gate_weight", "p_pos_weight", "b_positions"):
        assert name in packed, name
    assert "compute from the weights alone" in program and "[from the weights alone: run when they change]" in program


def test_without_packs_nothing_is_hoisted():
    _, compiled = _compiled()
    low = lower(compiled.graph, compiled.groups, CodegenOptions(pack_weights=False))
    assert not any(lg.hoisted for lg in low.groups)


def test_a_buffer_the_forward_writes_back_is_not_static():
    from tests.test_state_update import TRAINING_BN_TASK

    graph = _compiled(TRAINING_BN_TASK, "training_bn")[1].graph
    written = set(graph.mutations.values())
    assert written and not written & static_values(graph)
    readers = {n.name for n in graph.nodes if any(i in written for i in n.inputs())}
    assert readers and not readers & static_values(graph)


@pytest.mark.nvcc
def test_a_hoisting_program_compiles_for_sm90(tmp_path):
    task, compiled = _compiled()
    _compile_together([cuda_source(generate(task, compiled.graph, compiled.groups, CodegenOptions()))], tmp_path)


ROTARY = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d=16, seq=32):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)), persistent=False)
        self.seq = seq

    def forward(self, x):
        positions = torch.arange(self.seq, dtype=torch.float32)
        freqs = self.inv_freq[:, None] @ positions[None, :]
        return x * freqs.t().cos()


def get_inputs():
    return [torch.randn(4, 32, 8)]


def get_init_inputs():
    return []
'''


def test_what_reads_a_static_product_stays_per_call():
    """Rotary tables written as a product (inv_freq[:, None] @ positions[None, :]): static, but a
    library call makes it on every call, so the cosine that reads it cannot run with the packs
    before it exists."""
    _, compiled = _compiled(ROTARY, "rotary")
    static = static_values(compiled.graph)
    low = lower(compiled.graph, compiled.groups, CodegenOptions())
    gemm_groups = [lg for lg in low.groups if any(x.gemm is not None for x in lg.launches())]
    assert gemm_groups and all(n in static for lg in gemm_groups for n in lg.group.nodes)
    made_per_call = {n for lg in low.groups if not lg.hoisted for n in lg.group.nodes}
    for lg in low.groups:
        if lg.hoisted:
            reads = {i for n in lg.group.nodes for i in compiled.graph.node(n).inputs()} - set(lg.group.nodes)
            assert not reads & made_per_call, lg.describe
