"""MLP-Mixer block (inference): a token-mixing MLP applied across patches (on the
transposed activation) and a channel-mixing MLP applied across features, each
behind a LayerNorm and a residual, with GELU in both MLPs.

The channel-mixing GEMMs dominate; the token-mixing MLP works on a transposed
(batch, channels, patches) view with an awkward inner size of 196, and the
transposes, LayerNorms and GELUs are memory-bound passes. Roughly 3-4 ms eagerly
on an H100 in true fp32: channel mixing 2 x 2 x 12544 x 768 x 3072 = 118 GFLOP and
token mixing 2 x 2 x 49152 x 196 x 384 = 15 GFLOP (about 2.7 ms at 50 TFLOP/s),
plus about 1.5 GB of transpose, norm and activation traffic (0.5 ms).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, num_patches: int, channels: int, token_hidden: int, channel_hidden: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(channels)
        self.token_fc1 = nn.Linear(num_patches, token_hidden)
        self.token_fc2 = nn.Linear(token_hidden, num_patches)
        self.norm2 = nn.LayerNorm(channels)
        self.channel_fc1 = nn.Linear(channels, channel_hidden)
        self.channel_fc2 = nn.Linear(channel_hidden, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (batch, num_patches, channels)
        y = self.norm1(x).transpose(1, 2)
        y = self.token_fc2(F.gelu(self.token_fc1(y)))
        x = x + y.transpose(1, 2)
        y = self.channel_fc2(F.gelu(self.channel_fc1(self.norm2(x))))
        return x + y


batch = 64
num_patches = 196
channels = 768
token_hidden = 384
channel_hidden = 3072
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 2, "num_patches": 9, "channels": 24, "token_hidden": 16, "channel_hidden": 40}}


def get_inputs():
    return [torch.randn(batch, num_patches, channels)]


def get_init_inputs():
    return [num_patches, channels, token_hidden, channel_hidden]
