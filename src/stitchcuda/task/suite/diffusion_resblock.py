"""Diffusion-model (DDPM/UNet-style) residual block (inference): GroupNorm, SiLU,
conv3x3, plus a projection of the time embedding (SiLU, linear) broadcast over
the image, then GroupNorm, SiLU, conv3x3, and a 1x1 convolution on the skip path
because the channel count changes.

Takes two inputs, the feature map and the per-sample time embedding. The two 3x3
convolutions dominate; each GroupNorm is a two-pass reduction over a 67-134 MB
activation, and the norm, SiLU and time-embedding add are memory-bound passes
that a fused version folds around the convolutions. Roughly 3-4 ms eagerly on an
H100 in true fp32: 2 x 16 x 4096 x 9 x (128 x 256 + 256 x 256) = 116 GFLOP of 3x3
and 4.3 GFLOP of 1x1 convolution (about 2.4 ms at 50 TFLOP/s), and about 1 GB of
norm and activation traffic (0.3 ms).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, time_dim: int, groups: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.time_proj = nn.Linear(time_dim, out_channels)
        self.norm2 = nn.GroupNorm(groups, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.skip = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, t_emb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.time_proj(F.silu(t_emb))[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return self.skip(x) + h


batch = 16
in_channels = 128
out_channels = 256
size = 64
time_dim = 512
groups = 32
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "in_channels": 8, "out_channels": 12, "size": 5, "time_dim": 7, "groups": 4}}


def get_inputs():
    return [torch.randn(batch, in_channels, size, size), torch.randn(batch, time_dim)]


def get_init_inputs():
    return [in_channels, out_channels, time_dim, groups]
