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
- ``nn.TransformerEncoder`` in eval mode, given a ``src_key_padding_mask`` (and no ``mask``), runs its
  layers on a nested tensor of the unpadded tokens and pads the result with zeros: its output at a
  padded position is 0 (then its final norm), where the Python code computes a value there. torch
  takes that path only when every row's tokens come before its padding (it checks the mask each
  call): the capture computes that check from the mask too, and zeroes the padded positions where
  it holds.
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


def _encoder_nests_tokens(encoder: Any) -> bool:
    """Whether ``encoder`` (an nn.TransformerEncoder) may run on nested tensors under no_grad: the
    module-level conditions of its forward; the per-call ones are :func:`_padded_as_nested`'s."""
    import torch

    return bool(torch.backends.mha.get_fastpath_enabled() and getattr(encoder, "use_nested_tensor", False)
                and len(encoder.layers) and not encoder.layers[0].training)


def _padded_as_nested(encoder: Any, forward: Any, src: Any, mask: Any = None, src_key_padding_mask: Any = None,
                      is_causal: Any = None) -> Any:
    """The encoder's forward as its nested-tensor path computes it (the module's docstring)."""
    if mask is not None or src_key_padding_mask is None or src.dim() != 3:
        return forward(encoder, src, mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
    norm, encoder.norm = encoder.norm, None
    try:
        out = forward(encoder, src, mask=None, src_key_padding_mask=src_key_padding_mask, is_causal=is_causal)
    finally:
        encoder.norm = norm
    # (batch, tokens): torch nests only batch-first layers; a bool mask, or a float one (0 where kept)
    padded = src_key_padding_mask != 0
    if getattr(encoder, "mask_check", True):  # torch nests only where each row's tokens lead
        kept = padded.logical_not()
        padded = padded & (kept[:, 1:] <= kept[:, :-1]).all()
    out = out.masked_fill(padded.unsqueeze(-1), 0.0)
    return norm(out) if norm is not None else out


@contextlib.contextmanager
def as_cuda_inference(model: Any) -> Iterator[None]:
    """``model`` traced as it computes on CUDA under no_grad (the module's docstring): each encoder
    layer that takes the native path applies the tanh GELU to a batched input, and each encoder
    that nests its tokens zeroes its padded positions, for the duration."""
    import torch.nn as nn
    import torch.nn.functional as F

    patched = []
    for encoder in model.modules():
        if isinstance(encoder, nn.TransformerEncoder) and _encoder_nests_tokens(encoder):
            encoder.forward = functools.partial(_padded_as_nested, encoder, type(encoder).forward)
            patched.append(encoder)
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
