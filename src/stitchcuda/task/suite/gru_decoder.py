"""Teacher-forced GRU sequence decoder (inference) written as an explicit Python loop
over time: at each step the target embedding is concatenated with a fixed context
vector, fed through an nn.GRUCell, and projected to vocabulary logits; the per-step
logits are stacked and turned into log-probabilities at the end.

The initial hidden state comes from the context through a tanh projection. Each
step is a concatenation, two small GEMMs and a gate kernel for the cell, and a
512 x 8000 output GEMM: about 5 launches per step over 96 sequential steps, so the
program is launch- and latency-bound, with the output projections (which do not
feed the recurrence) the largest piece of real work. Roughly 4-8 ms eagerly on an
H100 in true fp32: about 500 kernels and 96 x 3 module calls of dispatch, over
96 x 2 x 32 x (768 x 1536 + 512 x 1536 + 512 x 8000) = 37 GFLOP of 32-row GEMMs
and a 98 MB log-softmax (under 0.1 ms).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, embed_dim: int, context_dim: int, hidden_size: int, vocab_size: int):
        super().__init__()
        self.init_proj = nn.Linear(context_dim, hidden_size)
        self.cell = nn.GRUCell(embed_dim + context_dim, hidden_size)
        self.out_proj = nn.Linear(hidden_size, vocab_size)

    def forward(self, targets: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        # targets: (seq_len, batch, embed_dim) teacher-forced input embeddings
        # context: (batch, context_dim) encoder summary
        h = torch.tanh(self.init_proj(context))
        logits = []
        for t in range(targets.shape[0]):
            h = self.cell(torch.cat([targets[t], context], dim=-1), h)
            logits.append(self.out_proj(h))
        return torch.log_softmax(torch.stack(logits, dim=0), dim=-1)


seq_len = 96
batch = 32
embed_dim = 256
context_dim = 512
hidden_size = 512
vocab_size = 8000
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {
    "tiny": {"seq_len": 3, "batch": 2, "embed_dim": 4, "context_dim": 5, "hidden_size": 6, "vocab_size": 7},
}


def get_inputs():
    return [torch.randn(seq_len, batch, embed_dim), torch.randn(batch, context_dim)]


def get_init_inputs():
    return [embed_dim, context_dim, hidden_size, vocab_size]
