"""Causal multi-head self-attention layer (GPT style, inference): input projection
to queries, keys and values, scaled scores, an explicit lower-triangular mask
applied with masked_fill, softmax, weighted sum of values and output projection.

The mask is a fixed buffer, so the layer is a pure function of its input. Cost is
split between the GEMMs and the memory-bound work on the 1 GiB score tensor
(16 x 16 x 1024 x 1024), which eager PyTorch writes and reads several times
(scale, mask, softmax). Roughly 7 ms eagerly on an H100 in true fp32: 16384 tokens
through 2 x 16384 x 1024 x 4096 = 137 GFLOP of projections plus 69 GFLOP of
attention matmuls (about 4 ms at 50 TFLOP/s), and about 8 GB of score traffic
(about 3 ms at 3 TB/s).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d_model: int, num_heads: int, max_seq_len: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.in_proj = nn.Linear(d_model, 3 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        mask = torch.tril(torch.ones(max_seq_len, max_seq_len, dtype=torch.bool))
        self.register_buffer("causal_mask", mask.view(1, 1, max_seq_len, max_seq_len), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.in_proj(x).split(d, dim=-1)
        q = q.reshape(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.reshape(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / self.head_dim**0.5)
        scores = scores.masked_fill(~self.causal_mask[:, :, :s, :s], float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, d)
        return self.out_proj(ctx)


batch = 16
num_heads = 16
seq_len = 1024
head_dim = 64
d_model = num_heads * head_dim
max_seq_len = seq_len  # the mask buffer's size
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "num_heads": 3, "seq_len": 7, "head_dim": 8}}


def get_inputs():
    return [torch.randn(batch, seq_len, d_model)]


def get_init_inputs():
    return [d_model, num_heads, max_seq_len]
