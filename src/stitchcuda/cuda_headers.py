"""Real CUDA library headers for compiling a program on a machine that may lack them.

A CPU machine's CUDA toolkit has nvcc and the runtime's headers, but it may lack the headers of
cuBLAS, cuSPARSE and cuSOLVER (torch's ATen/cuda headers include all three) and of cuDNN. NVIDIA
ships them in its pip wheels, the ones a CUDA build of torch installs. We take each from the first
place that has it: the toolkit, a folder on ``$CPATH``, an installed wheel (``nvidia/*/include`` on
``sys.path``), or our cache. Only :func:`fetch` (``stitchcuda doctor --fetch-headers``) fills the
cache: it downloads the wheels with pip once and keeps their headers (about 2.4 MB of about 1.4 GB
of wheels, which hold the libraries too). Nothing else here downloads.

Imports nothing of stitchcuda: callers pass the toolkit's folder (``machine.cuda_home()``).
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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# the library headers the generated programs include, directly or through torch's ATen/cuda headers
NEEDED = ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h", "cudnn.h")
# per CUDA major version: the wheels (pinned: compile-checked with the toolkit of that major) and
# the needed headers each holds
WHEELS = {
    13: {"nvidia-cublas==13.10.0.20": ("cublas_v2.h", "cublasLt.h"), "nvidia-cusparse==12.9.4.2": ("cusparse.h",),
         "nvidia-cusolver==12.4.1.2": ("cusolverDn.h",), "nvidia-cudnn-cu13==9.28.1.4": ("cudnn.h",)},
}
# Not under $STITCHCUDA_CACHE: that is per workspace (and per test), and these headers are a fact of
# the machine, fetched once for all of them.
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stitchcuda" / "cuda-headers"
FETCH_COMMAND = "stitchcuda doctor --fetch-headers"

_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)


class HeadersMissing(RuntimeError):
    """A header no toolkit, wheel or fetch could provide; the message says which and why."""


@dataclass(frozen=True)
class Found:
    """Where each wanted header is, and which are nowhere here."""

    home: Path
    major: int | None
    where: dict[str, tuple[str, Path]]  # header -> (the kind of place, its folder)
    missing: tuple[str, ...]

    @property
    def dirs(self) -> list[Path]:
        """Folders to add with -I beside the toolkit's own include folder (nvcc searches that one)."""
        return list(dict.fromkeys(folder for kind, folder in self.where.values() if kind != "the CUDA toolkit"))

    @property
    def fetchable(self) -> bool:
        return self.major in WHEELS

    def present(self) -> str:
        """``cublas_v2.h, cublasLt.h in the CUDA toolkit (/usr/local/cuda/include); ...``"""
        by_place: dict[tuple[str, Path], list[str]] = {}
        for header, place in self.where.items():
            by_place.setdefault(place, []).append(header)
        return "; ".join(f"{', '.join(headers)} in {kind} ({folder})" for (kind, folder), headers in by_place.items())

    def missing_detail(self) -> str:
        """Which headers are missing, where we looked, and the one command that fetches them."""
        text = (f"{', '.join(self.missing)} {'are' if len(self.missing) > 1 else 'is'} in neither the CUDA toolkit "
                f"at {self.home}, $CPATH, an installed nvidia wheel nor the header cache ({CACHE})")
        if self.fetchable:
            # the command fetches every library header missing here, these among them
            return text + (f"; `{FETCH_COMMAND}` fetches {'them' if len(self.missing) > 1 else 'it'} once into that "
                           "cache (nothing is fetched unasked)")
        return text + (f"; no header wheels are pinned for CUDA {self.major}: install the CUDA math library headers "
                       "(e.g. cuda-libraries-dev)" if self.major else
                       "; the toolkit has no cuda_runtime_api.h to tell its CUDA version")


def cuda_major(home: Path) -> int | None:
    header = home / "include" / "cuda_runtime_api.h"
    found = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", header.read_text()) if header.exists() else None
    return int(found[1]) // 1000 if found else None


def needed_by(source: str, search: Sequence[Path] = ()) -> tuple[str, ...]:
    """The headers of :data:`NEEDED` that ``source`` includes, directly or through the headers it
    includes from ``search`` (torch's include folders: ATen/cuda pulls in cuBLAS, cuSPARSE, cuSOLVER).

    Every ``#include`` counts, whatever ``#if`` guards it: a header that is not needed after all only
    costs a check for it. Headers outside ``search`` (the toolkit's, the C++ library's) are not read."""
    seen: set[str] = set()
    hits: set[str] = set()
    stack = _INCLUDE.findall(source)
    while stack:
        name = stack.pop()
        if name in NEEDED:
            hits.add(name)
        elif name not in seen:
            seen.add(name)
            path = next((Path(d) / name for d in search if (Path(d) / name).is_file()), None)
            if path is not None:
                stack.extend(_INCLUDE.findall(path.read_text(errors="replace")))
    return tuple(h for h in NEEDED if h in hits)


def _installed(header: str) -> Path | None:
    for entry in sys.path:
        root = Path(entry or ".") / "nvidia"
        if root.is_dir():
            for include in sorted(root.glob("*/include")):
                if (include / header).exists():
                    return include
    return None


def _cpath(header: str) -> Path | None:
    return next((Path(p) for p in os.environ.get("CPATH", "").split(os.pathsep) if p and (Path(p) / header).exists()),
                None)


def _cached(major: int) -> Path:
    pins = "\n".join(sorted(WHEELS.get(major, {})))
    return CACHE / f"cuda{major}-{hashlib.sha256(pins.encode()).hexdigest()[:12]}" / "include"


def locate(home: Path, headers: Sequence[str] = NEEDED) -> Found:
    """Where each of ``headers`` is for the toolkit at ``home``; downloads nothing."""
    home = Path(home)
    major = cuda_major(home)
    where: dict[str, tuple[str, Path]] = {}
    missing: list[str] = []
    for header in headers:
        if (home / "include" / header).exists():
            where[header] = ("the CUDA toolkit", home / "include")
        elif folder := _cpath(header):
            where[header] = ("$CPATH", folder)
        elif folder := _installed(header):
            where[header] = ("an installed nvidia wheel", folder)
        elif major is not None and (_cached(major) / header).exists():
            where[header] = ("the header cache", _cached(major))
        else:
            missing.append(header)
    return Found(home=home, major=major, where=where, missing=tuple(missing))


def fetch(major: int, wanted: Sequence[str]) -> Path:
    """Download the wheels holding ``wanted`` with pip and keep their headers in the cache."""
    if major not in WHEELS:
        raise HeadersMissing(f"no pinned header wheels for CUDA {major} (stitchcuda/cuda_headers.py WHEELS): "
                             f"{', '.join(wanted)} cannot be fetched")
    target = _cached(major)
    target.parent.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time (pytest-xdist, two checkouts)
        specs = [spec for spec, holds in WHEELS[major].items() if any(h in holds and not (target / h).exists()
                                                                      for h in wanted)]
        if specs:
            _download_headers(specs, list(wanted), target)
    if absent := [h for h in wanted if not (target / h).exists()]:
        raise RuntimeError(f"the pinned wheels {', '.join(specs)} hold no {', '.join(absent)}: fix WHEELS")
    return target


def _download_headers(specs: list[str], wanted: list[str], target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent.parent, prefix=".fetch-") as tmp:
        try:
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                                   "--only-binary=:all:", "--quiet", "--timeout", "30", "--retries", "1", "-d", tmp,
                                   *specs], capture_output=True, text=True, timeout=1200)
        except subprocess.TimeoutExpired:
            raise HeadersMissing(f"pip ran past 20 minutes fetching {', '.join(specs)}") from None
        if done.returncode != 0:
            raise HeadersMissing(f"pip ({sys.executable} -m pip) could not fetch {', '.join(specs)} for "
                                 f"{', '.join(wanted)}: {done.stderr.strip()[-600:]}")
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


def fetch_missing(home: Path, headers: Sequence[str] = NEEDED) -> tuple[Found, tuple[str, ...]]:
    """Fetch into the cache exactly the ``headers`` nowhere else here; (where they are now, what
    was fetched). Raises :class:`HeadersMissing` where that cannot be done."""
    found = locate(home, headers)
    if not found.missing:
        return found, ()
    if found.major is None:
        raise HeadersMissing(f"the CUDA toolkit at {home} has no cuda_runtime_api.h to tell its version")
    fetch(found.major, found.missing)
    return locate(home, headers), found.missing


def include_dirs(home: Path, allow_fetch: bool | None = None, headers: Sequence[str] = NEEDED) -> list[Path]:
    """Folders to add with -I so that every one of ``headers`` resolves to a real one beside the
    toolkit's own; with ``allow_fetch`` (for the tests: unless STITCHCUDA_FETCH_CUDA_HEADERS=0)
    fetches what is nowhere else."""
    if allow_fetch is None:
        allow_fetch = os.environ.get("STITCHCUDA_FETCH_CUDA_HEADERS", "1") != "0"
    found = locate(home, headers)
    if found.missing and allow_fetch:
        found, _ = fetch_missing(home, headers)
    elif found.missing:
        if found.major is None:
            raise HeadersMissing(f"the CUDA toolkit at {home} has no cuda_runtime_api.h to tell its version")
        raise HeadersMissing(f"{', '.join(found.missing)}: in neither the CUDA toolkit at {home}, an installed "
                             "nvidia wheel nor the cache, and STITCHCUDA_FETCH_CUDA_HEADERS=0")
    return found.dirs
