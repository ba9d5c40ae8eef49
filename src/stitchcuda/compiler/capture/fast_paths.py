"""PyTorch's inference fast paths that compute another function on CUDA than the module's Python code.

The capture traces a module's Python code (on the meta device, where no fast path runs), but the
reference the program is judged against runs on a CUDA GPU under ``torch.no_grad()`` (KernelBench's
harness and ours both), where some modules take a fused native path instead. Where that path
computes something else, the capture must trace what it computes:

- ``nn.TransformerEncoderLayer`` in eval mode with ``activation="gelu"`` runs
  ``torch._transformer_encoder_layer_fwd``, whose feed-forward GEMM applies GELU in cuBLASLt's
  epilogue: the tanh approximation, not the erf GELU of ``F.gelu``. The two differ by up to about
  1e-4 per layer after the second linear, beyond the strict tolerance within one or two layers.
  (On the CPU the same path computes the erf GELU.) Its attention and norms match the Python code.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


def _encoder_layer_fast_path(layer: Any) -> bool:
    """Whether ``layer`` (an nn.TransformerEncoderLayer) takes torch's native path for a batched
    input under no_grad: the module-level conditions of its forward (torch/nn/modules/transformer.py)."""
    import torch

    attn = layer.self_attn
    return (torch.backends.mha.get_fastpath_enabled() and not layer.training and attn.batch_first
            and attn.in_proj_bias is not None and attn._qkv_same_embed_dim and layer.activation_relu_or_gelu == 2
            and layer.norm1.eps == layer.norm2.eps and attn.num_heads % 2 == 0
            and not any(getattr(m, "_forward_hooks", None) or getattr(m, "_forward_pre_hooks", None)
                        for m in layer.modules()))


@contextlib.contextmanager
def as_cuda_inference(model: Any) -> Iterator[None]:
    """``model`` traced as it computes on CUDA under no_grad (the module's docstring): each encoder
    layer that takes the native path applies the tanh GELU to a batched input for the duration."""
    import torch.nn as nn
    import torch.nn.functional as F

    patched = []
    for layer in model.modules():
        if isinstance(layer, nn.TransformerEncoderLayer) and _encoder_layer_fast_path(layer):
            erf_gelu = layer.activation

            def forward(src: Any, *args: Any, _layer: Any = layer, _erf: Any = erf_gelu,
                        _forward: Any = type(layer).forward, **kwargs: Any) -> Any:
                _layer.activation = functools.partial(F.gelu, approximate="tanh") if src.dim() == 3 else _erf
                try:
                    return _forward(_layer, src, *args, **kwargs)
                finally:
                    _layer.activation = _erf

            layer.forward = forward
            patched.append(layer)
    try:
        yield
    finally:
        for layer in patched:
            del layer.forward
