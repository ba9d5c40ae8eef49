"""The 3xTF32 CUTLASS note: findable by the knowledge search, and its CUDA snippets compile."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from stitchcuda.agents.knowledge import load_notes
from stitchcuda.agents.knowledge.index import NOTES_DIR
from stitchcuda.compiler.lowering.cutlass_gemm import cutlass_include
from stitchcuda.verify.precision import arithmetic_of
from tests.cuda_headers import HeadersMissing, toolkit
from tests.cuda_headers import include_dirs as cuda_include_dirs

NOTE = NOTES_DIR / "cutlass-3xtf32.md"
SPLIT_NOTE = NOTES_DIR / "split-tf32.md"


def cuda_blocks(text: str) -> list[str]:
    return re.findall(r"```cuda\n(.*?)```", text, re.S)



def test_note_is_loaded_with_its_sections():
    note = next(n for n in load_notes() if n.name == "cutlass-3xtf32")
    assert "3xtf32" in [t.lower() for t in note.tags] and "cutlass" in note.tags
    for needle in ("OpMultiplyAddFastF32", "GemmUniversal", "ldc", "can_implement", "extra_include_paths",
                   "--expt-relaxed-constexpr", "cutlass_library/source/include", "ImplicitGemmConvolution",
                   "64x32x16", "alignment 1"):
        assert needle in note.text, needle
    assert len(cuda_blocks(note.text)) == 2
    split = next(n for n in load_notes() if n.name == "split-tf32")
    assert "CUBLAS_COMPUTE_32F_FAST_TF32" in split.text and "tf32_round(x - big)" in split.text
    assert len(cuda_blocks(split.text)) == 1


@pytest.mark.parametrize("query", ["fp32 tensor core gemm strict", "3xTF32", "cutlass",
                                   "fp32 accurate convolution tensor cores", "implicit gemm convolution cutlass"])
def test_search_finds_the_note(kb, query):
    top = kb.search(query, k=1, kind="note")[0].source
    assert top.startswith("notes/cutlass-3xtf32.md") or (query == "3xTF32" and top.startswith("notes/split-tf32.md"))


@pytest.mark.parametrize("query", ["split operands tf32 cublaslt", "wgmma fp32 accurate hopper gemm"])
def test_search_finds_the_split_note(kb, query):
    assert kb.search(query, k=1, kind="note")[0].source.startswith("notes/split-tf32.md")


def test_snippets_are_named_3xtf32_by_the_verdict():
    """What the note teaches is what the verdict reports: 3xTF32, not TF32 nor plain fp32."""
    for block in cuda_blocks(NOTE.read_text()) + cuda_blocks(SPLIT_NOTE.read_text()):
        assert arithmetic_of(block) == ["3xTF32 (fp32 accumulate)"]
    plain = cuda_blocks(NOTE.read_text())[0].replace("OpMultiplyAddFastF32", "OpMultiplyAdd")
    assert arithmetic_of(plain) == ["TF32 (fp32 accumulate)"]


@pytest.mark.nvcc
def test_snippets_compile_with_nvcc(tmp_path: Path):
    include = cutlass_include()
    assert include, "CUTLASS headers not found: nvidia-cutlass is a dependency (pip install -e .)"
    nvcc, home = toolkit()  # the nvcc mark skips this test where there is none
    unit = tmp_path / "note.cu"
    blocks = cuda_blocks(NOTE.read_text()) + cuda_blocks(SPLIT_NOTE.read_text())
    unit.write_text("\n".join(blocks))  # the conv block reuses the GEMM's Epilogue
    try:
        include = [*include, *cuda_include_dirs(home)]  # cublasLt.h for the split snippet
    except HeadersMissing as exc:
        pytest.skip(f"cuBLASLt's header is not here: {exc}")
    done = subprocess.run([nvcc, "-c", "-arch=sm_90", "-std=c++17", "--expt-relaxed-constexpr", "-Xptxas", "-v",
                           *(f"-I{p}" for p in include), str(unit), "-o", str(tmp_path / "note.o")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    # both kernels were instantiated, and the recommended tiles do not spill
    spills = re.findall(r"(\d+) bytes spill stores", done.stderr)
    assert len(spills) >= 2 and all(s == "0" for s in spills), done.stderr[-3000:]
