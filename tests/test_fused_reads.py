"""Reads the consuming kernel makes itself instead of a kernel laying them out first: BERT's
embedding lookups summed before its first norm are gathered inside the norm's row kernel, and
Whisper's contiguous copies of the heads are read through strides by the attention's products."""

from __future__ import annotations

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from tests.test_offline_codegen import simulate, task_from

EMBEDDINGS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, vocab=50, width=32, positions=16):
        super().__init__()
        self.words = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(positions, width)
        self.norm = nn.LayerNorm(width)
        self.register_buffer("position_ids", torch.arange(positions)[None, :])

    def forward(self, ids):
        embedded = self.words(ids) + self.positions(self.position_ids[:, : ids.shape[1]])
        return self.norm(embedded)


def get_inputs():
    return [torch.randint(0, 50, (3, 12))]


def get_init_inputs():
    return []
'''


def test_embedding_lookups_are_read_in_the_norms_row_kernel():
    compiled = compile_task(task_from("embeddings", EMBEDDINGS))
    (norm,) = [g for g in compiled.groups if g.kind == "row_reduce"]
    ops = {n.op for n in compiled.graph.nodes if n.name in set(norm.nodes)}
    assert {"aten.embedding", "aten.layer_norm"} <= ops
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


CONTIGUOUS_HEADS = '''
import torch
import torch.nn as nn


class Model(nn.Module):  # Whisper's attention: heads split with .transpose(1, 2).contiguous()
    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads, self.dim = heads, width // heads
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width, bias=False), nn.Linear(width, width)

    def split(self, x):
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.dim).transpose(1, 2).contiguous()

    def forward(self, x):
        q, k, v = self.split(self.q(x) * self.dim ** -0.5), self.split(self.k(x)), self.split(self.v(x))
        attn = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return (attn @ v).transpose(1, 2).reshape(x.shape)


def get_inputs():
    return [torch.randn(2, 10, 32)]


def get_init_inputs():
    return []
'''


def test_contiguous_copies_of_the_heads_are_read_through_strides_by_attention():
    compiled = compile_task(task_from("contiguous_heads", CONTIGUOUS_HEADS))
    clones = {n.name for n in compiled.graph.nodes if n.op == "aten.clone"}
    (attention,) = [g for g in compiled.groups if g.kind == "attention"]
    # the three heads' copies and the output's (written in its layout by P.V): no copy kernel
    assert len(clones) == 4 and clones <= set(attention.nodes)
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5
