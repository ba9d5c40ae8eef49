"""What the offline Coder can do without a GPU: generate the program and compile its CUDA with nvcc.

Linking and running need a CUDA build of torch and a GPU; this says so instead of pretending.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel

from stitchcuda import cuda_headers, machine
from stitchcuda.paths import cache_root

# the one header of c10/cuda a CPU build of torch lacks: its CMake writes it for CUDA builds only
_CMAKE_MACROS = Path("c10/cuda/impl/cuda_cmake_macros.h")


# program hosts already syntax-checked in this process (one source serves every program)
_HOSTS_CHECKED: set[str] = set()


class CompileCheck(BaseModel):
    status: str  # "compiled", "failed" or "skipped"
    detail: str
    seconds: float = 0.0
    kept: bool = False  # the verdict of an earlier compile of the same text with the same tools


def cuda_source(program: str) -> str:
    """The CUDA text a generated program hands to load_inline (its ``CUDA_SRC`` constant)."""
    return _string_constant(program, "CUDA_SRC")


def cpp_source(program: str) -> str:
    """The C++ text (its kernel library's Python binding) a generated program hands to load_inline
    (``CPP_SRC``)."""
    return _string_constant(program, "CPP_SRC")


def host_source(program: str) -> str:
    """The program host's C++ text (the torch side, the same for every program: ``HOST_SRC``)."""
    return _string_constant(program, "HOST_SRC")


def _string_constant(program: str, name: str) -> str:
    for node in ast.parse(program).body:
        named = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
        if named and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return node.value.value
    raise ValueError(f"the program has no {name} string")


def compile_check(program: str, arch: str = "sm_90", timeout_s: float = 900) -> CompileCheck:
    """nvcc -c of the program's CUDA (its kernel library) for ``arch``; the C++ compiler's syntax check
    of its binding and of the program host against torch's headers (the host once per process: it is
    the same for every program).

    Works with a CPU build of torch too: its headers lack only the one torch's CMake writes for CUDA
    builds, which a stand-in replaces. The CUDA library headers the program needs (cuBLAS, ...) come
    from wherever :mod:`stitchcuda.cuda_headers` finds them; where they are nowhere here it skips,
    naming them and the command that fetches them (it never downloads by itself)."""
    from torch.utils.cpp_extension import include_paths

    nvcc = machine.nvcc_path()
    if nvcc is None:
        return CompileCheck(status="skipped", detail="nvcc not found: install the CUDA toolkit to compile-check")
    includes = [Path(p) for p in include_paths()]
    source = cuda_source(program)
    home = machine.toolkit_home()  # not None: nvcc was found
    assert home is not None
    try:
        host_text = host_source(program)
    except ValueError:  # a program of its own making (an LLM's), without StitchCUDA's program host
        host_text = ""
    headers = cuda_headers.locate(home, cuda_headers.needed_by(source + host_text, includes))
    if headers.missing:
        return CompileCheck(status="skipped", detail="the program needs CUDA library headers that are not here: "
                                                     + headers.missing_detail())
    flags = [*(f"-I{p}" for p in includes), f"-I{sysconfig.get_paths()['include']}",
             *(f"-I{p}" for p in headers.dirs)]
    cxx = shutil.which("c++") or shutil.which("g++")
    kept = _kept_check(program, arch, [nvcc, cxx, *flags])
    if kept.exists():  # this program was compiled by these tools before: a resumed run, the same model again
        try:
            return CompileCheck.model_validate_json(kept.read_text()).model_copy(update={"kept": True})
        except (OSError, ValueError):  # unreadable: compiled again and written anew
            pass
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="stitchcuda-nvcc-") as tmp:
        if not any((p / _CMAKE_MACROS).exists() for p in includes):
            flags.append(f"-I{_cpu_torch_shim(Path(tmp))}")
        unit, binding, host = Path(tmp) / "program.cu", Path(tmp) / "binding.cpp", Path(tmp) / "host.cpp"
        unit.write_text(source)
        binding.write_text(cpp_source(program))
        host.write_text(host_text)
        steps = [("nvcc", [nvcc, "-std=c++17", f"-arch={arch}", "-c", str(unit), "-o",
                           str(Path(tmp) / "program.o"), *flags])]
        if cxx:
            syntax = [cxx, "-std=c++17", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=check", *flags,
                      f"-I{home / 'include'}"]
            steps.append(("the C++ compiler (binding)", [*syntax, str(binding)]))
            if host_text and host_text not in _HOSTS_CHECKED:
                steps.append(("the C++ compiler (program host)", [*syntax, str(host)]))
        for tool, cmd in steps:
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            except subprocess.TimeoutExpired:
                return CompileCheck(status="failed", detail=f"{tool} ran past {timeout_s:g} s",
                                    seconds=time.perf_counter() - started)
            if done.returncode != 0:
                errors = [line for line in done.stderr.splitlines() if "error" in line][:5]
                return CompileCheck(status="failed", detail=f"{tool} failed:\n" + ("\n".join(errors) or done.stderr[-1500:]),
                                    seconds=time.perf_counter() - started)
        if len(steps) > 2:
            _HOSTS_CHECKED.add(host_text)
    what = "the program's CUDA" + (" and its C++ (binding, program host)" if len(steps) > 1 else "")
    check = CompileCheck(status="compiled", detail=f"{what} compiled for {arch}", seconds=time.perf_counter() - started)
    try:  # only a success is kept: a failure is shown with its errors each time, and may be the machine's
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(check.model_dump_json())
        partial.replace(kept)
    except OSError:  # a read-only cache only costs the next check its compile
        pass
    return check


def _kept_check(program: str, arch: str, tools: list) -> Path:
    """Where the verdict of compiling ``program`` for ``arch`` with these tools and flags is kept:
    keyed by the program's text, torch's version (its headers) and each compiler's path, size and
    modification time (a new toolkit is a new key)."""
    import torch

    def identity(tool) -> list:
        if tool is None or str(tool).startswith("-"):
            return [str(tool)]
        stat = Path(tool).stat()
        return [str(tool), stat.st_size, stat.st_mtime_ns]

    key = json.dumps([program, arch, torch.__version__, *(identity(t) for t in tools)])
    return cache_root() / "compile-checks" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"


def _cpu_torch_shim(folder: Path) -> Path:
    """A folder holding a stand-in for :data:`_CMAKE_MACROS`, as a CUDA build of torch (shared
    libraries) writes it; in ``folder``, never in torch's own headers."""
    (folder / "torch-cpu" / _CMAKE_MACROS).parent.mkdir(parents=True)
    (folder / "torch-cpu" / _CMAKE_MACROS).write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    return folder / "torch-cpu"
