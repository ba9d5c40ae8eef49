"""What this machine can do for StitchCUDA, each problem with its fix (``stitchcuda doctor``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from stitchcuda import machine
from stitchcuda.paths import cache_root

Status = Literal["ok", "warn", "fail"]

# A kernel small enough to build in seconds: ncu profiles it to prove counters are readable.
_PROBE_CU = """
#include <cstdio>
__global__ void probe(float* x) { x[threadIdx.x] += 1.0f; }
int main() {
  float* x; cudaMalloc(&x, 32 * sizeof(float));
  probe<<<1, 32>>>(x);
  cudaError_t err = cudaDeviceSynchronize();
  printf("probe: %s\\n", cudaGetErrorString(err));
  return err == cudaSuccess ? 0 : 1;
}
"""


class Check(BaseModel):
    name: str
    status: Status
    detail: str
    fix: str | None = None


class DoctorReport(BaseModel):
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return all(c.status != "fail" for c in self.checks)


def _run(cmd: list[str], timeout: float, cwd: str | None = None) -> tuple[int, str]:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return -1, f"timed out after {timeout:g} s"
    except OSError as exc:
        return -1, str(exc)
    return done.returncode, done.stdout + done.stderr


def target_arch() -> tuple[str, str]:
    """(arch, where it comes from): what extensions will be built for."""
    if env := os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return env, "TORCH_CUDA_ARCH_LIST"
    gpus = machine.gpus()
    if gpus:
        return gpus[0].compute_capability, f"GPU 0 ({gpus[0].name})"
    return os.environ.get("STITCHCUDA_DEFAULT_ARCH", "9.0"), "default (no GPU; set STITCHCUDA_DEFAULT_ARCH to change)"


def check_gpu() -> Check:
    gpus = machine.gpus()
    if not gpus:
        return Check(name="gpu", status="warn", detail="no NVIDIA GPU visible (nvidia-smi found none)",
                     fix="runtime verification needs a CUDA GPU and its driver; on this machine StitchCUDA "
                         "can load tasks, run static checks and compile candidates with nvcc")
    listed = "; ".join(f"cuda:{g.index} {g.name} (sm_{g.compute_capability.replace('.', '')}, "
                       f"{g.memory_mib} MiB, driver {g.driver})" for g in gpus)
    return Check(name="gpu", status="ok", detail=listed)


def check_torch() -> Check:
    try:
        import torch
    except ImportError:
        return Check(name="torch", status="fail", detail="torch is not installed",
                     fix="pip install torch (a CUDA build on a GPU machine)")
    cuda = torch.version.cuda
    detail = f"torch {torch.__version__}, " + (f"built with CUDA {cuda}" if cuda else "CPU-only build")
    if machine.gpus() and not cuda:
        return Check(name="torch", status="fail", detail=detail + ", but this machine has a GPU",
                     fix="install a CUDA build of torch that matches the driver (see pytorch.org)")
    if machine.gpus() and not torch.cuda.is_available():
        return Check(name="torch", status="fail", detail=detail + ", but torch.cuda.is_available() is False",
                     fix="the driver is too old for this torch build, or CUDA_VISIBLE_DEVICES hides the GPUs")
    return Check(name="torch", status="ok", detail=detail)


def check_nvcc() -> Check:
    path = machine.nvcc_path()
    if path is None:
        return Check(name="nvcc", status="fail", detail="nvcc not found on PATH or in $CUDA_HOME/bin",
                     fix="install the CUDA toolkit and put its bin/ on PATH (or set CUDA_HOME)")
    version = machine.nvcc_version() or "unknown"
    arch, source = target_arch()
    detail = f"{path}, CUDA {version}; builds for sm_{arch.replace('.', '').split(';')[0]} ({source})"
    _, archs = _run([path, "--list-gpu-arch"], timeout=30)
    # "9.0a" / "10.0f" name arch-specific variants of compute_90 / compute_100
    wanted = [re.sub(r"[af]$", "", a.strip().replace(".", "").replace("+PTX", ""))
              for a in re.split(r"[;\s]+", arch) if a.strip()]
    unsupported = [a for a in wanted if archs and f"compute_{a}" not in archs]
    if unsupported:
        return Check(name="nvcc", status="fail", detail=detail + f"; nvcc cannot target {unsupported}",
                     fix="use a CUDA toolkit that supports this GPU, or set TORCH_CUDA_ARCH_LIST")
    try:
        import torch

        torch_cuda = torch.version.cuda
    except ImportError:
        torch_cuda = None
    if torch_cuda and version != "unknown" and torch_cuda.split(".")[0] != version.split(".")[0]:
        return Check(name="nvcc", status="fail",
                     detail=detail + f"; torch was built with CUDA {torch_cuda}, a different major version",
                     fix="install the toolkit matching torch's CUDA (or the torch build matching nvcc): "
                         "extensions built by another major version fail to load")
    return Check(name="nvcc", status="ok", detail=detail)


def check_cuda_libraries() -> Check:
    """Headers that ATen/cuda/CUDAContext.h pulls in: most real candidates include it."""
    home = machine.cuda_home()
    if home is None:
        return Check(name="cuda libs", status="warn", detail="no CUDA toolkit found (see nvcc)",
                     fix="set CUDA_HOME to the toolkit folder")
    include = Path(home) / "include"
    wanted = ["cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h"]
    missing = [h for h in wanted if not (include / h).exists()
               and not any((Path(p) / h).exists() for p in os.environ.get("CPATH", "").split(os.pathsep) if p)]
    if missing:
        return Check(name="cuda libs", status="warn", detail=f"{include} lacks {', '.join(missing)}",
                     fix="install the CUDA math library headers (e.g. cuda-libraries-dev): candidates that "
                         "include ATen/cuda/CUDAContext.h or call cuBLAS(Lt) will not build here")
    return Check(name="cuda libs", status="ok", detail=f"cuBLAS, cuBLASLt, cuSPARSE, cuSOLVER headers in {include}")


def check_host_compiler() -> Check:
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    ninja = shutil.which("ninja")
    if cxx is None:
        return Check(name="c++/ninja", status="fail", detail="no C++ compiler found",
                     fix="install g++ (nvcc needs a host compiler; load_inline builds main.cpp with it)")
    if ninja is None:
        return Check(name="c++/ninja", status="fail", detail=f"{cxx}; ninja not found",
                     fix="pip install ninja (torch's load_inline builds with it)")
    return Check(name="c++/ninja", status="ok", detail=f"{cxx}; {ninja}")


def check_ncu(probe: bool = True) -> Check:
    ncu = machine.cuda_tool("ncu")
    if ncu is None:
        return Check(name="ncu", status="warn", detail="Nsight Compute (ncu) not found",
                     fix="install Nsight Compute for kernel-level metrics; profiling falls back to torch.profiler")
    if not machine.gpus():
        return Check(name="ncu", status="warn", detail=f"{ncu}; no GPU, so counters cannot be read here")
    nvcc = machine.nvcc_path()
    if not probe or nvcc is None:
        return Check(name="ncu", status="ok", detail=f"{ncu} (counters not probed)")
    arch = re.sub(r"\+PTX$", "", target_arch()[0].split(";")[0].replace(".", ""))
    with tempfile.TemporaryDirectory(prefix="stitchcuda-doctor-") as tmp:
        (Path(tmp) / "probe.cu").write_text(_PROBE_CU)
        rc, out = _run([nvcc, f"-arch=sm_{arch}", "-o", "probe", "probe.cu"], timeout=120, cwd=tmp)
        if rc != 0:
            return Check(name="ncu", status="warn", detail=f"{ncu}; the probe kernel did not build: {out[-300:]}")
        rc, out = _run([ncu, "--clock-control", "none", "--metrics", "gpu__time_duration.sum", "./probe"],
                       timeout=180, cwd=tmp)
    if "ERR_NVGPUCTRPERM" in out:
        return Check(name="ncu", status="warn", detail=f"{ncu}; no permission to read GPU counters",
                     fix="run as root, or load the driver with NVreg_RestrictProfilingToAdminUsers=0")
    if rc != 0 or "gpu__time_duration.sum" not in out:
        last = [line for line in out.strip().splitlines() if line.strip()][-1:] or ["no output"]
        return Check(name="ncu", status="warn", detail=f"{ncu}; could not read counters: {last[0][:300]}",
                     fix="kernel metrics will be missing; timings and torch.profiler still work")
    return Check(name="ncu", status="ok", detail=f"{ncu}; reads hardware counters")


def check_cache() -> Check:
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
            pass
    except OSError as exc:
        return Check(name="cache", status="fail", detail=f"{root} is not writable: {exc}",
                     fix="set STITCHCUDA_CACHE to a writable folder")
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    builds = root / "builds"
    count = sum(1 for p in builds.iterdir() if p.is_dir()) if builds.is_dir() else 0
    free = shutil.disk_usage(root).free
    detail = f"{root}: {count} builds, {size / 2**20:.0f} MiB; {free / 2**30:.0f} GiB free"
    if free < 2 * 2**30:
        return Check(name="cache", status="warn", detail=detail, fix="free disk space: each build takes ~10-50 MiB")
    return Check(name="cache", status="ok", detail=detail)


def diagnose(probe_ncu: bool = True) -> DoctorReport:
    return DoctorReport(checks=[check_gpu(), check_torch(), check_nvcc(), check_cuda_libraries(), check_host_compiler(),
                                check_ncu(probe_ncu), check_cache()])
