// Which of cuDNN's legacy convolution algorithms a program may run, from a ranking (a timed search or
// the heuristics). Host code only: it needs cudnn.h's types and <vector>, and calls nothing in cuDNN
// itself. Included in the program's source after both.

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
