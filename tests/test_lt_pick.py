"""Which cuBLASLt algorithm a product runs (templates/kernels/lt_pick.cuh, CodegenOptions.lt_timed):
the scratch each product's timing needs, compiled with the real cublasLt.h and run on the host; the
option in the emitted program; an nvcc build on the CPU; and on a GPU the timed program against
float64 call after call, with its time beside the heuristic-only program's."""

from __future__ import annotations

from pathlib import Path

import pytest

import stitchcuda.compiler
from stitchcuda.compiler import compile_task
from stitchcuda.compiler.emit.codegen import CodegenOptions
from stitchcuda.verify.static_checks import static_findings
from tests.cuda_headers import host_program_output
from tests.test_offline_codegen import cuda_source, task_from

KERNELS = Path(stitchcuda.compiler.__file__).parent / "templates" / "kernels"

# what the program defines before it includes the header; only the pure span function is called,
# so nothing of cuBLASLt is linked
MAIN = r"""
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <utility>
#include <vector>
#define SC_CUBLAS_CHECK(expr) (void)(expr)
#define SC_REQUIRE(cond, ...) (void)(cond)
constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
constexpr bool kLtTimed = true;
#include "lt_pick.cuh"

int main() {
  std::printf("%zu\n", sc_lt_span_bytes(192, 128, 192, 1, 0, 4));        // one dense matrix
  std::printf("%zu\n", sc_lt_span_bytes(64, 8, 192, 1, 0, 4));           // a view of its first 64 rows
  std::printf("%zu\n", sc_lt_span_bytes(64, 64, 64, 12, 4096, 4));       // 12 batches
  std::printf("%zu\n", sc_lt_span_bytes(128, 32, 128, 1, 0, 2));         // bf16
  std::printf("%zu\n", sc_lt_span_bytes(0, 32, 128, 1, 0, 4));           // empty
  std::printf("%zu\n", sc_lt_round(1) + sc_lt_round(256) + sc_lt_round(257));
}
"""

CELL = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """A small recurrent cell's products, a bias each (the heuristic's first choice for the first was
    a split-K kernel 12x slower than the second's on an H100), and a batched attention product."""

    def __init__(self):
        super().__init__()
        self.i2h = nn.Linear(192, 128)
        self.h2o = nn.Linear(128, 32)

    def forward(self, x, q, k):
        return self.h2o(torch.tanh(self.i2h(x))), torch.relu(q @ k.transpose(1, 2))


def get_inputs():
    return [torch.randn(8, 192), torch.randn(4, 64, 32), torch.randn(4, 64, 32)]


def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def spans(tmp_path_factory) -> list[int]:
    out = host_program_output(tmp_path_factory.mktemp("spans"), MAIN, ("cublasLt.h",), (KERNELS,))
    return [int(line) for line in out.split()]


def test_the_scratch_spans_each_layout_as_cublaslt_reads_it(spans):
    assert spans[0] == 192 * 128 * 4
    assert spans[1] == (192 * 7 + 64) * 4  # the last column starts ld * (cols - 1) in
    assert spans[2] == (64 * 63 + 64 + 4096 * 11) * 4
    assert spans[3] == 128 * 32 * 2
    assert spans[4] == 0
    assert spans[5] == 256 + 256 + 512


@pytest.fixture(scope="module")
def compiled():
    return compile_task(task_from("lt_pick_cell", CELL))


def test_the_option_switches_the_timing_on_and_off_only(compiled):
    heuristic, timed = (cuda_source(compiled.program(CodegenOptions(lt_timed=on))) for on in (False, True))
    assert "constexpr bool kLtTimed = false;" in heuristic and "constexpr bool kLtTimed = true;" in timed
    assert heuristic.count("= sc_lt_algo(") == timed.count("= sc_lt_algo(") >= 2
    for on in (False, True):  # the timing is setup, not a finding of the static checks
        assert static_findings(compiled.program(CodegenOptions(lt_timed=on))).findings == []
    # the same launches either way: only the algorithm chosen at setup differs
    strip = lambda s: [line for line in s.splitlines() if "kLtTimed" not in line and not line.startswith("// Options")]  # noqa: E731
    assert [line for line in strip(heuristic) if "cublasLtMatmul(P." in line] == \
        [line for line in strip(timed) if "cublasLtMatmul(P." in line]


@pytest.mark.nvcc
def test_a_timed_program_compiles(compiled):
    from stitchcuda.compiler.check import compile_check

    result = compile_check(compiled.program(CodegenOptions(lt_timed=True)))
    assert result.status == "compiled", result.detail


@pytest.mark.gpu
def test_timed_products_match_float64_call_after_call(compiled, tmp_path):
    from tests.test_gpu import _option_off_and_on

    times = _option_off_and_on(compiled, "lt_timed", tmp_path, calls=200)
    print(f"per call: heuristic {times[False] * 1e3:.1f} us, timed {times[True] * 1e3:.1f} us")
