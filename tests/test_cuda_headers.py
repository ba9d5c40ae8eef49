"""Where the compile checks find real CUDA library headers (stitchcuda/cuda_headers.py), what they
say where one is missing, and `stitchcuda doctor --fetch-headers`, the one thing that fetches them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from stitchcuda import cuda_headers, machine
from stitchcuda.cli import app, doctor
from stitchcuda.compiler.check import compile_check
from stitchcuda.cuda_headers import NEEDED, HeadersMissing, include_dirs, locate, needed_by

ATEN_CUDA = ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h")  # what ATen/cuda/CUDAContext.h pulls in
PROGRAM = 'CUDA_SRC = """#include <ATen/cuda/CUDAContext.h>\n__global__ void k() {}\n"""\nCPP_SRC = ""\n'


def _toolkit(root, headers):
    (root / "include").mkdir(parents=True)
    for name in headers:
        (root / "include" / name).write_text("#pragma once\n")
    return root


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """A CUDA 13 toolkit with cuBLAS's headers only, no wheel, an empty cache, and any download an error."""
    home = _toolkit(tmp_path / "cuda", ["cuda_runtime_api.h", "cublas_v2.h", "cublasLt.h"])
    (home / "include/cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    monkeypatch.setattr(cuda_headers, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(cuda_headers, "_installed", lambda header: None)
    monkeypatch.delenv("CPATH", raising=False)
    monkeypatch.setattr(machine, "cuda_home", lambda: str(home))
    monkeypatch.setattr(machine, "nvcc_path", lambda: str(home / "bin" / "nvcc"))
    monkeypatch.setattr(machine, "nvcc_version", lambda: "13.0")  # not cached from the fake nvcc

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded without being asked")

    monkeypatch.setattr(cuda_headers, "_download_headers", no_download)
    return home


def _fake_fetch(monkeypatch):
    """fetch() as pip would leave it, without pip: the headers written into the cache."""
    def fetch(major, wanted):
        target = cuda_headers._cached(major)
        target.mkdir(parents=True, exist_ok=True)
        for header in wanted:
            (target / header).write_text("#pragma once\n")
        return target

    monkeypatch.setattr(cuda_headers, "fetch", fetch)


def test_a_full_toolkit_needs_no_other_folder(tmp_path):
    assert include_dirs(_toolkit(tmp_path, ["cuda_runtime_api.h", *NEEDED]), allow_fetch=False) == []


def test_what_is_missing_is_named_when_fetching_is_off(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.path", [])  # no installed nvidia wheels
    monkeypatch.delenv("CPATH", raising=False)
    monkeypatch.setattr(cuda_headers, "CACHE", tmp_path / "cache")
    home = _toolkit(tmp_path / "cuda", ["cuda_runtime_api.h", "cublas_v2.h"])
    (home / "include/cuda_runtime_api.h").write_text("#define CUDART_VERSION 13000\n")
    with pytest.raises(HeadersMissing, match=r"cublasLt.h, cusparse.h, cusolverDn.h, cudnn.h: in neither"):
        include_dirs(home, allow_fetch=False)


def test_a_program_needs_what_it_includes_and_what_torch_pulls_in():
    from torch.utils.cpp_extension import include_paths

    torch_include = include_paths()
    assert needed_by('#include <cudnn.h>\n#include "cuda_runtime.h"\n', torch_include) == ("cudnn.h",)
    assert needed_by("#include <ATen/cuda/CUDAContext.h>\n", torch_include) == ATEN_CUDA
    assert needed_by("#include <ATen/cuda/CUDAContext.h>\n") == ()  # torch's headers not searched
    assert needed_by("#include <torch/types.h>\n#include <cuda_runtime.h>\n", torch_include) == ()


def test_compile_check_names_the_missing_headers_and_the_command_without_fetching(bare, tmp_path):
    result = compile_check(PROGRAM)
    assert result.status == "skipped"
    assert "cusparse.h, cusolverDn.h are in neither the CUDA toolkit at " + str(bare) in result.detail
    assert "cublas" not in result.detail and "cudnn.h" not in result.detail  # present, and not needed
    assert "`stitchcuda doctor --fetch-headers` fetches them once" in result.detail
    assert not (tmp_path / "cache").exists()


def test_headers_in_the_cache_are_found_and_added(bare, monkeypatch):
    _fake_fetch(monkeypatch)
    found, fetched = cuda_headers.fetch_missing(bare, ATEN_CUDA)
    assert fetched == ("cusparse.h", "cusolverDn.h") and not found.missing
    assert found.dirs == [cuda_headers._cached(13)]  # the toolkit's own folder needs no -I
    assert locate(bare).missing == ("cudnn.h",)


def test_doctor_says_where_each_header_is_and_how_to_fetch_the_rest(bare):
    check = doctor.check_cuda_headers()
    assert check.status == "warn"
    assert f"cublas_v2.h, cublasLt.h in the CUDA toolkit ({bare / 'include'})" in check.detail
    assert "missing: cusparse.h, cusolverDn.h, cudnn.h" in check.detail
    assert check.fix.startswith("`stitchcuda doctor --fetch-headers` fetches cusparse.h, cusolverDn.h, cudnn.h once")


def test_doctor_fetch_headers_fetches_only_the_missing_and_keeps_json(bare, monkeypatch):
    asked = []
    _fake_fetch(monkeypatch)
    fake = cuda_headers.fetch
    monkeypatch.setattr(cuda_headers, "fetch", lambda major, wanted: asked.append(tuple(wanted)) or fake(major, wanted))
    result = CliRunner().invoke(app, ["doctor", "--json", "--no-ncu-probe", "--fetch-headers"])
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert asked == [("cusparse.h", "cusolverDn.h", "cudnn.h")]
    assert checks["fetch headers"]["detail"] == (f"fetched cusparse.h, cusolverDn.h, cudnn.h into "
                                                 f"{cuda_headers._cached(13)}")
    assert checks["cuda headers"]["status"] == "ok"
    assert doctor.fetch_cuda_headers().detail == "nothing to fetch: no CUDA library header is missing"


@pytest.mark.nvcc
def test_the_mlp_program_compiles_on_this_machine(tmp_path, cache):
    """What `stitchcuda optimize mlp` writes without a GPU is compile-checked, also with a CPU torch;
    the same program checked again (a resumed run, the same model again) is not compiled again."""
    from stitchcuda.compiler.capture.graph import capture
    from stitchcuda.compiler.emit.codegen import CodegenOptions, generate
    from stitchcuda.compiler.schedule.fusion import fuse
    from stitchcuda.task.load import resolve_tasks
    from tests.cuda_headers import toolkit

    _, home = toolkit()  # the nvcc mark skips this test where there is none
    try:
        include_dirs(home, headers=ATEN_CUDA)  # the tests may fetch; compile_check never does
    except HeadersMissing as exc:
        pytest.skip(f"no real CUDA library headers for this machine: {exc}")
    task = resolve_tasks("mlp")[0]
    graph = capture(task)
    program = generate(task, graph, fuse(graph), CodegenOptions())
    result = compile_check(program)
    assert result.status == "compiled" and not result.kept, result.detail
    again = compile_check(program)
    assert again.kept and (again.status, again.detail) == (result.status, result.detail)
    broken = program.replace("__global__", "__global__ not_a_type", 1)
    assert compile_check(broken).status == "failed"
    assert not compile_check(broken).kept  # a failure is not kept: it is compiled again, its errors shown
