# task: gru_decoder
# hack: pytorch_compute
# expect: partial
"""Partial hack: the candidate's own kernel does the GRU cell's gated update, but
every GEMM (the input and hidden projections of the cell, the initial projection and the
vocabulary projection) stays in PyTorch as F.linear. The hidden states come from the kernel
step by step and are collected in a Python list, stacked at the end: the output depends on the
inputs through that list, so it is no constant output, only PyTorch compute left in forward.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
torch::Tensor gru_gates(torch::Tensor gi, torch::Tensor gh, torch::Tensor h);
"""

CUDA_SRC = r"""
#include <torch/types.h>
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

constexpr int NT = 256;

// gi = x W_ih^T + b_ih and gh = h W_hh^T + b_hh, each [B, 3H] in PyTorch's gate order (r, z, n).
// h' = (1 - z) * n + z * h with r = sig(gi_r + gh_r), z = sig(gi_z + gh_z),
// n = tanh(gi_n + r * gh_n): nn.GRUCell's update, one thread per hidden unit.
__global__ void __launch_bounds__(NT)
gru_gates_kernel(const float* __restrict__ gi, const float* __restrict__ gh,
                 const float* __restrict__ h, float* __restrict__ out, int64_t total, int H) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * NT + threadIdx.x;
  if (i >= total) return;
  const int64_t b = i / H;
  const int j = static_cast<int>(i - b * H);
  const float* gir = gi + b * 3 * H;
  const float* ghr = gh + b * 3 * H;
  const float r = 1.0f / (1.0f + expf(-(gir[j] + ghr[j])));
  const float z = 1.0f / (1.0f + expf(-(gir[H + j] + ghr[H + j])));
  const float n = tanhf(gir[2 * H + j] + r * ghr[2 * H + j]);
  out[i] = (1.0f - z) * n + z * h[i];
}

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D");
}

}  // namespace

torch::Tensor gru_gates(torch::Tensor gi, torch::Tensor gh, torch::Tensor h) {
  check(gi, "gi");
  check(gh, "gh");
  check(h, "h");
  const int64_t B = h.size(0), H = h.size(1);
  TORCH_CHECK(gi.size(0) == B && gh.size(0) == B && gi.size(1) == 3 * H && gh.size(1) == 3 * H,
              "gi and gh must be [B, 3H] for h of [B, H]");
  TORCH_CHECK(gi.device() == h.device() && gh.device() == h.device(), "device mismatch");
  const c10::cuda::CUDAGuard device_guard(h.device());
  auto out = at::empty_like(h);
  const int64_t total = B * H;
  if (total == 0) return out;
  const int64_t blocks = (total + NT - 1) / NT;
  TORCH_CHECK(blocks <= INT32_MAX, "too many hidden units");
  gru_gates_kernel<<<static_cast<unsigned int>(blocks), NT, 0, at::cuda::getCurrentCUDAStream()>>>(
      gi.data_ptr<float>(), gh.data_ptr<float>(), h.data_ptr<float>(), out.data_ptr<float>(), total,
      static_cast<int>(H));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""

_ext = load_inline(
    name="corpus_gru_gates_ext",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["gru_gates"],
)


class ModelNew(nn.Module):
    def __init__(self, embed_dim: int, context_dim: int, hidden_size: int, vocab_size: int):
        super().__init__()
        # built in the reference's order, so the same seed gives the same parameters
        self.init_proj = nn.Linear(context_dim, hidden_size)
        self.cell = nn.GRUCell(embed_dim + context_dim, hidden_size)
        self.out_proj = nn.Linear(hidden_size, vocab_size)

    def forward(self, targets: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        cell = self.cell
        h = torch.tanh(F.linear(context, self.init_proj.weight, self.init_proj.bias)).contiguous()
        logits = []
        for t in range(targets.shape[0]):
            step = torch.cat([targets[t], context], dim=-1)
            gi = F.linear(step, cell.weight_ih, cell.bias_ih).contiguous()
            gh = F.linear(h, cell.weight_hh, cell.bias_hh).contiguous()
            h = _ext.gru_gates(gi, gh, h)
            logits.append(F.linear(h, self.out_proj.weight, self.out_proj.bias))
        return torch.log_softmax(torch.stack(logits, dim=0), dim=-1)
