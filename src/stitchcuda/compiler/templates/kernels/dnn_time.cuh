// Timing one cuDNN call at setup. Host code only: needs cudnn.h and the CUDA runtime; included in
// the program's source before the headers that pick algorithms and plans.

// Milliseconds of one call of `run` on the handle's stream: the best of three after a warm-up;
// "infinitely slow" where it fails.
template <typename Run>
float sc_dnn_time(cudnnHandle_t h, Run run) {
  cudaStream_t stream = nullptr;
  cudnnGetStream(h, &stream);
  cudaEvent_t start = nullptr, end = nullptr;
  float best = 3.0e38f;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&end) != cudaSuccess) return best;
  if (run() == CUDNN_STATUS_SUCCESS) {
    for (int i = 0; i < 3; ++i) {
      float ms = 0.0f;
      cudaEventRecord(start, stream);
      if (run() != CUDNN_STATUS_SUCCESS) {
        best = 3.0e38f;
        break;
      }
      cudaEventRecord(end, stream);
      if (cudaEventSynchronize(end) != cudaSuccess || cudaEventElapsedTime(&ms, start, end) != cudaSuccess) {
        best = 3.0e38f;
        break;
      }
      best = std::min(best, ms);
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaGetLastError();  // a failed run leaves nothing behind for the program's own checks
  return best;
}
