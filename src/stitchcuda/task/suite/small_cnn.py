"""Small image classifier (inference): three stages of conv3x3 + ReLU + 2x2 max
pool, then flatten and a two-layer classifier head with a ReLU between.

The second and third convolutions dominate the arithmetic; the first stage,
with 3 input channels, is memory-bound on its 268 MB output, which eager PyTorch
writes, rewrites through ReLU and reads again for the pool. Roughly 3 ms eagerly
on an H100 in true fp32: convolutions of 3.6 + 38.7 + 38.7 GFLOP and a 4.3 GFLOP
head, 85 GFLOP in all (about 2 ms at 50 TFLOP/s), and about 1.5 GB of
activation traffic (0.5 ms).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels: int, base_width: int, image_size: int, hidden: int, num_classes: int):
        super().__init__()
        # Three stages, the width doubling at each: base_width, 2 x base_width, 4 x base_width.
        widths = [base_width, 2 * base_width, 4 * base_width]
        self.convs = nn.ModuleList()
        prev = in_channels
        for w in widths:
            self.convs.append(nn.Conv2d(prev, w, 3, padding=1))
            prev = w
        final_size = image_size // (2 ** len(widths))
        self.fc1 = nn.Linear(prev * final_size * final_size, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.max_pool2d(torch.relu(conv(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(torch.relu(self.fc1(x)))


batch = 256
in_channels = 3
image_size = 64
base_width = 64
hidden = 512
num_classes = 100
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "image_size": 16, "base_width": 3, "hidden": 10, "num_classes": 5}}


def get_inputs():
    return [torch.randn(batch, in_channels, image_size, image_size)]


def get_init_inputs():
    return [in_channels, base_width, image_size, hidden, num_classes]
