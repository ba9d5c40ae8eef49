"""Where the compiler's CUDA lives: the templates folder every stage that writes CUDA renders from,
and the kernels without parameters of their own, taken as they are from its ``kernels/``."""

from __future__ import annotations

import functools
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
KERNELS = TEMPLATES / "kernels"


@functools.cache
def cuda_file(name: str) -> str:
    return (KERNELS / name).read_text()
