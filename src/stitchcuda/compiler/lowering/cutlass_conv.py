"""A CUTLASS 2.x implicit-GEMM 2-d convolution forward as a small kernel extension of its own.

Why a separate extension: a CUTLASS instantiation is seconds of nvcc per architecture (its
templates are most of the unit) while its source depends only on a :class:`CutlassConv` config,
so torch's extension cache builds it once per config and every program that needs that config
loads the same library instead of recompiling it inside its own source. The program reaches it
through a C ABI (:data:`CONV_ABI`): the binding exposes the launcher's and the workspace
function's addresses, and the caller passes NCHW / KCRS pointers plus a workspace it owns (no
allocation in the launcher: it may be captured into a CUDA graph). Tensor cores on fp32 tensors:
``3xtf32`` splits each operand into a big and a small tf32 part and keeps fp32 accuracy; ``tf32``
is one pass, around 1e-3 relative error.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import model_validator

from stitchcuda.compiler.check import CompileCheck
from stitchcuda.compiler.lowering.cutlass_gemm import ExtensionConfig, compile_unit, templates

CONV_ABI = """\
#ifndef SC_CONV_ABI
#define SC_CONV_ABI
#include <cstdint>
#include <cuda_runtime.h>
struct ScConvArgs {
  int n, h, w, c, k, r, s, p, q;          // input N,C,H,W; filter K,C,R,S; output P,Q
  int pad_h, pad_w, stride_h, stride_w, dil_h, dil_w;
  const float* x; const float* weight; const float* bias;   // NCHW, KCRS, [K] or nullptr
  float* y;                                // NCHW output
  void* workspace; int64_t workspace_bytes;
};
typedef int (*ScConvFn)(const ScConvArgs*, cudaStream_t);   // 0: launched; else a CUTLASS status, or 1000 + a CUDA error
typedef int64_t (*ScConvWorkspaceFn)(const ScConvArgs*);     // bytes the launcher needs
#endif
"""

# The flags load_inline should get for the CUDA source (torch adds its own on top).

# What the math names mean to CUTLASS's warp-level MMA selection for float operands.
_MATH_OPS = {"3xtf32": "cutlass::arch::OpMultiplyAddFastF32", "tf32": "cutlass::arch::OpMultiplyAdd"}

# In CUTLASS 4.x both fp32 fprop iterators take 32-bit accesses (a thread's 4-float vector is split
# into kAccessesPerVector pieces), but kOptimized also refuses R or S above 32 (its mask bits): the
# unaligned path, meant to be the catch-all, takes kAnalytic, which has no such limit.
_ITERATORS = {4: "cutlass::conv::IteratorAlgorithm::kOptimized", 1: "cutlass::conv::IteratorAlgorithm::kAnalytic"}

# The formulas of the prelude's sc_* helpers, so the fused epilogue agrees with the pointwise kernels.
_ACTIVATIONS = {
    "identity": "return v;",
    "relu": "return v < 0.0f ? 0.0f : v;  // NaN passes through, as in torch",
    "silu": "return v / (1.0f + expf(-v));",
    "sigmoid": "return 1.0f / (1.0f + expf(-v));",
    "gelu": "return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));",
    "gelu_tanh": "return 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));",
}


class CutlassConv(ExtensionConfig, frozen=True):
    """One instantiation: everything its generated source depends on, and nothing else."""

    math: Literal["3xtf32", "tf32"]
    align: Literal[1, 4]  # 4 only when C and K are multiples of 4 (128-bit accesses)
    tile: tuple[int, int, int] = (128, 128, 16)
    # With 3xtf32 (two tf32 parts of each operand in registers) a 64x64x16 warp tile spills about
    # 1 KB per thread (nvcc 13, sm_90); 64x32x16 (8 warps of 128x128x16) does not. tf32 fits both.
    warp: tuple[int, int, int] = (64, 64, 16)
    stages: int = 3
    activation: Literal["identity", "relu", "silu", "sigmoid", "gelu", "gelu_tanh"] = "identity"
    bias: bool
    symbol_prefix: ClassVar[str] = "sc_cutlass_conv_"
    extension_prefix: ClassVar[str] = "stitchcuda_cutlass_conv_"

    @model_validator(mode="after")
    def _shapes(self) -> CutlassConv:
        # Caught here rather than as a page of template errors from nvcc a minute later.
        if any(t % w for t, w in zip(self.tile, self.warp, strict=True)):
            raise ValueError(f"tile {self.tile} is not a multiple of warp {self.warp}")
        if any(w % i for w, i in zip(self.warp, (16, 8, 8), strict=True)):
            raise ValueError(f"warp {self.warp} is not a multiple of the 16x8x8 instruction")
        if self.stages < 2:
            raise ValueError(f"stages {self.stages}: CUTLASS pipelines need at least 2")
        return self

    @property
    def describe(self) -> str:
        iterator = "optimized" if self.align == 4 else "analytic"
        epilogue = " + ".join([*(["bias"] if self.bias else []), self.activation])
        return (f"CUTLASS implicit-GEMM conv2d fprop, {self.math}, align {self.align} ({iterator} iterators), "
                f"tile {'x'.join(map(str, self.tile))}, warp {'x'.join(map(str, self.warp))}, "
                f"{self.stages} stages, epilogue {epilogue}")


def kernel_sources(cfg: CutlassConv) -> tuple[str, str]:
    """(CUDA source, C++ binding source) of ``cfg``'s extension, for load_inline."""
    cuda = templates().get_template("cutlass_conv.cu.j2").render(
        describe=cfg.describe, abi=CONV_ABI, align=cfg.align, tile=cfg.tile, warp=cfg.warp, stages=cfg.stages,
        math_op=_MATH_OPS[cfg.math], iterator=_ITERATORS[cfg.align], bias=cfg.bias,
        activation_body=_ACTIVATIONS[cfg.activation], symbol=cfg.symbol)
    cpp = templates().get_template("address_binding.cpp.j2").render(
        name=cfg.extension_name, describe=cfg.describe,
        functions=[("launcher_address", f"address of {cfg.symbol} (ScConvFn)"),
                   ("workspace_address", f"address of {cfg.symbol}_workspace (ScConvWorkspaceFn)")])
    return cuda, cpp


def compile_check_conv(cfg: CutlassConv, arch: str = "sm_90", timeout_s: float = 900) -> CompileCheck:
    """nvcc -c of ``cfg``'s CUDA source against CUTLASS's headers, with the defines torch's
    extension build adds (CUTLASS's half types must survive them)."""
    return compile_unit(kernel_sources(cfg)[0], cfg.extension_name, cfg.describe, arch, timeout_s)


def conv_supported(groups: int, transposed: bool, dims: int, dtype: str) -> str | None:
    """None when this path computes the convolution, else why not."""
    if dims != 2:
        return f"{dims}-d convolution: the CUTLASS path is 2-d only"
    if transposed:
        return "transposed convolution: the CUTLASS path is forward (fprop) only"
    if groups != 1:
        return f"groups={groups}: the CUTLASS path is for dense convolutions (groups=1)"
    if str(dtype).removeprefix("torch.") not in ("float32", "float"):
        return f"dtype {dtype}: the CUTLASS path is float32 only"
    return None
