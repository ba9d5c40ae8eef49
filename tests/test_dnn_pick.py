"""Which of cuDNN's legacy convolution algorithms a program may run (templates/kernels/dnn_pick.cuh):
the filter compiled with the real cudnn.h and run on the host over rankings as cuDNN returns them,
and the choice between the heuristic's first and the timed search's."""

from __future__ import annotations

from pathlib import Path

import pytest

import stitchcuda.compiler
from tests.cuda_headers import host_program_output

KERNELS = Path(stitchcuda.compiler.__file__).parent / "templates" / "kernels"

# each case: a ranking (algorithm, status, math type, workspace in MiB), the math mode asked for;
# the program prints the algorithm picked, or -1 where none may run
MAIN = r"""
#include <cuda_runtime.h>
#include <cudnn.h>
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>
#include "dnn_time.cuh"
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


# The choice between the heuristic's first (1: PRECOMP_GEMM) and the search's first (0: IMPLICIT_GEMM);
# where they differ the two are timed on scratch operands, which a machine without a GPU cannot
# allocate: the heuristic's stands. The run callback counts its calls.
VERIFIED = r"""
#include <cuda_runtime.h>
#include <cudnn.h>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>
#include "dnn_time.cuh"
#include "dnn_pick.cuh"

// the timing's one cuDNN call, for the link (this machine may have no cuDNN library): no scratch, no timing
extern "C" cudnnStatus_t cudnnGetStream(cudnnHandle_t, cudaStream_t* stream) {
  *stream = nullptr;
  return CUDNN_STATUS_SUCCESS;
}

int main() {
  int runs = 0;
  auto run = [&](cudnnConvolutionFwdAlgo_t, size_t, const ScDnnScratch&) { ++runs; return CUDNN_STATUS_SUCCESS; };
  const auto h = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, s = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  size_t bytes = 0;
  int device_count = 0;
  const bool gpu = cudaGetDeviceCount(&device_count) == cudaSuccess && device_count > 0;
  auto pick = [&](bool have_h, cudnnConvolutionFwdAlgo_t heuristic, size_t heuristic_bytes, bool have_s,
                  cudnnConvolutionFwdAlgo_t searched, size_t searched_bytes) {
    const int algo = sc_verified_pick(nullptr, have_h, heuristic, heuristic_bytes, have_s, searched, searched_bytes,
                                      64, 64, 64, run, &bytes);
    std::printf("%d %zu\n", algo, bytes);
  };
  pick(true, h, 8, false, s, 16);
  pick(true, h, 8, true, h, 8);
  pick(false, h, 0, true, s, 16);
  if (!gpu) pick(true, h, 8, true, s, 16);
  std::printf("runs %d\n", runs);
}
"""


@pytest.fixture(scope="module")
def verified(tmp_path_factory) -> list[str]:
    out = host_program_output(tmp_path_factory.mktemp("verified"), VERIFIED, ("cudnn.h",), (KERNELS,), cudart=True)
    return out.splitlines()


def test_the_heuristic_stands_where_the_search_agrees_or_found_nothing(verified):
    assert verified[0] == "1 8"  # no search result
    assert verified[1] == "1 8"  # the same algorithm


def test_the_search_stands_alone_where_the_heuristic_found_nothing(verified):
    assert verified[2] == "0 16"


def test_a_disagreement_that_cannot_be_timed_keeps_the_heuristic(verified):
    if verified[-1] != "runs 0" or len(verified) < 5:
        pytest.skip("a GPU here: the disagreement was timed (the GPU tests cover it)")
    assert verified[3] == "1 8"
    assert verified[-1] == "runs 0"  # nothing ran without scratch operands
