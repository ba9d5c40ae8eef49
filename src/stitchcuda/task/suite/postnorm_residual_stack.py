"""Post-LayerNorm residual stack (BERT-style ordering, inference): eight layers of
x = LayerNorm(x + ReLU(Linear(x))), on narrow 256-wide features.

With a width of 256 the GEMMs are cheap, so the per-layer ReLU, residual add and
LayerNorm (each a full pass over a 64 MB activation) cost about as much as the
GEMMs: a fused version folds bias, ReLU, residual and the row-wise LayerNorm into
the GEMM epilogue (a 256-wide row fits one tile). Roughly 3 ms eagerly on an H100
in true fp32: 8 x 2 x 65536 x 256 x 256 = 69 GFLOP (about 1.4 ms at 50 TFLOP/s)
and 8 x about 0.5 GB of elementwise and norm traffic (about 1.4 ms at 3 TB/s).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int, num_layers: int):
        super().__init__()
        self.linears = nn.ModuleList(nn.Linear(features, features) for _ in range(num_layers))
        self.norms = nn.ModuleList(nn.LayerNorm(features) for _ in range(num_layers))
        # Non-trivial affine parameters, so that the norms are not identities to fold away.
        for norm in self.norms:
            nn.init.uniform_(norm.weight, 0.5, 1.5)
            nn.init.uniform_(norm.bias, -0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, linear in enumerate(self.linears):
            x = self.norms[i](x + torch.relu(linear(x)))
        return x


rows = 65536
features = 256
num_layers = 8
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"rows": 6, "features": 16, "num_layers": 2}}


def get_inputs():
    return [torch.randn(rows, features)]


def get_init_inputs():
    return [features, num_layers]
