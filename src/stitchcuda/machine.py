"""What the machine has, read without initialising CUDA in this process (nvidia-smi, nvcc)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from pydantic import BaseModel


class Gpu(BaseModel):
    index: int
    name: str
    compute_capability: str
    memory_mib: int | None = None
    driver: str | None = None


def _run(cmd: list[str], timeout: float = 20) -> str | None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


@functools.cache
def gpus() -> tuple[Gpu, ...]:
    """GPUs in PCI bus order, as nvidia-smi lists them; empty without a driver."""
    if not shutil.which("nvidia-smi"):
        return ()
    out = _run(["nvidia-smi", "--query-gpu=index,name,compute_cap,memory.total,driver_version",
                "--format=csv,noheader,nounits"])
    found = []
    for line in (out or "").strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 5 and parts[0].isdigit():
            found.append(Gpu(index=int(parts[0]), name=parts[1], compute_capability=parts[2],
                             memory_mib=int(parts[3]) if parts[3].isdigit() else None, driver=parts[4]))
    return tuple(found)


def physical_gpu(device: str) -> Gpu | None:
    """The GPU that ``cuda:N`` names, honouring the caller's CUDA_VISIBLE_DEVICES."""
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if not match:
        return None
    logical = int(match[1] or 0)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    indices = [g.index for g in gpus()]
    if visible is not None and visible.strip():
        entries = [v.strip() for v in visible.split(",") if v.strip()]
        indices = [int(v) for v in entries if v.isdigit()]
    if logical >= len(indices):
        return None
    return next((g for g in gpus() if g.index == indices[logical]), None)


@functools.cache
def nvcc_version() -> str | None:
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        return None
    out = _run([nvcc, "--version"]) or ""
    match = re.search(r"release (\d+\.\d+)", out)
    return match[1] if match else None


def torch_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None
