"""Which of cuDNN's legacy convolution algorithms a program may run (templates/kernels/dnn_pick.cuh):
the filter compiled with the real cudnn.h and run on the host over rankings as cuDNN returns them."""

from __future__ import annotations

from pathlib import Path

import pytest

import stitchcuda.compiler
from tests.cuda_headers import host_program_output

KERNELS = Path(stitchcuda.compiler.__file__).parent / "templates" / "kernels"

# each case: a ranking (algorithm, status, math type, workspace in MiB), the math mode asked for;
# the program prints the algorithm picked, or -1 where none may run
MAIN = r"""
#include <cudnn.h>
#include <cstddef>
#include <cstdio>
#include <vector>
#include "dnn_pick.cuh"

template <typename Perf>
Perf entry(decltype(Perf::algo) algo, cudnnMathType_t math, size_t mib, bool ran = true) {
  Perf p{};
  p.algo = algo;
  p.status = ran ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
  p.mathType = math;
  p.memory = mib << 20;
  return p;
}

template <typename Perf>
void pick(const std::vector<Perf>& perf, cudnnMathType_t math) {
  auto workspace = [&](decltype(Perf::algo) algo, size_t* need) {
    for (const Perf& p : perf) if (p.algo == algo) *need = p.memory;
    return CUDNN_STATUS_SUCCESS;
  };
  decltype(Perf::algo) algo{};
  size_t bytes = 0;
  std::printf("%d\n", sc_first_usable(perf, static_cast<int>(perf.size()), math, workspace, &algo, &bytes)
                          ? static_cast<int>(algo) : -1);
}

int main() {
  using F = cudnnConvolutionFwdAlgoPerf_t;
  using B = cudnnConvolutionBwdDataAlgoPerf_t;
  // 3xTF32's split halves on the tensor cores: a transform, however fast, would round them again
  pick(std::vector<F>{entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED, CUDNN_TENSOR_OP_MATH, 1),
                      entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING, CUDNN_TENSOR_OP_MATH, 1),
                      entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, CUDNN_TENSOR_OP_MATH, 1)},
       CUDNN_TENSOR_OP_MATH);
  // true fp32: no tensor core, no transform
  pick(std::vector<F>{entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_TENSOR_OP_MATH, 0),
                      entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, CUDNN_FMA_MATH, 0),
                      entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_DEFAULT_MATH, 0)},
       CUDNN_FMA_MATH);
  // one that did not run, one over the workspace limit
  pick(std::vector<F>{entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, CUDNN_FMA_MATH, 0, false),
                      entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_GEMM, CUDNN_FMA_MATH, 300),
                      entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, CUDNN_FMA_MATH, 0)},
       CUDNN_FMA_MATH);
  // a transposed convolution's backward data
  pick(std::vector<B>{entry<B>(CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, CUDNN_TENSOR_OP_MATH, 0),
                      entry<B>(CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, CUDNN_TENSOR_OP_MATH, 0)},
       CUDNN_TENSOR_OP_MATH);
  // nothing usable
  pick(std::vector<F>{entry<F>(CUDNN_CONVOLUTION_FWD_ALGO_FFT, CUDNN_TENSOR_OP_MATH, 0)}, CUDNN_TENSOR_OP_MATH);
}
"""


@pytest.fixture(scope="module")
def picks(tmp_path_factory) -> list[int]:
    out = host_program_output(tmp_path_factory.mktemp("picks"), MAIN, ("cudnn.h",), (KERNELS,))
    return [int(line) for line in out.split()]


def test_split_tf32_never_runs_a_transform_however_fast(picks):
    assert picks[0] == 1  # CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM


def test_true_fp32_takes_neither_tensor_cores_nor_transforms(picks):
    assert picks[1] == 2  # CUDNN_CONVOLUTION_FWD_ALGO_GEMM


def test_an_algorithm_that_failed_or_needs_too_much_workspace_is_passed_over(picks):
    assert picks[2] == 0  # CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM


def test_a_transposed_convolution_keeps_to_the_direct_algorithms_too(picks):
    assert picks[3] == 1  # CUDNN_CONVOLUTION_BWD_DATA_ALGO_1


def test_nothing_usable_is_said(picks):
    assert picks[4] == -1
