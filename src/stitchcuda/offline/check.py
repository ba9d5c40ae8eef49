"""What the offline Coder can do without a GPU: generate the program and compile its CUDA with nvcc.

Linking and running need a CUDA build of torch and a GPU; this says so instead of pretending.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel


class CompileCheck(BaseModel):
    status: str  # "compiled", "failed" or "skipped"
    detail: str
    seconds: float = 0.0


def cuda_source(program: str) -> str:
    """The CUDA text a generated program hands to load_inline (its ``CUDA_SRC`` constant)."""
    for node in ast.parse(program).body:
        named = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CUDA_SRC"
                                                     for t in node.targets)
        if named and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    raise ValueError("the program has no CUDA_SRC string")


def compile_check(program: str, arch: str = "sm_90", timeout_s: float = 900) -> CompileCheck:
    """nvcc -c of the program's CUDA against torch's headers, for ``arch``."""
    from torch.utils.cpp_extension import CUDA_HOME, include_paths

    nvcc = shutil.which("nvcc") or (str(Path(CUDA_HOME) / "bin" / "nvcc") if CUDA_HOME else None)
    if not nvcc or not Path(nvcc).exists():
        return CompileCheck(status="skipped", detail="nvcc not found: install the CUDA toolkit to compile-check")
    includes = [Path(p) for p in include_paths()]
    if not any((p / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists() for p in includes):
        return CompileCheck(status="skipped", detail="this torch is a CPU build: its headers lack the CUDA parts "
                                                     "(c10/cuda/impl/cuda_cmake_macros.h) the program includes")
    cuda_include = Path(nvcc).resolve().parent.parent / "include"
    if "cublas" in program and not (cuda_include / "cublas_v2.h").exists():
        return CompileCheck(status="skipped", detail=f"the CUDA toolkit at {cuda_include.parent} has no cuBLAS "
                                                     "headers (cublas_v2.h)")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stitchcuda-nvcc-") as tmp:
        unit = Path(tmp) / "program.cu"
        unit.write_text(cuda_source(program))
        cmd = [nvcc, "-std=c++17", f"-arch={arch}", "-O3", "-c", str(unit), "-o", str(Path(tmp) / "program.o"),
               *(f"-I{p}" for p in includes), f"-I{sysconfig.get_paths()['include']}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return CompileCheck(status="failed", detail=f"nvcc ran past {timeout_s:g} s",
                                seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line][:5]
        return CompileCheck(status="failed", detail="\n".join(errors) or done.stderr[-1500:], seconds=seconds)
    return CompileCheck(status="compiled", detail=f"nvcc compiled the program's CUDA for {arch}", seconds=seconds)
