"""Reads the consuming kernel makes itself instead of a kernel laying them out first: BERT's
embedding lookups summed before its first norm are gathered inside the norm's row kernel, and
Whisper's contiguous copies of the heads and Llama's repeated key heads are read through strides
by the attention's products."""

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
    clones = {n.name for n in compiled.graph.nodes if n.op in ("aten.clone", "stitchcuda.buffer_view")}
    (attention,) = [g for g in compiled.groups if g.kind == "attention"]
    # the three heads' copies (K's transposed read of its projection a buffer view: schedule/copy_reads.py)
    # and the output's (written in its layout by P.V): no copy kernel
    assert len(clones) == 4 and clones <= set(attention.nodes)
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


REPEATED_HEADS = '''
import torch
import torch.nn as nn


def repeat_kv(x, times):  # Llama's grouped-query attention: each key/value head serves several queries
    b, heads, s, d = x.shape
    return x[:, :, None, :, :].expand(b, heads, times, s, d).reshape(b, heads * times, s, d)


class Model(nn.Module):
    def __init__(self, width=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width, bias=False)
        self.kv = nn.Linear(width, 2 * kv_heads * self.dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2 * self.kv_heads, self.dim).transpose(1, 2).chunk(2, dim=1)
        q, k = torch.tanh(q), torch.tanh(k)  # computed, as a rotary embedding's outputs are
        k, v = repeat_kv(k, self.heads // self.kv_heads), repeat_kv(v, self.heads // self.kv_heads)
        attn = torch.softmax(q @ k.transpose(-1, -2) * self.dim ** -0.5, dim=-1)
        return (attn @ v).transpose(1, 2).reshape(b, s, -1)


def get_inputs():
    return [torch.randn(2, 10, 32)]


def get_init_inputs():
    return []
'''


def test_repeated_key_heads_are_read_in_place_by_the_product():
    """Q.K^T reads the expanded key heads through a stride of 0 (two batch dims); P.V, whose value
    heads are also strided by the projection's layout, would need three, so they are laid out first
    by the group's own copy kernel, as repeat_kv's reshape did."""
    from stitchcuda.compiler.lowering.lower import lower

    compiled = compile_task(task_from("repeated_heads", REPEATED_HEADS))
    assert not compiled.isolated
    (attention,) = [g for g in compiled.groups if g.kind == "attention"]
    clones = {n.name for n in compiled.graph.nodes if n.op == "aten.clone"}
    assert len(clones) >= 2 and {c for c in clones if c in attention.nodes}
    low = lower(compiled.graph, compiled.groups, CodegenOptions())
    (lowered,) = [x for x in low.groups if x.group.id == attention.id]
    copies = [p for p in lowered.parts if p.kind == "pointwise"]
    assert len(copies) == 1 and "laid out" in copies[0].describe  # V's; K read in place
    for options in (CodegenOptions(), CodegenOptions(cutlass=True, split_tf32=False, cublaslt=False, gpu="H200")):
        got, expected = simulate(compiled.task, compiled.graph, compiled.groups, options)
        assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


RETURNED_ATTENTION = '''
import torch
import torch.nn as nn


class Model(nn.Module):  # KernelBench's scaled_dot_product_attention task: P.V is what the forward returns
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.rand(2, 3, 16, 32), torch.rand(2, 3, 16, 32), torch.rand(2, 3, 16, 32)]


def get_init_inputs():
    return []
'''


def test_an_attention_whose_output_is_returned_is_one_group():
    compiled = compile_task(task_from("returned_attention", RETURNED_ATTENTION))
    assert not compiled.isolated
    assert [g.kind for g in compiled.groups if g.kind != "data_movement"] == ["attention"]
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5
