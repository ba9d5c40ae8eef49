
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
  __shared__ float tile[32][33];
  const float* s = src + (blockIdx.z / inner) * s_outer + (blockIdx.z % inner) * s_batch;
  __nv_bfloat16* d = dst + blockIdx.z * d_batch;
  const int r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = s[r * s_row + c];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) d[(long long)c * d_row + r] = __float2bfloat16_rn(tile[threadIdx.x][j]);
  }
}

// A convolution's input [n, C, HW] as channels-last bf16 [n, HW, C], through a 32x32 tile.
__global__ void sc_nhwc_bf16(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst, int channels,
                             long long hw) {
  __shared__ float tile[32][33];
  const float* s = src + (long long)blockIdx.z * channels * hw;
  __nv_bfloat16* d = dst + (long long)blockIdx.z * channels * hw;
  const int c0 = blockIdx.y * 32;
  const long long p0 = blockIdx.x * 32LL;
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int c = c0 + j;
    const long long p = p0 + threadIdx.x;
    if (c < channels && p < hw) tile[j][threadIdx.x] = s[c * hw + p];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int c = c0 + threadIdx.x;
    const long long p = p0 + j;
    if (c < channels && p < hw) d[p * channels + c] = __float2bfloat16_rn(tile[threadIdx.x][j]);
  }
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
  __shared__ float tile[32][33];
  const __nv_bfloat16* s = src + (long long)blockIdx.z * channels * hw;
  float* d = dst + (long long)blockIdx.z * channels * hw;
  const long long p0 = blockIdx.x * 32LL;
  const int c0 = blockIdx.y * 32;
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const long long p = p0 + j;
    const int c = c0 + threadIdx.x;
    if (c < channels && p < hw) tile[j][threadIdx.x] = __bfloat162float(s[p * channels + c]);
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const int c = c0 + j;
    const long long p = p0 + threadIdx.x;
    if (c < channels && p < hw) d[c * hw + p] = tile[threadIdx.x][j];
  }
}
