"""CUDA source the lowerings take as it is (kernels without parameters of their own), kept as files
under ``compiler/templates/kernels/``, never in Python strings."""

from __future__ import annotations

import functools
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "templates" / "kernels"


@functools.cache
def cuda_file(name: str) -> str:
    return (KERNELS / name).read_text()
