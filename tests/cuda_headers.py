"""The tests' way to the real CUDA library headers: :mod:`stitchcuda.cuda_headers`, plus the toolkit.

``stitchcuda doctor --fetch-headers`` (or ``python -m tests.cuda_headers``) fetches them ahead of a
test run; the tests fetch them themselves otherwise, unless ``STITCHCUDA_FETCH_CUDA_HEADERS=0``
(then they skip, saying what is missing).
"""

from __future__ import annotations

import sys
from pathlib import Path

from stitchcuda import machine
from stitchcuda.cuda_headers import CACHE, NEEDED, WHEELS, HeadersMissing, cuda_major, fetch, include_dirs

__all__ = ["CACHE", "NEEDED", "WHEELS", "HeadersMissing", "cuda_major", "fetch", "include_dirs", "toolkit"]


def toolkit() -> tuple[str, Path] | None:
    """(nvcc, the toolkit folder), or None where there is no CUDA toolkit."""
    nvcc, home = machine.nvcc_path(), machine.toolkit_home()
    return (nvcc, home) if nvcc and home else None


if __name__ == "__main__":
    found = toolkit()
    if found is None:
        sys.exit("no CUDA toolkit (nvcc) here: the compile checks skip, and need no headers")
    for folder in include_dirs(found[1], allow_fetch=True):
        print(folder)
