"""Pre-LayerNorm transformer encoder block (inference): multi-head self-attention
written out operator by operator, then a GELU MLP, each behind a residual.

The attention is explicit: one fused QKV projection, the head split, scaled
dot-product scores, a softmax over the keys, the weighted sum of the values, the
head merge and the output projection. The four token-wise GEMMs dominate the cost;
the score tensor (8 x 12 x 512 x 512, 100 MB) makes the softmax a memory-bound
middle step. Roughly 2 ms eagerly on an H100 in true fp32: 4096 tokens through
projections and MLP of 2 x 4096 x 768 x (2304 + 768 + 2 x 3072) = 58 GFLOP plus
6.4 GFLOP of batched attention matmuls (about 1.3 ms at 50 TFLOP/s), and about
0.6 GB of score, softmax and LayerNorm traffic (0.2 ms).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, d_model: int, num_heads: int, mlp_ratio: int):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, mlp_ratio * d_model)
        self.fc2 = nn.Linear(mlp_ratio * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.norm1(x)
        qkv = self.qkv(h).reshape(b, s, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) * (self.head_dim**-0.5)
        attn = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(ctx)
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return x


batch = 8
seq_len = 512
d_model = 768
num_heads = 12
mlp_ratio = 4
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "seq_len": 6, "d_model": 24, "num_heads": 4}}


def get_inputs():
    return [torch.randn(batch, seq_len, d_model)]


def get_init_inputs():
    return [d_model, num_heads, mlp_ratio]
