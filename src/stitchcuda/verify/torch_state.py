"""Torch's process-wide flags, snapshotted and restored around candidate code.

A candidate that flips TF32 on, turns on cudnn.benchmark, or changes the default dtype
would otherwise change how the reference is computed and timed after it. Every change is
reported (``Finding`` with check ``global_state``) and undone.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch


def _attr(obj: Any, name: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    return (lambda: getattr(obj, name)), (lambda value: setattr(obj, name, value))


def _flags() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    matmul = torch.backends.cuda.matmul
    cudnn = torch.backends.cudnn
    flags = {
        "cuda.matmul.allow_tf32": _attr(matmul, "allow_tf32"),
        "cuda.matmul.allow_fp16_reduced_precision_reduction": _attr(matmul, "allow_fp16_reduced_precision_reduction"),
        "cuda.matmul.allow_bf16_reduced_precision_reduction": _attr(matmul, "allow_bf16_reduced_precision_reduction"),
        "cudnn.allow_tf32": _attr(cudnn, "allow_tf32"),
        "cudnn.benchmark": _attr(cudnn, "benchmark"),
        "cudnn.deterministic": _attr(cudnn, "deterministic"),
        "cudnn.enabled": _attr(cudnn, "enabled"),
        "float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "deterministic_algorithms": (
            torch.are_deterministic_algorithms_enabled, lambda v: torch.use_deterministic_algorithms(v),
        ),
        "grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
        "num_threads": (torch.get_num_threads, torch.set_num_threads),
        "autocast.cuda": (lambda: torch.is_autocast_enabled("cuda"), lambda v: torch.set_autocast_enabled("cuda", v)),
        "sdp.flash": (torch.backends.cuda.flash_sdp_enabled, torch.backends.cuda.enable_flash_sdp),
        "sdp.mem_efficient": (torch.backends.cuda.mem_efficient_sdp_enabled, torch.backends.cuda.enable_mem_efficient_sdp),
        "sdp.math": (torch.backends.cuda.math_sdp_enabled, torch.backends.cuda.enable_math_sdp),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        def current_stream_is_default() -> bool:
            return torch.cuda.current_stream() == torch.cuda.default_stream()

        def back_to_default(value: bool) -> None:
            if value:
                torch.cuda.set_stream(torch.cuda.default_stream())

        flags["cuda.current_stream_is_default"] = (current_stream_is_default, back_to_default)
    return flags


class TorchState:
    """A snapshot of torch's global flags."""

    def __init__(self, values: dict[str, Any]):
        self.values = values

    @classmethod
    def capture(cls) -> TorchState:
        values = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # some getters are deprecated in newer torch
            for name, (get, _) in _flags().items():
                try:
                    values[name] = get()
                except Exception:  # a flag this torch build lacks
                    continue
        return cls(values)

    def changes_since(self, earlier: TorchState) -> dict[str, tuple[Any, Any]]:
        return {
            name: (earlier.values[name], value)
            for name, value in self.values.items()
            if name in earlier.values and earlier.values[name] != value
        }

    def restore(self) -> None:
        current = TorchState.capture()
        setters = _flags()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for name in current.changes_since(self):
                try:
                    setters[name][1](self.values[name])
                except Exception:
                    continue


def set_tf32(enabled: bool) -> None:
    """Turn TF32 on or off for both matmuls and cuDNN convolutions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
