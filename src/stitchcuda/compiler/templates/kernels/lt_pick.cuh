// Which cuBLASLt algorithm a product runs. Host code only, included in the program's source after
// cublasLt.h, <mutex>, <vector> and the definitions of kLtWorkspaceBytes and kLtTimed.
//
// The heuristic's first choice can be far from the best for a small product: on an H100 it gave an
// [8 x 192] . [192 x 128] product with a bias a split-K kernel that ran 51 us, where the next
// product's simt kernel ran 4. With kLtTimed the program times the heuristic's candidates at setup,
// on scratch operands of the product's own layouts, and keeps the fastest where it is far ahead of
// the first (NVIDIA's advice for cuBLASLt: autotune over the heuristic's list). Every candidate
// computes the same product in the same compute type; they differ in tiling and in how the sum
// over k is split. One timing per distinct product per program library: a transformer's layers
// share their few shapes.

constexpr int kLtCandidates = 8;
constexpr size_t kLtScratchLimit = size_t(512) << 20;  // operands larger than this are not timed
constexpr float kLtMargin = 2.0f;  // how much faster than the heuristic's first a timed candidate must be

// Bytes a column-major matrix spans: its last column starts ld * (cols - 1) elements in; its
// batches start stride elements apart.
inline size_t sc_lt_span_bytes(uint64_t rows, uint64_t cols, int64_t ld, int32_t batch, int64_t stride,
                               size_t element) {
  if (rows == 0 || cols == 0) return 0;
  const size_t one = static_cast<size_t>(ld) * (cols - 1) + rows;
  return element * (one + (batch > 1 ? static_cast<size_t>(stride) * static_cast<size_t>(batch - 1) : 0));
}

inline size_t sc_lt_round(size_t bytes) { return (bytes + 255) / 256 * 256; }

// What tells one product from another: each layout's type and shape, the description's compute
// type, transposes and epilogue, the device, and the alignments its candidates were asked for.
struct ScLtShape {
  int64_t v[3 * 6 + 4 + 3] = {};
  bool operator==(const ScLtShape& o) const {
    for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); ++i)
      if (v[i] != o.v[i]) return false;
    return true;
  }
};

inline size_t sc_lt_layout(cublasLtMatrixLayout_t layout, int64_t* out) {
  uint32_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0, stride = 0;
  int32_t batch = 1;
  size_t got = 0;
  cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_TYPE, &type, sizeof(type), &got);
  cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows, sizeof(rows), &got);
  cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof(cols), &got);
  cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld), &got);
  cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch), &got);
  cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride), &got);
  const int64_t fields[6] = {static_cast<int64_t>(type), static_cast<int64_t>(rows), static_cast<int64_t>(cols),
                             ld, batch, stride};
  for (int i = 0; i < 6; ++i) out[i] = fields[i];
  return sc_lt_span_bytes(rows, cols, ld, batch, stride, type == CUDA_R_32F ? 4 : 2);  // fp32, or a bf16 copy
}

// The fastest of ``found``, timed on zeroed scratch operands on a stream of its own; the first
// where it cannot be timed (no memory for the scratch, operands past the limit).
inline cublasLtMatmulAlgo_t sc_lt_fastest(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, const uint32_t* aligns,
                                          const cublasLtMatmulHeuristicResult_t* found, int returned) {
  static std::vector<std::pair<ScLtShape, cublasLtMatmulAlgo_t>> timed;  // every Program this library makes
  static std::mutex timing;  // Programs of several devices may be made from several threads at once
  const std::lock_guard<std::mutex> hold(timing);
  ScLtShape shape;
  const size_t bytes_a = sc_lt_round(sc_lt_layout(a, shape.v));
  const size_t bytes_b = sc_lt_round(sc_lt_layout(b, shape.v + 6));
  const size_t bytes_d = sc_lt_round(sc_lt_layout(d, shape.v + 12));
  int32_t compute = 0, trans_a = 0, trans_b = 0;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  size_t got = 0;
  cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &compute, sizeof(compute), &got);
  cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a), &got);
  cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b), &got);
  cublasLtMatmulDescGetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue), &got);
  int device = 0;
  cudaGetDevice(&device);
  const int64_t tail[4] = {compute, trans_a * 2 + trans_b, static_cast<int64_t>(epilogue), device};
  for (int i = 0; i < 4; ++i) shape.v[18 + i] = tail[i];
  for (int i = 0; i < 3; ++i) shape.v[22 + i] = aligns[i];
  for (const auto& seen : timed)
    if (seen.first == shape) return seen.second;

  // the bias runs over D's rows (cuBLASLt's m: the key's second field of D); the workspace is the
  // program's own size
  const int64_t rows_d = shape.v[12 + 1];
  const size_t bytes_bias = sc_lt_round(static_cast<size_t>(rows_d) * sizeof(float));
  const size_t total = bytes_a + bytes_b + bytes_d + bytes_bias + kLtWorkspaceBytes;
  if (bytes_a + bytes_b + bytes_d > kLtScratchLimit) return found[0].algo;
  char* scratch = nullptr;
  if (cudaMalloc(&scratch, total) != cudaSuccess) {
    cudaGetLastError();  // the failed allocation is not the program's error
    return found[0].algo;
  }
  char* const pa = scratch;
  char* const pb = pa + bytes_a;
  char* const pd = pb + bytes_b;
  char* const bias = pd + bytes_d;
  char* const workspace = bias + bytes_bias;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  int pick = 0;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess &&
      cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess &&
      cudaMemsetAsync(scratch, 0, total, stream) == cudaSuccess) {
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {  // every launch sets its own bias pointer again
      const void* pointer = bias;
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pointer, sizeof(pointer));
    }
    const float one = 1.0f, zero = 0.0f;
    float ms_of[kLtCandidates];
    bool ready[kLtCandidates] = {};
    for (int i = 0; i < returned; ++i) ms_of[i] = 3.0e38f;
    for (int round = 0; round < 2; ++round) {  // interleaved rounds, the best of each kept
      for (int i = 0; i < returned; ++i) {
        if (found[i].state != CUBLAS_STATUS_SUCCESS) continue;
        auto run = [&] {
          return cublasLtMatmul(lt, desc, &one, pa, a, pb, b, &zero, pd, d, pd, d, &found[i].algo, workspace,
                                kLtWorkspaceBytes, stream) == CUBLAS_STATUS_SUCCESS;
        };
        if (round == 0 && !run()) continue;  // the warm-up; a candidate that cannot run is passed over
        cudaEventRecord(start, stream);
        bool ran = true;
        for (int r = 0; r < 3 && ran; ++r) ran = run();
        cudaEventRecord(stop, stream);
        float ms = 0.0f;
        if (!ran || cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)
          continue;
        ready[i] = true;
        ms_of[i] = std::min(ms_of[i], ms);
      }
    }
    for (int i = 1; i < returned; ++i)
      if (ready[i] && ms_of[i] < ms_of[pick]) pick = i;
    // the heuristic's first stands unless another is far faster: on scratch and alone, candidates a
    // quarter or more ahead of it ran behind it in transformers' programs (BERT, GPT-NeoX, a ViT)
    if (pick != 0 && ready[0] && !(ms_of[pick] * kLtMargin < ms_of[0])) pick = 0;
    cudaStreamSynchronize(stream);
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (stream != nullptr) cudaStreamDestroy(stream);
  cudaFree(scratch);
  cudaGetLastError();  // nothing of the timing is the program's error
  timed.emplace_back(shape, found[pick].algo);
  return found[pick].algo;
}

// cuBLASLt's algorithm for the product, for pointers aligned as given (the operands read at an
// element offset are less aligned than a fresh allocation): the heuristic's first choice, or with
// kLtTimed the fastest of its candidates.
inline cublasLtMatmulAlgo_t sc_lt_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                                       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, uint32_t align_a,
                                       uint32_t align_b, uint32_t align_d) {
  cublasLtMatmulPreference_t pref = nullptr;
  SC_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const size_t bytes = kLtWorkspaceBytes;
  SC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes,
                                                       sizeof(bytes)));
  SC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                       sizeof(align_a)));
  SC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                       sizeof(align_b)));
  SC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d,
                                                       sizeof(align_d)));
  SC_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d,
                                                       sizeof(align_d)));
  cublasLtMatmulHeuristicResult_t found[kLtCandidates] = {};
  int returned = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(lt, desc, a, b, d, d, pref, kLtTimed ? kLtCandidates : 1,
                                                               found, &returned);
  cublasLtMatmulPreferenceDestroy(pref);
  SC_REQUIRE(status == CUBLAS_STATUS_SUCCESS && returned > 0,
              "stitchcuda: cuBLASLt has no algorithm for this product (status ", static_cast<int>(status), ")");
  const uint32_t aligns[3] = {align_a, align_b, align_d};
  return kLtTimed && returned > 1 ? sc_lt_fastest(lt, desc, a, b, d, aligns, found, returned) : found[0].algo;
}
