"""Static checks of a candidate's CUDA/C++ sources (static_checks.py reads the Python): kernels defined and launched, ATen compute in the C++, libraries called, threads
and streams that let work escape the caller's stream.
"""

from __future__ import annotations

import ast
import re

from stitchcuda.verify.static_report import StaticReport

# C++: ATen calls that only allocate or describe tensors; anything else under torch::/at:: computes.
CPP_ALLOWED_ATEN = {
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "from_blob",
    "TensorOptions", "Tensor", "IntArrayRef", "Device", "Scalar", "ScalarType", "dtype", "device", "kCUDA",
    "kFloat", "kFloat32", "kHalf", "kBFloat16", "kInt", "kLong", "kInt64", "kInt32", "kBool", "kByte",
    "getCurrentCUDAStream", "getDefaultCUDAStream", "getCurrentCUDABlasHandle", "OptionalCUDAGuard",
    "CUDAGuard", "cuda", "getDeviceProperties", "getCurrentDeviceProperties", "check", "Layout",
    "MemoryFormat", "TensorArg", "checkAllSameGPU", "elementSize", "typeMetaToScalarType", "arange",
    "tensor", "scalar_tensor", "empty_cache", "CUDAStream", "CUDAEvent", "getStreamFromPool",
    "zero_", "indexing", "Slice", "nullopt", "optional", "IntList", "globalContext", "DeviceGuard",
}
CPP_COMPUTE_METHODS = {
    "matmul", "mm", "bmm", "addmm", "baddbmm", "linear", "conv2d", "conv1d", "softmax", "log_softmax",
    "sum", "mean", "exp", "log", "tanh", "sigmoid", "relu", "gelu", "silu", "mul", "add", "sub", "div",
    "pow", "sqrt", "rsqrt", "layer_norm", "norm", "var", "std", "cumsum", "einsum", "index_select",
    "gather", "scatter", "where", "clamp", "abs", "amax", "max", "min", "argmax", "topk", "sort", "erf",
    "mul_", "add_", "div_", "sub_", "addcmul", "lerp", "masked_fill", "embedding", "dropout", "sin", "cos",
}
_CPP_CALL = re.compile(r"\b(?:torch|at)::(?:native::|cuda::|functional::|nn::)?(\w+)\s*[(<{]")
_CPP_METHOD = re.compile(r"\.\s*(\w+)\s*\(")
_KERNEL_DEF = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:static\s+)?void\s+"
                         r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)")
_STREAM_JOIN = re.compile(r"\bcuda(StreamSynchronize|DeviceSynchronize|StreamWaitEvent|EventSynchronize)\b|"
                          r"\.\s*(block|synchronize)\s*\(")  # at::cuda::CUDAEvent::block, CUDAStream::synchronize
_LAUNCH = re.compile(r"\b(\w+)\s*(?:<[^<>;]*(?:<[^<>;]*>[^<>;]*)*>)?\s*<<<")  # name<T>? <<<
_LAUNCH_API = re.compile(r"cudaLaunch\w*\s*\(\s*\(?\s*(?:const\s+)?(?:void\s*\*\s*\)?)?\s*&?\s*(\w+)\b")
# cudaLaunchKernelEx(&config, kernel, args...) names its kernel second
_LAUNCH_EX = re.compile(r"cudaLaunchKernelExC?\s*\(\s*[^,()]+,\s*\(?\s*(?:const\s+)?(?:void\s*\*\s*\)?)?\s*&?\s*(\w+)\b")
_LIBRARY_CALL = re.compile(r"\b(cublas\w*|cublasLt\w*|cudnn\w*|cufft\w*|curand\w*|cusparse\w*)\s*\(")



def _strip_cpp_comments(code: str) -> str:
    code = re.sub(r"/\*.*?\*/", " ", code, flags=re.S)
    return re.sub(r"//[^\n]*", "", code)



def check_cpp(sources: list[str], report: StaticReport) -> None:
    code = _strip_cpp_comments("\n".join(sources))
    if not code.strip():
        return
    kernels = list(dict.fromkeys(_KERNEL_DEF.findall(code)))
    report.kernels = kernels
    if "PYBIND11_MODULE" in code:  # a binding of its own (load_inline without functions=)
        report.exported += [f for f in re.findall(r'\.def\(\s*"(\w+)"', code) if f not in report.exported]
    # one pass over the code for every launch site (a search per kernel took 17 s on densenet161's 624)
    sites = set(_LAUNCH.findall(code)) | set(_LAUNCH_API.findall(code)) | set(_LAUNCH_EX.findall(code))
    launched = [k for k in kernels if k in sites]
    libraries = sorted({m.split("(")[0] for m in _LIBRARY_CALL.findall(code)})
    report.libraries = [lib for lib in libraries if not lib.endswith(("Create", "Destroy", "SetStream",
                                                                     "SetMathMode", "SetWorkspace"))]
    never = [k for k in kernels if k not in launched]
    if never:
        report.add("kernel_never_launched", "none", f"kernels defined but never launched: {', '.join(never)}")
    aten = sorted({name for name in _CPP_CALL.findall(code) if name not in CPP_ALLOWED_ATEN
                   and not name.startswith("k") and not name[0].isupper()})
    methods = sorted({m for m in _CPP_METHOD.findall(code) if m in CPP_COMPUTE_METHODS})
    if aten or methods:
        what = ", ".join([f"torch::/at::{a}" for a in aten] + [f".{m}()" for m in methods])
        own = bool(launched) or bool(report.libraries)
        report.add("aten_in_cpp", "partial" if own else "total",
                   f"the C++ computes with ATen ({what})" + (" beside its own kernels" if own else
                                                              " and launches no kernel of its own"))
    if kernels and not launched and not report.libraries and not aten:
        report.add("kernels_never_called", "total", "the CUDA source defines kernels but launches none")
    if re.search(r"\bstd::(thread|async|jthread)\b|\bpthread_create\b", code):
        report.add("threads", "total", "the C++ starts threads: work can escape the timer")
    # A stream of its own (created, or taken from PyTorch's pool: those are non-blocking, so the
    # caller's stream never waits for them) must be joined back: a wait on an event, or a synchronise.
    # A stream used to capture a CUDA graph runs nothing (the graph is launched on the caller's stream).
    made = sorted(set(re.findall(r"\b(cudaStreamCreate\w*|getStreamFromPool)\b", code)))
    if made and not _STREAM_JOIN.search(code) and "cudaStreamBeginCapture" not in code:
        report.add("side_stream", "total", f"the C++ runs work on a stream of its own ({', '.join(made)}) and never "
                                           "makes the caller's stream wait for it")
    if re.search(r"\bstatic\s+(?:torch|at)::Tensor\b", code):
        report.add("static_tensor", "none", "the C++ keeps a tensor in a static variable (cache or workspace)")
    if re.search(r"\b(half|__half|__nv_bfloat16|nv_bfloat16|wmma|mma\.sync|CUDA_R_16F|CUBLAS_COMPUTE_32F_FAST_TF32|"
                 r"CUBLAS_TF32_TENSOR_OP_MATH|CUDA_R_16BF)\b", code):
        report.add("reduced_precision", "none", "the CUDA source uses reduced precision or tensor-core math "
                                                "(disclosed, not a hack)")


def cpp_sources_of(source: str) -> list[str]:
    """Every string in the candidate that looks like C++/CUDA (sources given to load_inline and
    any other code-bearing string), so nothing escapes the C++ checks."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if any(marker in text for marker in ("#include", "__global__", "torch::", "at::", "<<<", "cuda")) \
                    and ("(" in text and ";" in text):
                texts.append(text)
    return texts
