"""Tiny U-Net for segmentation (inference): two encoder stages of double conv3x3 +
ReLU with 2x2 max-pool downsampling, a double-conv bottleneck, two decoder stages
that upsample with a stride-2 ConvTranspose2d, concatenate the matching encoder
output (skip connection) and apply a double conv, and a final 1x1 convolution to
per-pixel class logits.

Many medium-sized convolutions at three resolutions with narrow channel counts
(32-128), so no single kernel dominates; the skip concatenations and the ReLUs
are extra full-resolution memory passes that a fused version can avoid by
writing the upsampled output straight into the concatenated buffer. Roughly 2-4 ms
eagerly on an H100 in true fp32: about 51 GFLOP of convolutions (the heaviest two,
the first conv of each decoder stage, 9.7 GFLOP each), which narrow-channel
convolutions run well below 50 TFLOP/s, plus about 1 GB of activation,
concatenation and pooling traffic over 34 MB full-resolution tensors.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels: int, base_width: int, num_classes: int):
        super().__init__()
        w1, w2, w3 = base_width, 2 * base_width, 4 * base_width
        self.enc1a = nn.Conv2d(in_channels, w1, 3, padding=1)
        self.enc1b = nn.Conv2d(w1, w1, 3, padding=1)
        self.enc2a = nn.Conv2d(w1, w2, 3, padding=1)
        self.enc2b = nn.Conv2d(w2, w2, 3, padding=1)
        self.mid_a = nn.Conv2d(w2, w3, 3, padding=1)
        self.mid_b = nn.Conv2d(w3, w3, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(w3, w2, 2, stride=2)
        self.dec2a = nn.Conv2d(2 * w2, w2, 3, padding=1)
        self.dec2b = nn.Conv2d(w2, w2, 3, padding=1)
        self.up1 = nn.ConvTranspose2d(w2, w1, 2, stride=2)
        self.dec1a = nn.Conv2d(2 * w1, w1, 3, padding=1)
        self.dec1b = nn.Conv2d(w1, w1, 3, padding=1)
        self.head = nn.Conv2d(w1, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = torch.relu(self.enc1b(torch.relu(self.enc1a(x))))
        e2 = torch.relu(self.enc2b(torch.relu(self.enc2a(F.max_pool2d(e1, 2)))))
        m = torch.relu(self.mid_b(torch.relu(self.mid_a(F.max_pool2d(e2, 2)))))
        d2 = torch.cat([self.up2(m), e2], dim=1)
        d2 = torch.relu(self.dec2b(torch.relu(self.dec2a(d2))))
        d1 = torch.cat([self.up1(d2), e1], dim=1)
        d1 = torch.relu(self.dec1b(torch.relu(self.dec1a(d1))))
        return self.head(d1)


batch = 16
in_channels = 3
image_size = 128
base_width = 32
num_classes = 4
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "image_size": 8, "base_width": 2}}


def get_inputs():
    return [torch.randn(batch, in_channels, image_size, image_size)]


def get_init_inputs():
    return [in_channels, base_width, num_classes]
