"""MobileNet-style depthwise-separable block (inference): depthwise 3x3 conv, batch
norm, ReLU6, pointwise 1x1 conv, batch norm, ReLU6.

Batch norm runs with its running statistics (the block is put in eval mode at
construction), so the whole block is a fixed function of its input. Roughly
5-10 ms eagerly on an H100 in true fp32.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.depthwise = nn.Conv2d(in_channels, in_channels, 3, padding=1, groups=in_channels, bias=False)
        self.bn1 = nn.BatchNorm2d(in_channels)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        # Non-trivial running statistics, so that folding them is part of the work.
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            nn.init.uniform_(bn.weight, 0.5, 1.5)
            nn.init.uniform_(bn.bias, -0.2, 0.2)
        self.eval()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.clamp(self.bn1(self.depthwise(x)), 0.0, 6.0)
        return torch.clamp(self.bn2(self.pointwise(x)), 0.0, 6.0)


batch = 32
in_channels = 128
out_channels = 256
size = 112
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "in_channels": 4, "out_channels": 6, "size": 5}}


def get_inputs():
    return [torch.randn(batch, in_channels, size, size)]


def get_init_inputs():
    return [in_channels, out_channels]
