"""What a GPU kernel's name says about who wrote it; torch-free, for the orchestrator too."""

from __future__ import annotations

import re

_LIBRARY = re.compile(r"gemm|xmma|cutlass|cublas|cudnn|\bsm\d+_|ampere|hopper|volta|turing|implicit_convolve|"
                      r"winograd|fft|cutensor|splitk|gemv|nvjet|conv2d_grouped|scudnn|dgrad|wgrad", re.I)
_PYTORCH = re.compile(r"\bat::|\bc10::|^triton_|elementwise_kernel|reduce_kernel|\bat_cuda_detail\b", re.I)
# A CUTLASS template instantiated in the candidate's own source: CUTLASS's kernel entry points
# (2.x ``cutlass::Kernel``/``Kernel2``, 3.x ``cutlass::device_kernel``) around one of CUTLASS's
# own operator templates, e.g. ``void cutlass::Kernel2<cutlass::gemm::kernel::GemmUniversal<...>>``
# or ``cutlass::Kernel<cutlass::conv::kernel::ImplicitGemmConvolution<...>>``. cuBLAS and cuDNN
# ship CUTLASS kernels too, but around their own generated, non-namespaced structs:
# ``cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>``, ``cutlass3x_sm90_...``,
# ``sm90_xmma_...``; cuDNN's live in namespaces of their own (``cutlass__5x_cudnn::Kernel<...>``).
_OWN_CUTLASS = re.compile(r"(?<![\w:])cutlass::(?:Kernel\d*|device_kernel)\s*<\s*(?!cutlass\w|sm\d|\w*xmma)")


def is_own_cutlass_kernel(name: str) -> bool:
    """A CUTLASS kernel compiled from the candidate's source (not one of a library's)."""
    return bool(_OWN_CUTLASS.search(name))


def is_library_kernel(name: str) -> bool:
    return not is_own_cutlass_kernel(name) and bool(_LIBRARY.search(name))


def guess_origin(name: str) -> str:
    """own / library / pytorch from the name alone (the profiler's launch attribution is better:
    use this only where no launch record exists)."""
    if _PYTORCH.search(name):
        return "pytorch"
    return "library" if is_library_kernel(name) else "own"
