"""What a GPU kernel's name says about who wrote it; torch-free, for the orchestrator too."""

from __future__ import annotations

import re

_LIBRARY = re.compile(r"gemm|xmma|cutlass|cublas|cudnn|\bsm\d+_|ampere|hopper|volta|turing|implicit_convolve|"
                      r"winograd|fft|cutensor|splitk|gemv|nvjet|conv2d_grouped|scudnn|dgrad|wgrad", re.I)
_PYTORCH = re.compile(r"\bat::|\bc10::|^triton_|elementwise_kernel|reduce_kernel|\bat_cuda_detail\b", re.I)


def is_library_kernel(name: str) -> bool:
    return bool(_LIBRARY.search(name))


def guess_origin(name: str) -> str:
    """own / library / pytorch from the name alone (the profiler's launch attribution is better:
    use this only where no launch record exists)."""
    if _PYTORCH.search(name):
        return "pytorch"
    return "library" if is_library_kernel(name) else "own"
