// Which of cuDNN's legacy convolution algorithms a program may run, from a ranking (a timed search or
// the heuristics), and the scratch operands a choice between two is timed on. Host code only: it
// needs cudnn.h's types, the CUDA runtime, <string> and <vector>. Included in the program's source
// after them.

constexpr size_t kDnnWorkspaceLimit = size_t(256) << 20;

// Transform-based algorithms (FFT, Winograd) round in the transformed domain, and a timed search
// picks them from one run to the next, so the program's accuracy would change with the load on the
// GPU at setup. In true fp32 their error is several times the direct sum's (Inception v3's logits
// moved from 2.4e-6 to 1.4e-5 relative L2 between two runs of one program). Under 3xTF32 the split
// halves are exact TF32 values only until a transform mixes them: the tensor cores then round the
// transformed operands, and the three products carry plain TF32's error (a TF32 emulation of
// ResNet-101's convolutions in training mode misses fp32 by 0.16 on logits of about 2). No mode
// takes them, as the graph API's engine filter (dnn_graph.cuh) takes none.
inline bool sc_transformed(cudnnConvolutionFwdAlgo_t a) {
  return a == CUDNN_CONVOLUTION_FWD_ALGO_FFT || a == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
inline bool sc_transformed(cudnnConvolutionBwdDataAlgo_t a) {
  return a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
         a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD || a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}

// The first usable algorithm of a ranking: it ran (or may run), is no transform, keeps to the math
// mode (FMA: true fp32, no TF32) and its workspace fits the limit.
template <typename Perf, typename Bytes>
bool sc_first_usable(const std::vector<Perf>& perf, int found, cudnnMathType_t math, Bytes workspace_of,
                     decltype(Perf::algo)* algo, size_t* bytes) {
  for (int i = 0; i < found; ++i) {
    size_t need = 0;
    if (perf[i].status != CUDNN_STATUS_SUCCESS || sc_transformed(perf[i].algo)) continue;
    if (math == CUDNN_FMA_MATH && perf[i].mathType != CUDNN_FMA_MATH && perf[i].mathType != CUDNN_DEFAULT_MATH) continue;
    if (workspace_of(perf[i].algo, &need) != CUDNN_STATUS_SUCCESS || need > kDnnWorkspaceLimit) continue;
    *algo = perf[i].algo;
    *bytes = need;
    return true;
  }
  return false;
}

// A search's first algorithm replaces the heuristic's first only where it is this much faster,
// timed again on scratch operands (sc_dnn_time: the best of three, twice, interleaved).
constexpr float kDnnMargin = 1.15f;

// The algorithm and workspace picked for one convolution shape, by a key the program writes (its
// dimensions, padding, strides, groups, layout, data type and math mode): a program's convolutions
// of one shape search once.
using ScDnnPicks = std::vector<std::pair<std::string, std::pair<int, size_t>>>;

// Zeroed scratch operands of one convolution for timing at setup; freed with it.
struct ScDnnScratch {
  void *a = nullptr, *b = nullptr, *out = nullptr, *workspace = nullptr;
  bool ok = false;
  ScDnnScratch(size_t a_bytes, size_t b_bytes, size_t out_bytes, size_t workspace_bytes) {
    ok = cudaMalloc(&a, a_bytes) == cudaSuccess && cudaMalloc(&b, b_bytes) == cudaSuccess &&
         cudaMalloc(&out, out_bytes) == cudaSuccess &&
         (workspace_bytes == 0 || cudaMalloc(&workspace, workspace_bytes) == cudaSuccess) &&
         cudaMemset(a, 0, a_bytes) == cudaSuccess && cudaMemset(b, 0, b_bytes) == cudaSuccess;
    cudaGetLastError();  // a failed allocation leaves the heuristic's choice, and no error behind
  }
  ~ScDnnScratch() {
    cudaFree(a);
    cudaFree(b);
    cudaFree(out);
    cudaFree(workspace);
    cudaGetLastError();
  }
  ScDnnScratch(const ScDnnScratch&) = delete;
  ScDnnScratch& operator=(const ScDnnScratch&) = delete;
};

// Of the heuristic's first usable algorithm (what PyTorch runs without cudnn.benchmark) and the timed
// search's, the one this convolution keeps. The search times each algorithm in one run, at setup,
// where another process may share the GPU (the Verifier's correctness trials do), so its ranking
// alone is not kept: on an H100 a ResNet-18 program's search put IMPLICIT_GEMM first for 17 of its
// 3x3 convolutions, and they took about 1.5x eager's time with PRECOMP_GEMM. `run(algo, bytes,
// scratch)` runs the convolution once on the scratch operands.
template <typename Algo, typename Run>
Algo sc_verified_pick(cudnnHandle_t h, bool have_heuristic, Algo heuristic, size_t heuristic_bytes,
                      bool have_searched, Algo searched, size_t searched_bytes, size_t a_bytes, size_t b_bytes,
                      size_t out_bytes, Run run, size_t* bytes) {
  if (!have_searched || (have_heuristic && searched == heuristic)) {
    *bytes = heuristic_bytes;
    return heuristic;
  }
  if (!have_heuristic) {
    *bytes = searched_bytes;
    return searched;
  }
  ScDnnScratch scratch(a_bytes, b_bytes, out_bytes, std::max(heuristic_bytes, searched_bytes));
  float heuristic_ms = 3.0e38f, searched_ms = 3.0e38f;
  for (int round = 0; scratch.ok && round < 2; ++round) {
    heuristic_ms = std::min(heuristic_ms, sc_dnn_time(h, [&] { return run(heuristic, heuristic_bytes, scratch); }));
    searched_ms = std::min(searched_ms, sc_dnn_time(h, [&] { return run(searched, searched_bytes, scratch); }));
  }
  const bool faster = searched_ms * kDnnMargin < heuristic_ms;
  *bytes = faster ? searched_bytes : heuristic_bytes;
  return faster ? searched : heuristic;
}
