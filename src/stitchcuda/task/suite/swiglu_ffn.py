"""LLaMA-style feed-forward sublayer (inference): RMSNorm written out (mean of
squares, rsqrt, learned scale), SwiGLU (SiLU of a gate projection times an up
projection), down projection, residual add.

The three bias-free GEMMs dominate; RMSNorm and the SwiGLU product are
memory-bound passes (the 8192 x 5632 intermediates are 185 MB each) that a fused
version folds into the GEMM prologue and epilogue. Roughly 12 ms eagerly on an
H100 in true fp32: 3 x 2 x 8192 x 2048 x 5632 = 567 GFLOP (about 11 ms at
50 TFLOP/s) and about 1.5 GB of elementwise traffic (0.5 ms).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, d_model: int, ffn_hidden: int, eps: float):
        super().__init__()
        self.eps = eps
        self.norm_weight = nn.Parameter(1.0 + 0.1 * torch.randn(d_model))
        self.gate_proj = nn.Linear(d_model, ffn_hidden, bias=False)
        self.up_proj = nn.Linear(d_model, ffn_hidden, bias=False)
        self.down_proj = nn.Linear(ffn_hidden, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.norm_weight
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


batch = 4
seq_len = 2048
d_model = 2048
ffn_hidden = 5632
eps = 1e-6
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "seq_len": 3, "d_model": 48, "ffn_hidden": 80}}


def get_inputs():
    return [torch.randn(batch, seq_len, d_model)]


def get_init_inputs():
    return [d_model, ffn_hidden, eps]
