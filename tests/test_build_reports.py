"""Parsing what nvcc, ptxas, g++ and ld print (samples captured from real runs)."""

from __future__ import annotations

from stitchcuda.verify.build import extension_key, parse_compiler_messages, parse_ptxas_report
from tests.conftest import FIXTURES

COMPILER = FIXTURES / "compiler"


def test_ptxas_resources_per_kernel():
    kernels = {k.kernel.split("(")[0]: k for k in parse_ptxas_report((COMPILER / "ptxas_verbose.txt").read_text())}
    plain = kernels["plain"]
    assert plain.registers == 8 and plain.arch == "sm_90" and plain.shared_bytes == 0 and plain.barriers == 0
    tile = next(k for name, k in kernels.items() if name.startswith("void tile<256>") or "tile" in name)
    assert tile.registers == 32 and tile.shared_bytes == 1024 and tile.stack_frame_bytes == 256 and tile.barriers == 1


def test_ptxas_spills():
    (heavy,) = parse_ptxas_report((COMPILER / "ptxas_spills.txt").read_text())
    assert heavy.registers == 24
    assert heavy.spill_stores_bytes == 640 and heavy.spill_loads_bytes == 664 and heavy.stack_frame_bytes == 336


def test_nvcc_errors_with_lines_and_source(tmp_path):
    (tmp_path / "cuda.cu").write_text("")  # only main.cpp/cuda.cu lines are looked up
    log = (COMPILER / "nvcc_errors.txt").read_text()
    messages = parse_compiler_messages(log, tmp_path)
    assert [(m.file, m.line) for m in messages] == [("bad.cu", 4), ("bad.cu", 5)]
    assert messages[0].message == 'expected a ";"'
    assert 'identifier "undefined_thing" is undefined' in messages[1].message


def test_source_line_is_attached_for_our_files(tmp_path):
    (tmp_path / "cuda.cu").write_text("a\nb\n  x[i] = x[i] * 2.0f\n}\n")
    log = "/x/builds/ext/cuda.cu(3): error: expected a \";\"\n"
    (msg,) = parse_compiler_messages(log, tmp_path)
    assert msg.file == "cuda.cu" and msg.line == 3 and msg.source_line == "x[i] = x[i] * 2.0f"


def test_gcc_and_linker_errors():
    (gcc,) = parse_compiler_messages((COMPILER / "gcc_errors.txt").read_text())
    assert gcc.file == "main.cpp" and gcc.line == 2 and "primary-expression" in gcc.message
    (link,) = parse_compiler_messages((COMPILER / "link_errors.txt").read_text())
    assert link.file == "link" and "cannot find -lc10_cuda" in link.message


def test_extension_key_changes_with_any_build_input():
    base = dict(name="ext", cpp=["a"], cuda=["b"], functions=["f"], cflags=None, cuda_flags=[], ldflags=None,
                include=None, options={})
    assert extension_key(**base) == extension_key(**base)
    assert extension_key(**base) != extension_key(**(base | {"cuda": ["b "]}))
    assert extension_key(**base) != extension_key(**(base | {"cuda_flags": ["-O3"]}))


def test_generated_lines_map_back_to_the_candidate_file():
    from stitchcuda.verify.build import locate_in_candidate
    from stitchcuda.verify.verdict import CompilerMessage

    cuda = "\n__global__ void k() {\n  oops\n}\n"
    candidate = 'import torch\n\nCUDA = r"""' + cuda + '"""\n'
    msgs = [CompilerMessage(file="cuda.cu", line=6, message="x"), CompilerMessage(file="main.cpp", line=2, message="y")]
    locate_in_candidate(msgs, candidate, {"cuda.cu": [cuda], "main.cpp": ["not in the file"]})
    assert msgs[0].candidate_line == 5 and candidate.splitlines()[4] == "  oops"
    assert msgs[1].candidate_line is None


def test_lines_map_back_without_load_inlines_headers():
    from stitchcuda.verify.build import locate_in_candidate
    from stitchcuda.verify.verdict import CompilerMessage

    cuda = "\n__global__ void k() {\n  oops\n}\n"
    candidate = 'import torch\n\nCUDA = r"""' + cuda + '"""\n'
    msgs = [CompilerMessage(file="cuda.cu", line=3, message="x")]  # no_implicit_headers: line 3 is line 3
    locate_in_candidate(msgs, candidate, {"cuda.cu": [cuda]}, implicit_headers=False)
    assert msgs[0].candidate_line == 5
