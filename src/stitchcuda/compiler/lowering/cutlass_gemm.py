"""fp32 GEMMs on tensor cores through CUTLASS 2.x, each built as its own small kernel extension.

cuBLAS cannot fuse an activation into an fp32 GEMM's epilogue and only gives fp32 accuracy on
tensor cores through its own opt-in paths; a CUTLASS GemmUniversal with 3xTF32 does both. Its
cost is compile time: one instantiation takes tens of seconds of nvcc. So the GEMM lives in an
extension of its own whose source depends ONLY on the configuration: the torch extension build
cache then builds each configuration once and every program that needs it reuses the .so. The
program and the extension meet at a plain C ABI (``ABI``): the program asks the extension for
the launcher's address once and calls it from its own CUDA code, with no torch in between.

The kernels are SM80 ones (``cp.async`` + ``mma.sync`` 16x8x8 TF32); they run unchanged on H100.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import jinja2
from pydantic import BaseModel

from stitchcuda import machine
from stitchcuda.compiler.check import CompileCheck
from stitchcuda.compiler.lowering.cuda_files import TEMPLATES
from stitchcuda.templating import environment

INCLUDE_ENV = "STITCHCUDA_CUTLASS_INCLUDE"
CUDA_CFLAGS = ["-O3", "-std=c++17", "--expt-relaxed-constexpr"]

ABI = """#ifndef SC_GEMM_ABI
#define SC_GEMM_ABI
#include <cstdint>
#include <cuda_runtime.h>
struct ScGemmArgs {
  int m, n, k, batch;            // batch > 1: strided-batched
  const float* a; const float* b; const float* c; float* d;
  int64_t lda, ldb, ldc, ldd;    // leading dims in elements (ldc may be 0: C broadcast over rows)
  int64_t stride_a, stride_b, stride_c, stride_d;  // batch strides in elements
  float alpha, beta;
};
typedef int (*ScGemmFn)(const ScGemmArgs*, cudaStream_t);   // 0: launched; else a CUTLASS status or CUDA error code (+1000)
#endif
"""

# activation -> (header under cutlass/epilogue/thread, functor template taking the common tail).
# gelu_tanh: CUTLASS's own tanh GELU (GELU_taylor) uses tanh.approx.f32 (~5e-4 relative error),
# which would undo 3xTF32's fp32 accuracy, so the template defines ScGeluTanh on tanhf instead.
_EPILOGUES = {
    "identity": ("linear_combination.h", "cutlass::epilogue::thread::LinearCombination"),
    "relu": ("linear_combination_relu.h", "cutlass::epilogue::thread::LinearCombinationRelu"),
    "gelu": ("linear_combination_gelu.h", "cutlass::epilogue::thread::LinearCombinationGELU"),
    "gelu_tanh": ("linear_combination_generic.h",
                  "cutlass::epilogue::thread::LinearCombinationGeneric<ScGeluTanh, "),
    "silu": ("linear_combination_silu.h", "cutlass::epilogue::thread::LinearCombinationSilu"),
    "sigmoid": ("linear_combination_sigmoid.h", "cutlass::epilogue::thread::LinearCombinationSigmoid"),
}
_MATH_OPS = {"3xtf32": "cutlass::arch::OpMultiplyAddFastF32", "tf32": "cutlass::arch::OpMultiplyAdd"}

# The two shapes tiles_for picks from: few shapes means few distinct kernels to build.
# 64x64 warp tiles spill registers in 3xTF32 (255 registers, ~900 B of spills on sm_90); 64x32 ones do not.
BIG = ((128, 128, 16), (64, 32, 16), 3)
SMALL = ((64, 64, 16), (32, 32, 16), 4)
H100_SMS = 132


class ExtensionConfig(BaseModel, frozen=True):
    """A CUTLASS kernel extension's configuration: the extension's source depends on its fields
    alone, so their hash names the extension (its build-cache entry) and its launcher."""

    symbol_prefix: ClassVar[str]
    extension_prefix: ClassVar[str]

    @property
    def key(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]

    @property
    def symbol(self) -> str:
        return self.symbol_prefix + self.key

    @property
    def extension_name(self) -> str:
        return self.extension_prefix + self.key


class CutlassGemm(ExtensionConfig, frozen=True):
    """D = act(alpha * A @ B + beta * C); A [M,K], B [K,N], C/D [M,N] row-major fp32."""

    math: Literal["3xtf32", "tf32"]
    a_col: bool  # A stored column-major (A^T contiguous)
    b_col: bool  # B stored column-major, e.g. nn.Linear's weight [N,K]
    align_a: Literal[1, 2, 4]  # access widths in elements: what the shapes, pointers and strides allow
    align_b: Literal[1, 2, 4]
    align_c: Literal[1, 2, 4]
    tile: tuple[int, int, int] = BIG[0]
    warp: tuple[int, int, int] = BIG[1]
    stages: int = BIG[2]
    activation: Literal["identity", "relu", "gelu", "gelu_tanh", "silu", "sigmoid"] = "identity"
    symbol_prefix: ClassVar[str] = "sc_cutlass_gemm_"
    extension_prefix: ClassVar[str] = "stitchcuda_cutlass_"

    @property
    def describe(self) -> str:
        math = {"3xtf32": "3xTF32", "tf32": "TF32"}[self.math]
        tile = "x".join(map(str, self.tile))
        layouts = f"A {'col' if self.a_col else 'row'}/B {'col' if self.b_col else 'row'}"
        act = "" if self.activation == "identity" else f" + {self.activation}"
        return (f"CUTLASS {math} GEMM {tile} tile, {self.stages} stages, {layouts}, "
                f"align {self.align_a}/{self.align_b}/{self.align_c}, epilogue alpha.acc + beta.C{act}")

    @staticmethod
    def tiles_for(m: int, n: int, k: int, batch: int = 1) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
        """(tile, warp, stages): 128x128 tiles unless they would fill fewer than ~2 waves of an H100."""
        del k  # the K extent does not change how well the grid fills the machine
        tiles = -(-m // BIG[0][0]) * -(-n // BIG[0][1]) * max(batch, 1)
        return SMALL if tiles < 2 * H100_SMS else BIG


def split_k_slices(gemm: Any) -> int:
    """How many slices of K a deep, small product runs as (1: none). M = N = 256, K = 524288 (L1/6)
    fills 16 of an H100's 132 SMs as one GEMM; as 32 batched slices of K it fills them all, and
    one pass sums the slices, adding the bias or residual and applying the activation the
    product's epilogue held. Only a single product with a dense output."""
    if gemm.batch != 1 or gemm.outer != 1 or gemm.ld_c not in (0, gemm.n) \
            or (gemm.c and gemm.ld_c_src not in (0, gemm.n)):
        return 1
    tiles = -(-gemm.m // 64) * -(-gemm.n // 64)
    if gemm.k < 16 * max(gemm.m, gemm.n) or tiles >= H100_SMS:
        return 1
    slices = 1
    while tiles * slices < 2 * H100_SMS and slices < 64 and gemm.k % (8 * slices) == 0 and gemm.k // (2 * slices) >= 512:
        slices *= 2
    return slices


def grid_fill(gemm: Any, sms: int) -> float:
    """The share of the SMs a CUTLASS product's tiles keep busy over its waves (its slices of K
    included): 1024 x 256 in 64 x 64 tiles is 64 tiles, half of an H100's 132 SMs for the whole
    kernel, as measured (hf_bert's products ran no faster in CUTLASS's 3xTF32 than in SGEMM)."""
    tile = CutlassGemm.tiles_for(gemm.m, gemm.n, gemm.k, gemm.batch)[0]
    tiles = -(-gemm.m // tile[0]) * -(-gemm.n // tile[1]) * max(gemm.batch, 1) * split_k_slices(gemm)
    return tiles / (-(-tiles // sms) * sms)


def _epilogue(cfg: CutlassGemm) -> tuple[str, str]:
    header, functor = _EPILOGUES[cfg.activation]
    # C and D move align_c floats per access, so the epilogue computes that many per step.
    args = f"float, {cfg.align_c}, float, float, cutlass::epilogue::thread::ScaleType::Default"
    # ScaleType::Default makes is_source_needed() return beta != 0: with beta = 0 C is never read.
    if functor.endswith(", "):  # the generic functor: heavy like CUTLASS's own GELU, so not unrolled
        return header, f"{functor}{args}, cutlass::FloatRoundStyle::round_to_nearest, true>"
    return header, f"{functor}<{args}>"


def templates() -> jinja2.Environment:
    """The compiler's templates, as the Emitter renders them."""
    return environment(TEMPLATES)


def kernel_sources(cfg: CutlassGemm) -> tuple[str, str]:
    """(cuda_src, cpp_src) for load_inline(name=cfg.extension_name, no_implicit_headers=True, ...)."""
    env = templates()
    header, epilogue = _epilogue(cfg)
    major = {False: "cutlass::layout::RowMajor", True: "cutlass::layout::ColumnMajor"}
    cuda_src = env.get_template("cutlass_gemm.cu.j2").render(
        describe=cfg.describe, key=cfg.key, abi=ABI.rstrip("\n"), symbol=cfg.symbol,
        epilogue_header=header, epilogue=epilogue, layout_a=major[cfg.a_col], layout_b=major[cfg.b_col],
        tile=cfg.tile, warp=cfg.warp, stages=cfg.stages, align_a=cfg.align_a, align_b=cfg.align_b,
        align_c=cfg.align_c, math_op=_MATH_OPS[cfg.math], gelu_tanh=cfg.activation == "gelu_tanh")
    cpp_src = env.get_template("address_binding.cpp.j2").render(
        name=cfg.extension_name, describe=cfg.describe,
        functions=[("launcher_address", f"address of {cfg.symbol} (ScGemmFn)")])
    return cuda_src, cpp_src


def cutlass_include() -> list[Path] | None:
    """CUTLASS's include dirs: $STITCHCUDA_CUTLASS_INCLUDE (os.pathsep-separated), else the
    nvidia-cutlass wheel's. Found without importing cutlass_library, whose import is slow."""
    if override := os.environ.get(INCLUDE_ENV):
        dirs = [Path(p) for p in override.split(os.pathsep) if p]
    else:
        try:
            spec = importlib.util.find_spec("cutlass_library")
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            return None
        roots = list(spec.submodule_search_locations or [])
        if not roots and spec.origin:
            roots = [str(Path(spec.origin).parent)]
        if not roots:
            return None
        source = Path(roots[0]) / "source"
        dirs = [source / "include", source / "tools" / "util" / "include"]
    dirs = [d for d in dirs if d.is_dir()]
    return dirs if dirs and (dirs[0] / "cutlass" / "cutlass.h").is_file() else None


def load_inline_kwargs(cfg: CutlassGemm) -> dict:
    """Everything torch.utils.cpp_extension.load_inline needs to build ``cfg``'s extension."""
    include = cutlass_include()
    if include is None:
        raise FileNotFoundError(f"CUTLASS headers not found: pip install nvidia-cutlass or set {INCLUDE_ENV}")
    cuda_src, cpp_src = kernel_sources(cfg)
    return dict(name=cfg.extension_name, cuda_sources=cuda_src, cpp_sources=cpp_src,
                extra_include_paths=[str(p) for p in include], extra_cuda_cflags=list(CUDA_CFLAGS),
                no_implicit_headers=True)


def compile_unit(cuda_src: str, name: str, describe: str, arch: str = "sm_90", timeout_s: float = 900) -> CompileCheck:
    """nvcc -c of one kernel extension's CUDA for ``arch`` against CUTLASS's headers, with the flags
    torch adds to every extension build (so the check sees what the real build sees): what one
    instantiation costs, in seconds."""
    nvcc = machine.nvcc_path()
    if nvcc is None:
        return CompileCheck(status="skipped", detail="nvcc not found: install the CUDA toolkit to compile-check")
    include = cutlass_include()
    if include is None:
        return CompileCheck(status="skipped",
                            detail=f"CUTLASS headers not found: pip install nvidia-cutlass or set {INCLUDE_ENV}")
    try:
        from torch.utils.cpp_extension import COMMON_NVCC_FLAGS
    except ImportError:
        COMMON_NVCC_FLAGS = []  # noqa: N806
    flags = [*CUDA_CFLAGS, *(f for f in COMMON_NVCC_FLAGS if f not in CUDA_CFLAGS), f"-arch={arch}", "-Xcompiler", "-fPIC",
             *(f"-I{p}" for p in include)]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stitchcuda-cutlass-") as tmp:
        unit = Path(tmp) / f"{name}.cu"
        unit.write_text(cuda_src)
        try:
            done = subprocess.run([nvcc, *flags, "-c", str(unit), "-o", str(Path(tmp) / "unit.o")],
                                  capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return CompileCheck(status="failed", detail=f"nvcc ran past {timeout_s:g} s",
                                seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line][:5]
        return CompileCheck(status="failed", detail="nvcc failed:\n" + ("\n".join(errors) or done.stderr[-1500:]),
                            seconds=seconds)
    return CompileCheck(status="compiled", detail=f"{describe}: compiled for {arch}", seconds=seconds)


def compile_check_gemm(cfg: CutlassGemm, arch: str = "sm_90", timeout_s: float = 900) -> CompileCheck:
    return compile_unit(kernel_sources(cfg)[0], cfg.extension_name, cfg.describe, arch, timeout_s)
