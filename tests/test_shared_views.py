"""Attention prologues fused as a CUDA engineer would: a view several elementwise kernels read is
one view per reader (schedule/shared_views.py), and the rotary embedding of Q and K stays out of
the attention group, whose kernel takes only views and constant scales before Q.K^T. A Llama-style
block of our own: merged Q/K/V, rotary halves (slice, neg, cat), a causal mask, softmax, P.V."""

from __future__ import annotations

import collections

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.capture.graph import capture
from stitchcuda.compiler.emit.codegen import CodegenOptions
from stitchcuda.compiler.schedule.fusion import fuse
from stitchcuda.compiler.schedule.shared_views import split_shared_views
from stitchcuda.compiler.schedule.simplify import drop_identity_clones
from tests.test_offline_codegen import simulate, task_from

ROTARY = '''
import torch
import torch.nn as nn


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Model(nn.Module):
    def __init__(self, width=64, heads=4):
        super().__init__()
        self.heads, self.dim = heads, width // heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.dim, 2).float() / self.dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.dim).permute(2, 0, 3, 1, 4).unbind(0)
        angles = torch.arange(s, device=x.device).float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((angles, angles), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = (q @ k.transpose(-1, -2)) * self.dim ** -0.5
        mask = torch.triu(torch.ones(s, s, device=x.device, dtype=torch.bool), diagonal=1)
        attn = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.out((attn @ v).transpose(1, 2).reshape(b, s, w))


def get_inputs():
    return [torch.randn(2, 16, 64)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def compiled():
    return compile_task(task_from("rotary_block", ROTARY))


def test_the_attention_group_lowers_whole_with_the_rotary_work_outside(compiled):
    assert not compiled.isolated  # no group had to be split apart for the lowering
    attention = [g for g in compiled.groups if g.kind == "attention"]
    assert len(attention) == 1
    ops = {n.op for n in compiled.graph.nodes if n.name in set(attention[0].nodes)}
    assert "aten.cat" not in ops and "aten.neg" not in ops  # the rotary halves are the prologue's, not the kernel's


def test_a_view_read_by_several_elementwise_kernels_is_one_view_each():
    graph = drop_identity_clones(capture(task_from("rotary_block", ROTARY)))
    split = split_shared_views(graph)
    copies = [n for n in split.nodes if "__r" in n.name]
    assert copies and all(n.op.startswith("aten.") for n in copies)
    readers = collections.Counter()
    for n in split.nodes:
        for a in n.args:
            if isinstance(a, str) and a.startswith("%"):
                readers[a[1:]] += 1
    assert all(readers[c.name] == 1 for c in copies)  # each copy has its one reader
    before = collections.Counter(g.kind for g in fuse(graph))["data_movement"]
    after = collections.Counter(g.kind for g in fuse(split))["data_movement"]
    assert after < before
    assert split_shared_views(split) is split  # nothing left to split: the graph comes back as it was


def test_the_program_computes_the_reference(compiled):
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    for g, e in zip(got, expected, strict=True):
        e = e if hasattr(e, "shape") else e[0]
        assert ((g - e).abs().max() / e.abs().max()).item() < 1e-5


PARTIAL = ROTARY.replace(
    "        q = q * cos + rotate_half(q) * sin\n        k = k * cos + rotate_half(k) * sin\n",
    "        rot = self.dim // 2  # GPT-NeoX's partial rotary: a split into the turned part and the rest\n"
    "        (q, q_pass), (k, k_pass) = q.split([rot, self.dim - rot], -1), k.split([rot, self.dim - rot], -1)\n"
    "        cos, sin = cos[..., :rot], sin[..., :rot]\n"
    "        q = torch.cat((q * cos + rotate_half(q) * sin, q_pass), dim=-1)\n"
    "        k = torch.cat((k * cos + rotate_half(k) * sin, k_pass), dim=-1)\n")


def test_a_split_is_slices_so_its_pieces_go_wherever_they_are_read():
    from stitchcuda.compiler.ir.ops import SPLITS

    assert PARTIAL != ROTARY
    compiled = compile_task(task_from("partial_rotary", PARTIAL))
    assert not [n for n in compiled.graph.nodes if n.op in SPLITS] and not compiled.isolated
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


def test_each_rotary_embedding_is_one_kernel(compiled):
    """rotate_half's ``cat(-x2, x1)`` is ``cat(x2, x1)`` times a constant of -1 and 1, read piece
    by piece by the kernel that applies the rotation: Q's rotation one kernel, K's another."""
    ops = {n.name: n.op for n in compiled.graph.nodes}
    assert "aten.neg" not in ops.values()
    signs = [p for p in compiled.graph.placeholders if p.name.startswith("_signs_")]
    assert len(signs) == 2 and all(compiled.graph.constants[p.target] == [-1.0] * 8 + [1.0] * 8 for p in signs)
    rotations = [g for g in compiled.groups if any(n.endswith("__unsigned") for n in g.nodes)]
    assert len(rotations) == 2 and all(g.kind == "elementwise" for g in rotations)
