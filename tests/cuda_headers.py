"""Real CUDA library headers for the CPU compile checks.

A CPU machine's CUDA toolkit has nvcc and the runtime's headers, but it may lack the headers of
cuBLAS, cuSPARSE and cuSOLVER (torch's ATen/cuda headers include all three) and of cuDNN. NVIDIA
ships them in its pip wheels, the ones a CUDA build of torch installs. We take each from the first
place that has it: the toolkit, an installed wheel (``nvidia/*/include`` on ``sys.path``), or our
cache, which the wheels are fetched into once with pip. Only their headers are kept (about 2.4 MB
of about 1.4 GB of wheels, which hold the libraries too), so they are not a dev dependency.

``python -m tests.cuda_headers`` fetches them ahead of a test run;
``STITCHCUDA_FETCH_CUDA_HEADERS=0`` keeps the tests from fetching (they skip, saying what is missing).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from stitchcuda import machine

# the library headers the generated programs include, directly or through torch's ATen/cuda headers
NEEDED = ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h", "cudnn.h")
# per CUDA major version: the wheels (pinned: compile-checked with the toolkit of that major) and
# the needed headers each holds
WHEELS = {
    13: {"nvidia-cublas==13.10.0.20": ("cublas_v2.h", "cublasLt.h"), "nvidia-cusparse==12.9.4.2": ("cusparse.h",),
         "nvidia-cusolver==12.4.1.2": ("cusolverDn.h",), "nvidia-cudnn-cu13==9.28.1.4": ("cudnn.h",)},
}
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stitchcuda" / "cuda-headers"


class HeadersMissing(RuntimeError):
    """A header no toolkit, wheel or fetch could provide; the message says which and why."""


def toolkit() -> tuple[str, Path] | None:
    """(nvcc, the toolkit folder), or None where there is no CUDA toolkit."""
    home, nvcc = machine.cuda_home(), machine.nvcc_path()
    if nvcc is None:
        return None
    return nvcc, Path(home) if home else Path(nvcc).resolve().parent.parent


def cuda_major(home: Path) -> int | None:
    header = home / "include" / "cuda_runtime_api.h"
    found = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text()) if header.exists() else None
    return int(found[1]) // 1000 if found else None


def _installed(header: str) -> Path | None:
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir():
            for include in sorted(root.glob("*/include")):
                if (include / header).exists():
                    return include
    return None


def _cached(major: int) -> Path:
    pins = "\n".join(sorted(WHEELS.get(major, {})))
    return CACHE / f"cuda{major}-{hashlib.sha256(pins.encode()).hexdigest()[:12]}" / "include"


def fetch(major: int, wanted: list[str]) -> Path:
    """Download the wheels holding ``wanted`` with pip and keep their headers in the cache."""
    if major not in WHEELS:
        raise HeadersMissing(f"no pinned header wheels for CUDA {major} (tests/cuda_headers.py WHEELS): "
                             f"{', '.join(wanted)} cannot be fetched")
    target = _cached(major)
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time (pytest-xdist, two checkouts)
        specs = [spec for spec, holds in WHEELS[major].items() if any(h in holds and not (target / h).exists()
                                                                      for h in wanted)]
        if specs:
            _download_headers(specs, wanted, target)
    if absent := [h for h in wanted if not (target / h).exists()]:
        raise RuntimeError(f"the pinned wheels {', '.join(specs)} hold no {', '.join(absent)}: fix WHEELS")
    return target


def _download_headers(specs: list[str], wanted: list[str], target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent.parent, prefix=".fetch-") as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                               "--only-binary=:all:", "--quiet", "--timeout", "30", "--retries", "1", "-d", tmp,
                               *specs], capture_output=True, text=True, timeout=1200)
        if done.returncode != 0:
            raise HeadersMissing(f"pip could not fetch {', '.join(specs)} for {', '.join(wanted)}: "
                                 f"{done.stderr.strip()[-600:]}")
        staging = Path(tmp) / "include"
        if target.exists():
            shutil.copytree(target, staging)
        staging.mkdir(exist_ok=True)
        for wheel in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(wheel) as archive:
                for member in archive.namelist():
                    if "/include/" in member and member.endswith((".h", ".hpp")):
                        (staging / Path(member).name).write_bytes(archive.read(member))
            wheel.unlink()  # the libraries: about 1.4 GB we never load
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)


def include_dirs(home: Path, allow_fetch: bool | None = None) -> list[Path]:
    """Folders to add with -I so that every NEEDED header resolves to a real one beside the
    toolkit's own; fetches what is nowhere else (unless STITCHCUDA_FETCH_CUDA_HEADERS=0)."""
    if allow_fetch is None:
        allow_fetch = os.environ.get("STITCHCUDA_FETCH_CUDA_HEADERS", "1") != "0"
    dirs: list[Path] = []
    missing: list[str] = []
    major = cuda_major(home)
    for header in NEEDED:
        if (home / "include" / header).exists():
            continue
        where = _installed(header) or (_cached(major) if major and (_cached(major) / header).exists() else None)
        if where is None:
            missing.append(header)
        elif where not in dirs:
            dirs.append(where)
    if missing:
        if major is None:
            raise HeadersMissing(f"the CUDA toolkit at {home} has no cuda_runtime_api.h to tell its version")
        if not allow_fetch:
            raise HeadersMissing(f"{', '.join(missing)}: in neither the CUDA toolkit at {home}, an installed "
                                 "nvidia wheel nor the cache, and STITCHCUDA_FETCH_CUDA_HEADERS=0")
        if (fetched := fetch(major, missing)) not in dirs:
            dirs.append(fetched)
    return dirs


if __name__ == "__main__":
    found = toolkit()
    if found is None:
        sys.exit("no CUDA toolkit (nvcc) here: the compile checks skip, and need no headers")
    for folder in include_dirs(found[1], allow_fetch=True):
        print(folder)
