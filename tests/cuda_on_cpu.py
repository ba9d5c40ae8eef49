"""Running a kernel's CUDA source on the CPU: the emulation header (fixtures/cuda_on_cpu/) with the
sources and a main, built by g++ and run once, the folder as its argument."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FIXTURES


def run_on_cpu(root: Path, *sources: str, timeout: int = 300) -> None:
    """Build ``sources`` (kernels, then a main reading and writing files in ``root``) after the
    emulation header and run the program; skip where there is no C++20 compiler."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    text = "\n".join([(FIXTURES / "cuda_on_cpu" / "cuda_on_cpu.h").read_text(), "#include <string>", *sources])
    (root / "main.cpp").write_text(text)
    built = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "main.cpp", "-o", "main"], cwd=root,
                           capture_output=True, text=True)
    if built.returncode != 0 and "barrier" in built.stderr:
        pytest.skip("needs a C++20 compiler with <barrier>")
    assert built.returncode == 0, built.stderr[-3000:]
    subprocess.run([str(root / "main"), str(root)], check=True, timeout=timeout)
