"""Squeeze-and-excitation residual block (inference): conv3x3, batch norm, ReLU,
conv1x1, batch norm, then squeeze-and-excitation (global average pool, a reducing
linear, ReLU, an expanding linear, sigmoid, per-channel rescale), identity
shortcut added, ReLU.

Batch norm runs with its running statistics (the block is put in eval mode at
construction), so the block is a fixed function of its input. The 3x3 convolution
dominates the arithmetic; the global pool is a reduction that the channel rescale
must wait for, which splits any fusion in two. Roughly 2-3 ms eagerly on an H100
in true fp32: 2 x 64 x 256 x 256 x 9 x 28 x 28 = 59 GFLOP for the 3x3 and
6.6 GFLOP for the 1x1 convolution (about 1.3 ms at 50 TFLOP/s), and about 1 GB of
batch-norm, pool, rescale and residual traffic over a 51 MB activation (0.4 ms).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int, reduction: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.se_reduce = nn.Linear(channels, channels // reduction)
        self.se_expand = nn.Linear(channels // reduction, channels)
        # Non-trivial running statistics, so that folding them is part of the work.
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            nn.init.uniform_(bn.weight, 0.5, 1.5)
            nn.init.uniform_(bn.bias, -0.2, 0.2)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        squeeze = out.mean(dim=(2, 3))
        excite = torch.sigmoid(self.se_expand(torch.relu(self.se_reduce(squeeze))))
        out = out * excite[:, :, None, None]
        return torch.relu(out + x)


batch = 64
channels = 256
size = 28
reduction = 16
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "channels": 8, "size": 5, "reduction": 4}}


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return [channels, reduction]
