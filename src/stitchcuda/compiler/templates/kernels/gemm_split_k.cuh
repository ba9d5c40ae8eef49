
// Split-K: the slices' partial products [slices, count] summed pairwise in fp32, then the product's
// own epilogue: act(sum + beta * C), C a bias over the columns (ld_c 0) or a residual (ld_c = cols).
__global__ void sc_sum_slices(const float* __restrict__ src, float* __restrict__ dst, long long count, int slices,
                              const float* __restrict__ c, long long ld_c, long long cols, float beta, int act) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < count; i += (long long)gridDim.x * blockDim.x) {
    float part[64];  // slices <= 64
    for (int s = 0; s < slices; ++s) part[s] = src[s * count + i];
    for (int width = slices; width > 1; width = (width + 1) / 2) {
      for (int s = 0; s < width / 2; ++s) part[s] = part[2 * s] + part[2 * s + 1];
      if (width & 1) part[width / 2] = part[width - 1];
    }
    float v = part[0];
    if (c != nullptr) v += beta * c[(i / cols) * ld_c + i % cols];
    switch (act) {  // the same for every thread: no divergence
      case 1: v = fmaxf(v, 0.0f); break;                                                       // relu
      case 2: v = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)); break;                   // gelu
      case 3: v = 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v))); break;  // gelu_tanh
      case 4: v = v / (1.0f + expf(-v)); break;                                                // silu
      case 5: v = 1.0f / (1.0f + expf(-v)); break;                                             // sigmoid
      default: break;
    }
    dst[i] = v;
  }
}
