"""Recommender model in the DLRM style (inference): a bottom MLP on dense features,
one embedding lookup per categorical feature (integer index input), pairwise dot
products between all the resulting vectors (batched matmul, upper triangle
gathered), concatenation with the dense vector, and a top MLP ending in a sigmoid
click probability.

Takes two inputs: float dense features and int64 categorical indices. The sixteen
embedding gathers are small, separate launches with random reads from 205 MB of
tables; the interaction is a 17 x 17 batched matmul per sample followed by a
gather; the MLPs are the only real arithmetic. Roughly 2-3 ms eagerly on an H100
in true fp32: MLPs of 2 x 32768 x (13 x 512 + 512 x 256 + 256 x 64 + 200 x 1024
+ 1024 x 512 + 512) = 58 GFLOP (about 1.2 ms at 50 TFLOP/s), plus about 1 GB of
gather, interaction and concatenation traffic and some 40 launches.
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_dense: int, num_tables: int, vocab_size: int, embed_dim: int):
        super().__init__()
        self.bottom = nn.Sequential(
            nn.Linear(num_dense, 512),
            nn.ReLU(),
            nn.Linear(512, 256),
            nn.ReLU(),
            nn.Linear(256, embed_dim),
            nn.ReLU(),
        )
        self.tables = nn.ModuleList(nn.Embedding(vocab_size, embed_dim) for _ in range(num_tables))
        for table in self.tables:
            nn.init.uniform_(table.weight, -0.5, 0.5)
        num_vectors = num_tables + 1
        rows, cols = torch.triu_indices(num_vectors, num_vectors, offset=1)
        self.register_buffer("pair_rows", rows, persistent=False)
        self.register_buffer("pair_cols", cols, persistent=False)
        num_pairs = num_vectors * (num_vectors - 1) // 2
        self.top = nn.Sequential(
            nn.Linear(embed_dim + num_pairs, 1024),
            nn.ReLU(),
            nn.Linear(1024, 512),
            nn.ReLU(),
            nn.Linear(512, 1),
        )
        # He-initialised weights keep the activations at unit scale through the ReLU MLPs, so that
        # the click probabilities spread over (0, 1) instead of all sitting at 0.5.
        for layer in (*self.bottom, *self.top):
            if isinstance(layer, nn.Linear):
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        # dense: (batch, num_dense) float; sparse: (batch, num_tables) int64 indices
        d = self.bottom(dense)
        vectors = [d] + [table(sparse[:, i]) for i, table in enumerate(self.tables)]
        t = torch.stack(vectors, dim=1)
        z = torch.bmm(t, t.transpose(1, 2))
        pairs = z[:, self.pair_rows, self.pair_cols]
        return torch.sigmoid(self.top(torch.cat([d, pairs], dim=1)))


batch = 32768
num_dense = 13
num_tables = 16
vocab_size = 50000
embed_dim = 64
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"batch": 5, "num_dense": 3, "num_tables": 3, "vocab_size": 11, "embed_dim": 4}}


def get_inputs():
    return [
        torch.randn(batch, num_dense),
        torch.randint(0, vocab_size, (batch, num_tables), dtype=torch.int64),
    ]


def get_init_inputs():
    return [num_dense, num_tables, vocab_size, embed_dim]
