"""Three-layer MLP with GELU activations: a GEMM-dominated program.

Eager cost on an H100 in true fp32: three 4096-wide GEMMs over a 4096-row batch
(about 0.4 TFLOP), roughly 10 ms.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_features: int, hidden: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.fc1(x))
        x = F.gelu(self.fc2(x))
        return self.fc3(x)


batch = 4096
in_features = 4096
hidden = 4096
out_features = 2048
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 4, "in_features": 16, "hidden": 32, "out_features": 8}}


def get_inputs():
    return [torch.randn(batch, in_features)]


def get_init_inputs():
    return [in_features, hidden, out_features]
