
// One operand as bf16 (round to nearest even): element (b, r, c) of the stored matrix goes to
// b*d_batch + r*d_row + c; matrix b is read at (b / inner)*s_outer + (b % inner)*s_batch.
__global__ void sc_to_bf16(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, long long rows,
                           long long cols, long long total, long long s_batch, long long s_row, long long d_batch,
                           long long d_row, long long inner, long long s_outer) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long c = i % cols, r = (i / cols) % rows, b = i / (cols * rows);
    dst[b * d_batch + r * d_row + c] =
        __float2bfloat16_rn(src[(b / inner) * s_outer + (b % inner) * s_batch + r * s_row + c]);
  }
}

// The same, transposed through a 32x32 tile: element (b, r, c) goes to b*d_batch + c*d_row + r.
__global__ void sc_to_bf16_t(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, int rows, int cols,
                             long long s_batch, long long s_row, long long d_batch, long long d_row,
                             long long inner, long long s_outer) {
  const float* s = src + (blockIdx.z / inner) * s_outer + (blockIdx.z % inner) * s_batch;
  __nv_bfloat16* d = dst + blockIdx.z * d_batch;
  sc_tile_transpose(
      rows, cols, blockIdx.y * 32LL, blockIdx.x * 32LL, [&](long long r, long long c) { return s[r * s_row + c]; },
      [&](long long r, long long c, float x) { d[c * d_row + r] = __float2bfloat16_rn(x); });
}

// A convolution's input [n, C, HW] as channels-last bf16 [n, HW, C], through a 32x32 tile.
__global__ void sc_nhwc_bf16(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, int channels,
                             long long hw) {
  const float* s = src + (long long)blockIdx.z * channels * hw;
  __nv_bfloat16* d = dst + (long long)blockIdx.z * channels * hw;
  sc_tile_transpose(
      channels, hw, blockIdx.y * 32LL, blockIdx.x * 32LL, [&](long long c, long long p) { return s[c * hw + p]; },
      [&](long long c, long long p, float x) { d[p * channels + c] = __float2bfloat16_rn(x); });
}

// A convolution's weight in cuDNN's NHWC filter layout as bf16: element (i0, i1, i2, i3) of the
// contiguous [d0, d1, d2, d3] source goes to sum(i_k * t_k).
__global__ void sc_weight_bf16(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, long long d1,
                               long long d2, long long d3, long long t0, long long t1, long long t2, long long t3,
                               long long total) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long i3 = i % d3, i2 = (i / d3) % d2, i1 = (i / (d3 * d2)) % d1, i0 = i / (d3 * d2 * d1);
    dst[i0 * t0 + i1 * t1 + i2 * t2 + i3 * t3] = __float2bfloat16_rn(src[i]);
  }
}

// cuDNN's channels-last bf16 output [n, HW, K] back to the program's fp32 [n, K, HW].
__global__ void sc_nhwc_bf16_to_nchw(const __nv_bfloat16* __restrict__ src, float* __restrict__ dst, int channels,
                                     long long hw) {
  const __nv_bfloat16* s = src + (long long)blockIdx.z * channels * hw;
  float* d = dst + (long long)blockIdx.z * channels * hw;
  sc_tile_transpose(
      hw, channels, blockIdx.x * 32LL, blockIdx.y * 32LL,
      [&](long long p, long long c) { return __bfloat162float(s[p * channels + c]); },
      [&](long long p, long long c, float x) { d[c * hw + p] = x; });
}
