"""ResNet basic block (inference): conv3x3, batch norm, ReLU, conv3x3, batch norm,
identity shortcut added, ReLU.

Batch norm runs with its running statistics (the block is put in eval mode at
construction), so the block is a fixed function of its input. The two 3x3
convolutions dominate; batch norms, ReLUs and the residual add are memory-bound
passes over a 103 MB activation that a fused version folds into the convolutions.
Roughly 2-3 ms eagerly on an H100 in true fp32: two convolutions of
2 x 128 x 64 x 64 x 9 x 56 x 56 = 29.6 GFLOP each (about 1.2 ms at 50 TFLOP/s,
more at the lower efficiency of 64-channel convolutions) and about 1 GB of
elementwise traffic (0.3 ms).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
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
        return torch.relu(out + x)


batch = 128
channels = 64
size = 56
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "channels": 4, "size": 6}}


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return [channels]
