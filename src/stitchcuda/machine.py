"""What the machine has, read without initialising CUDA in this process (nvidia-smi, nvcc)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

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


class CpuSplit(BaseModel):
    """Cores for builds, and one core per GPU kept free of them for timing.

    Eager PyTorch launches its kernels from Python, so when the GPU waits on the host its time
    grows with every nvcc that shares the core: with nine tasks building beside it, eager
    gru_decoder timed anywhere from 12 to 20 ms, and its speedup with it. A GPU worker times on
    its own core (and that core's other hardware threads build nothing); builds run on the rest.
    """

    builds: list[int]  # builds, and every other work of a bench but timing
    timing: dict[int, int]  # GPU index -> the core its worker times on


def usable_cores() -> int:
    """The cores this process may run on: its affinity (taskset, a container's cpuset), not the
    machine's count, so a bench confined to 16 of 64 cores starts 16 builds, not 64."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def visible_gpus() -> tuple[Gpu, ...]:
    """The GPUs CUDA_VISIBLE_DEVICES leaves this process (all of them when it is unset)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return gpus()
    wanted = [int(v) for v in (v.strip() for v in visible.split(",")) if v.isdigit()]
    return tuple(g for i in wanted for g in gpus() if g.index == i)


def cpu_split() -> CpuSplit | None:
    """The split for this process's cores and the machine's GPUs; None without GPUs, with fewer
    than four cores per GPU, or when ``STITCHCUDA_QUIET_CORES=0``."""
    if os.environ.get("STITCHCUDA_QUIET_CORES", "1") == "0" or not hasattr(os, "sched_getaffinity"):
        return None
    cores = sorted(os.sched_getaffinity(0))
    found = visible_gpus()
    if not found or len(cores) < 4 * len(found):
        return None
    quiet = cores[-len(found):]
    # a hardware thread beside a timing core shares its execution units: a build there slows the
    # timing thread as surely as one on the core itself, so it builds nothing (where enough are left)
    shared = set().union(*(smt_siblings(q) for q in quiet))
    builds = [c for c in cores[: -len(found)] if c not in shared]
    return CpuSplit(builds=builds if len(builds) >= 2 else cores[: -len(found)],
                    timing={g.index: quiet[-1 - i] for i, g in enumerate(found)})


def smt_siblings(core: int) -> set[int]:
    """The other hardware threads of ``core``'s physical core (Linux's CPU topology; none elsewhere)."""
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list").read_text()
    except OSError:
        return set()
    found: set[int] = set()
    for part in text.strip().split(","):  # "3,11" or "2-3"
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found.update(range(int(low), int(high or low) + 1))
    return found - {core}


def keep_off_timing_cores() -> None:
    """Bind this process, and those it starts from now on, to the cores :func:`cpu_split` leaves to
    builds: work a bench runs beside the GPUs' timing (the offline Coder's captures) never lands on a
    core a timing thread runs on. Nothing where there is no split."""
    split = cpu_split()
    if split is not None:
        confine(",".join(map(str, split.builds)))


def confine(cores: str | None) -> None:
    """Bind this thread, and the processes it starts from now on, to ``cores`` ("0,1,5")."""
    wanted = {int(c) for c in (cores or "").split(",") if c.strip().isdigit()}
    if wanted and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):  # cores this process may not use: stay where it is
            os.sched_setaffinity(0, wanted)


def physical_gpu(device: str) -> Gpu | None:
    """The GPU that ``cuda:N`` names, honouring the caller's CUDA_VISIBLE_DEVICES."""
    match = re.fullmatch(r"cuda(?::(\d+))?", device)
    if not match:
        return None
    logical = int(match[1] or 0)
    visible = visible_gpus()
    return visible[logical] if logical < len(visible) else None


# where a CUDA toolkit installs when nothing says otherwise
DEFAULT_CUDA_HOME = "/usr/local/cuda"


def cuda_home() -> str | None:
    """The CUDA toolkit's folder: the first of ``$CUDA_HOME``, ``$CUDA_PATH`` and /usr/local/cuda
    that has a ``bin/nvcc``, else the toolkit around the nvcc on PATH; None without a toolkit.

    The one lookup of the toolkit: everything that needs nvcc, another CUDA program or the
    toolkit's headers asks here (or :func:`cuda_tool`)."""
    for candidate in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), DEFAULT_CUDA_HOME):
        if candidate and (Path(candidate) / "bin" / "nvcc").exists():
            return candidate
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(nvcc).resolve()
        # a wrapper script (as on some machines) does not sit inside the toolkit
        return str(real.parent.parent) if (real.parent.parent / "include" / "cuda.h").exists() else None
    return None


def toolkit_home() -> Path | None:
    """:func:`cuda_home` as a path, else the folder around the nvcc found (a wrapper's, say):
    where the compile checks look for the toolkit's headers; None without nvcc."""
    if home := cuda_home():
        return Path(home)
    nvcc = nvcc_path()
    return Path(nvcc).resolve().parent.parent if nvcc else None


def cuda_tool(name: str) -> str | None:
    """A program of the CUDA toolkit (``nvcc``, ``ncu``, ``cu++filt``): on PATH first, else in the
    toolkit's ``bin/``; None where neither has it."""
    if found := shutil.which(name):
        return found
    home = cuda_home()
    path = Path(home) / "bin" / name if home else None
    return str(path) if path is not None and path.exists() else None


def nvcc_path() -> str | None:
    return cuda_tool("nvcc")


@functools.cache
def nvcc_version() -> str | None:
    nvcc = nvcc_path()
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
