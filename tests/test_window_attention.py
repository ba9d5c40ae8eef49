"""Swin's window attention, compiled whole: Q, K and V read as strided views straight out of the
QKV product, a relative position bias and a shifted-window mask added through a reshape of the
scores ([B*W, H, N, N] -> [B, W, H, N, N] and back), softmax, P.V. The row kernel between the two
products runs over the finer of the two shapes; a lone product of strided 4-D operands is one
strided-batched call, not a decomposition into bmm, and so is a linear over a sequence-first view
of a batch-first value; a relative position bias gathered from a computed table is viewed in the
gathering kernel; a reshape of a copy's permute is the copy's own kernel; a norm over a transposed view rows as its input
does (the patch embedding of HF's Swin)."""

from __future__ import annotations

import pytest

from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from tests.test_offline_codegen import simulate, task_from

WINDOWS = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, width=32, heads=2, tokens=16, windows=4):
        super().__init__()
        self.heads, self.windows, self.scale = heads, windows, (width // heads) ** -0.5
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.bias_table = nn.Parameter(0.1 * torch.randn(heads, tokens, tokens))
        self.register_buffer("mask", (torch.rand(windows, tokens, tokens) > 0.7).float() * -100.0)

    def forward(self, x):  # [batch x windows, tokens, width]
        bw, n, c = x.shape
        qkv = self.qkv(x).reshape(bw, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale).matmul(k.transpose(-2, -1))
        attn = attn + self.bias_table.unsqueeze(0)
        attn = attn.view(bw // self.windows, self.windows, self.heads, n, n) + self.mask.unsqueeze(1).unsqueeze(0)
        attn = attn.view(-1, self.heads, n, n).softmax(dim=-1)
        return self.proj(attn.matmul(v).transpose(1, 2).reshape(bw, n, c))


def get_inputs():
    return [torch.randn(8, 16, 32)]


def get_init_inputs():
    return []
'''

STRIDED_PRODUCT = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, width=32, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        return torch.tanh(qkv[0].matmul(qkv[1].transpose(-2, -1)))


def get_inputs():
    return [torch.randn(3, 12, 32)]


def get_init_inputs():
    return []
'''

SEQUENCE_FIRST = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(width, width)

    def forward(self, x):  # batch-first in, sequence-first out, split into heads as MHA does
        b, s, e = x.shape
        return self.query(torch.layer_norm(x, (e,)).transpose(0, 1)).view(s, b * self.heads, e // self.heads)


def get_inputs():
    return [torch.randn(3, 10, 32)]


def get_init_inputs():
    return []
'''

BIAS_FROM_A_TABLE = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, heads=3, window=4):
        super().__init__()
        self.heads, self.tokens = heads, window * window
        span = torch.arange(-(window - 1), window).float()
        self.register_buffer("coords", torch.stack(torch.meshgrid(span, span, indexing="ij"), -1).view(-1, 2))
        pos = torch.stack(torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")).flatten(1)
        rel = (pos[:, :, None] - pos[:, None, :]).permute(1, 2, 0) + (window - 1)
        self.register_buffer("index", (rel[..., 0] * (2 * window - 1) + rel[..., 1]).flatten())
        self.mlp = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, heads))

    def forward(self, scores):  # SwinV2's continuous position bias: an MLP's table, gathered per call
        table = self.mlp(self.coords)
        bias = table[self.index].view(self.tokens, self.tokens, self.heads).permute(2, 0, 1).contiguous()
        return scores + 16 * torch.sigmoid(bias).unsqueeze(0)


def get_inputs():
    return [torch.randn(2, 3, 16, 16)]


def get_init_inputs():
    return []
'''

BLOCK_PARTITION = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):  # MaxViT's block partition: a copy's permute, then a reshape of the copy
        b, c, h, w = x.shape
        p = 4
        x = torch.relu(x)
        blocks = x.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).contiguous()
        tokens = blocks.view(b, (h // p) * (w // p), p * p, c)
        return torch.layer_norm(tokens, (c,)) + tokens


def get_inputs():
    return [torch.randn(2, 8, 16, 12)]


def get_init_inputs():
    return []
'''

PATCH_NORM = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, 24, 4, stride=4)
        self.norm = nn.LayerNorm(24)

    def forward(self, x):
        return self.norm(self.embed(x).flatten(2).transpose(1, 2))


def get_inputs():
    return [torch.randn(2, 3, 32, 32)]


def get_init_inputs():
    return []
'''


def _close(compiled, options=None):
    got, expected = simulate(compiled.task, compiled.graph, compiled.groups, options or CodegenOptions())
    for g, e in zip(got, expected, strict=True):
        assert ((g - e).abs().max() / e.abs().max()).item() < 1e-5


@pytest.fixture(scope="module")
def windows():
    return compile_task(task_from("shifted_windows", WINDOWS))


def test_shifted_window_attention_is_one_attention_group(windows):
    assert not windows.isolated and not windows.decomposed
    (attention,) = [g for g in windows.groups if g.kind == "attention"]
    ops = [n.op for n in windows.graph.nodes if n.name in set(attention.nodes)]
    assert ops.count("aten.matmul") == 2 and "aten.softmax" in ops


@pytest.mark.parametrize("options", [CodegenOptions(), CodegenOptions(cutlass=True, split_tf32=False, cublaslt=False,
                                                                      gpu="H200")])
def test_shifted_window_attention_computes_the_reference(windows, options):
    _close(windows, options)


def test_a_product_of_strided_4d_operands_is_one_call():
    compiled = compile_task(task_from("strided_product", STRIDED_PRODUCT))
    assert not compiled.decomposed and not compiled.isolated
    _close(compiled)


def test_a_linear_over_a_sequence_first_view_is_one_call_a_batch():
    """nn.MultiheadAttention's query projection of a batch-first value, whose head split no longer
    views the product once the transpose moves after it: B products of S rows each."""
    compiled = compile_task(task_from("sequence_first", SEQUENCE_FIRST))
    assert not compiled.isolated
    _close(compiled)


def test_a_view_of_a_gathered_table_is_read_in_the_gathering_kernel():
    compiled = compile_task(task_from("bias_from_a_table", BIAS_FROM_A_TABLE))
    assert not compiled.isolated
    (gather,) = [g for g in compiled.groups if any(n.startswith("index") for n in g.nodes)]
    ops = {n.op for n in compiled.graph.nodes if n.name in set(gather.nodes)}
    assert {"aten.index", "aten.view", "aten.permute"} <= ops
    _close(compiled)


def test_a_reshape_of_a_copy_lowers_in_the_copy_kernel():
    """Where fusion puts the reshape of a copy in the copy's group (MaxViT's partition, read by its
    norm and its residual), the copy kernel runs over the permuted shape and stores the reshape."""
    from stitchcuda.compiler.capture.graph import capture
    from stitchcuda.compiler.schedule.fusion import fuse
    from stitchcuda.compiler.schedule.simplify import simplify

    task = task_from("block_partition", BLOCK_PARTITION)
    graph = simplify(capture(task))
    groups = fuse(graph)
    (copy,) = [g for g in groups if "clone" in g.nodes]
    (reader,) = [g for g in groups if "view_1" in g.nodes]
    reader.nodes.remove("view_1")
    copy.nodes.append("view_1")
    got, expected = simulate(task, graph, groups, CodegenOptions())
    assert ((got[0] - expected[0]).abs().max() / expected[0].abs().max()).item() < 1e-5


def test_a_norm_over_a_transposed_view_rows_as_its_input():
    compiled = compile_task(task_from("patch_norm", PATCH_NORM))
    assert not compiled.isolated
    _close(compiled)
