"""Language-model output head with per-token loss (inference): final LayerNorm, a
bias-free projection to a 32000-word vocabulary, log-softmax over the vocabulary,
and the negative log-likelihood of each token's target (a gather by int64 index).

Takes two inputs: the final hidden states and the int64 target ids. The vocabulary
GEMM dominates; its 524 MB logits are written, read and rewritten by the
log-softmax and read again for the gather, all of which a fused version avoids by
reducing each row's log-sum-exp in the GEMM epilogue. Roughly 6 ms eagerly on an
H100 in true fp32: 2 x 4096 x 1024 x 32000 = 268 GFLOP (about 5.4 ms at
50 TFLOP/s) and about 1.6 GB of logit traffic (0.5 ms).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d_model: int, vocab_size: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # hidden: (tokens, d_model) float; targets: (tokens,) int64 ids
        log_probs = torch.log_softmax(self.lm_head(self.norm(hidden)), dim=-1)
        return -log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)


tokens = 4096
d_model = 1024
vocab_size = 32000
# size presets, applied by the loader (stitchcuda/task/preset.py): "tiny" is sized for CPU tests
PRESETS = {"tiny": {"tokens": 5, "d_model": 8, "vocab_size": 37}}


def get_inputs():
    return [torch.randn(tokens, d_model), torch.randint(0, vocab_size, (tokens,), dtype=torch.int64)]


def get_init_inputs():
    return [d_model, vocab_size]
