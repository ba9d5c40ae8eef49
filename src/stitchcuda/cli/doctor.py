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

from stitchcuda import cuda_headers, machine
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


def check_cuda_headers() -> Check:
    """The CUDA library headers programs include (ATen/cuda/CUDAContext.h pulls in cuBLAS(Lt),
    cuSPARSE and cuSOLVER; convolutions call cuDNN): where each is, as compile_check finds them."""
    home = machine.toolkit_home()
    if home is None:
        return Check(name="cuda headers", status="warn", detail="no CUDA toolkit found (see nvcc)",
                     fix="set CUDA_HOME to the toolkit folder")
    found = cuda_headers.locate(home)
    if not found.missing:
        return Check(name="cuda headers", status="ok", detail=found.present())
    detail = (found.present() + "; " if found.where else "") + (
        f"missing: {', '.join(found.missing)} (in neither the toolkit, $CPATH, an installed nvidia wheel nor the "
        "header cache)")
    if found.fetchable:
        fix = (f"`{cuda_headers.FETCH_COMMAND}` fetches {', '.join(found.missing)} once into {cuda_headers.CACHE} "
               "(pip downloads NVIDIA's wheels, about 1.4 GB for all four libraries, and keeps only their headers, "
               "about 2.4 MB); until then programs that include them are not compile-checked here")
    else:
        fix = "install the CUDA math library headers (e.g. cuda-libraries-dev): programs that include them will not build"
    if _torch_cuda():
        fix += "; GPU builds (load_inline) find them only in the toolkit or on $CPATH"
    return Check(name="cuda headers", status="warn", detail=detail, fix=fix)


def _torch_cuda() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.version.cuda


def fetch_cuda_headers() -> Check:
    """``stitchcuda doctor --fetch-headers``: fetch the headers :func:`check_cuda_headers` finds
    missing into the header cache, and say where they went."""
    home = machine.toolkit_home()
    if home is None:
        return Check(name="fetch headers", status="fail", detail="no CUDA toolkit (nvcc) here: nothing to fetch for",
                     fix="install the CUDA toolkit first (see nvcc)")
    try:
        found, fetched = cuda_headers.fetch_missing(home)
    except cuda_headers.HeadersMissing as exc:
        return Check(name="fetch headers", status="fail", detail=str(exc),
                     fix="pip needs NVIDIA's wheels from its index (PIP_INDEX_URL for a mirror); else install "
                         "the CUDA math library headers (e.g. cuda-libraries-dev) or put them on $CPATH")
    if not fetched:
        return Check(name="fetch headers", status="ok", detail="nothing to fetch: no CUDA library header is missing")
    folders = sorted({str(found.where[h][1]) for h in fetched})
    return Check(name="fetch headers", status="ok", detail=f"fetched {', '.join(fetched)} into {', '.join(folders)}")


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


def diagnose(probe_ncu: bool = True, fetch_headers: bool = False) -> DoctorReport:
    """Every check; with ``fetch_headers``, first fetch the missing CUDA library headers (the only
    check that downloads, and only when asked)."""
    fetched = [fetch_cuda_headers()] if fetch_headers else []
    return DoctorReport(checks=[check_gpu(), check_torch(), check_nvcc(), *fetched, check_cuda_headers(),
                                check_host_compiler(), check_ncu(probe_ncu), check_cache()])
