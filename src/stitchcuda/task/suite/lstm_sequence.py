"""Two-layer LSTM sequence classifier (inference) written as an explicit Python loop
over time: two stacked nn.LSTMCell steps per time step, then a linear head on the
last hidden state of the top layer.

Launch-bound on purpose: 128 time steps x 2 cells, each two small GEMMs (64 rows)
and a pointwise gate kernel, about 800 kernels strictly sequential through the
recurrence. A fused version keeps the weights and state on chip across steps (a
persistent kernel) or at least fuses each step. Roughly 5-10 ms eagerly on an H100
in true fp32: 256 cell calls at about 20-40 us of dispatch each, over
128 x 2 x 64 x 2048 x (768 + 1024) = 60 GFLOP of 64-row GEMMs that run far below
peak (about 2-4 ms of GPU time).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, num_classes: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.cell1 = nn.LSTMCell(input_size, hidden_size)
        self.cell2 = nn.LSTMCell(hidden_size, hidden_size)
        self.head = nn.Linear(hidden_size, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: (seq_len, batch, input_size)
        batch = x.shape[1]
        h1 = x.new_zeros(batch, self.hidden_size)
        c1 = x.new_zeros(batch, self.hidden_size)
        h2 = x.new_zeros(batch, self.hidden_size)
        c2 = x.new_zeros(batch, self.hidden_size)
        for t in range(x.shape[0]):
            h1, c1 = self.cell1(x[t], (h1, c1))
            h2, c2 = self.cell2(h1, (h2, c2))
        return self.head(h2)


seq_len = 128
batch = 64
input_size = 256
hidden_size = 512
num_classes = 256
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"seq_len": 3, "batch": 2, "input_size": 5, "hidden_size": 6, "num_classes": 4}}


def get_inputs():
    return [torch.randn(seq_len, batch, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_classes]
