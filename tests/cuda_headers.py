"""The tests' way to the real CUDA library headers: :mod:`stitchcuda.cuda_headers`, plus the toolkit.

``stitchcuda doctor --fetch-headers`` (or ``python -m tests.cuda_headers``) fetches them ahead of a
test run; the tests fetch them themselves otherwise, unless ``STITCHCUDA_FETCH_CUDA_HEADERS=0``
(then they skip, saying what is missing).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from stitchcuda import machine
from stitchcuda.cuda_headers import CACHE, NEEDED, WHEELS, HeadersMissing, cuda_major, fetch, include_dirs

__all__ = ["CACHE", "NEEDED", "WHEELS", "HeadersMissing", "cuda_major", "fetch", "host_program_output", "include_dirs",
           "toolkit"]


def toolkit() -> tuple[str, Path] | None:
    """(nvcc, the toolkit folder), or None where there is no CUDA toolkit."""
    nvcc, home = machine.nvcc_path(), machine.toolkit_home()
    return (nvcc, home) if nvcc and home else None


def host_program_output(folder: Path, main: str, headers: Sequence[str], includes: Sequence[Path] = (),
                        cudart: bool = False) -> str:
    """What a host-only C++ program printed: ``main`` built with the toolkit's and the real
    ``headers``' include folders (and ``includes``) by the host compiler, linked with the toolkit's
    CUDA runtime where ``cudart``, then run. Skips the test where there is no toolkit or no such
    headers (or no runtime library)."""
    import pytest

    found = toolkit()
    if found is None:
        pytest.skip("no CUDA toolkit here: the CUDA libraries' types come with it")
    _, home = found
    try:
        extra = include_dirs(home, headers=tuple(headers))  # the tests may fetch
    except HeadersMissing as exc:
        pytest.skip(f"no {', '.join(headers)} for this machine: {exc}")
    (folder / "main.cpp").write_text(main)
    flags = [f"-I{d}" for d in (*includes, home / "include", *extra)]
    libraries: list[str] = []
    if cudart:
        found_lib = next((d for d in (home / "lib64", home / "lib") if any(d.glob("libcudart.so*"))), None)
        if found_lib is None:
            pytest.skip(f"no libcudart.so under {home}")
        libraries = [f"-L{found_lib}", f"-Wl,-rpath,{found_lib}", "-lcudart"]
    subprocess.run(["c++", "-std=c++17", *flags, "main.cpp", "-o", "main", *libraries], cwd=folder, check=True,
                   capture_output=True, text=True, timeout=120)
    return subprocess.run([str(folder / "main")], check=True, capture_output=True, text=True, timeout=30).stdout


if __name__ == "__main__":
    found = toolkit()
    if found is None:
        sys.exit("no CUDA toolkit (nvcc) here: the compile checks skip, and need no headers")
    for folder in include_dirs(found[1], allow_fetch=True):
        print(folder)
