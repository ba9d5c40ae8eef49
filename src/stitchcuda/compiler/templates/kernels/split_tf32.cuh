
// Round to the nearest TF32 (10-bit mantissa), leaving inf and NaN as they are.
__device__ __forceinline__ float sc_tf32_round(float x) {
  unsigned int u = __float_as_uint(x);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  return __uint_as_float(u);
}

// One operand's two TF32 halves (see split_tf32.py): the tensor cores read both unchanged, so
// only small.small is lost. Element (b, r, c) of the stored matrix goes to b*d_batch + r*d_row + c;
// matrix b is read at (b / inner)*s_outer + (b % inner)*s_batch (two batch dimensions, made one).
__global__ void sc_split_tf32(const float* __restrict__ src, float* __restrict__ dst, long long rows,
                              long long cols, long long total, long long s_batch, long long s_row,
                              long long d_batch, long long d_row, long long off_big, long long off_small,
                              long long off_big2, long long inner, long long s_outer) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long c = i % cols, r = (i / cols) % rows, b = i / (cols * rows);
    const float x = src[(b / inner) * s_outer + (b % inner) * s_batch + r * s_row + c];
    const float big = sc_tf32_round(x);
    const float small = isfinite(x) ? sc_tf32_round(x - big) : 0.0f;
    const long long d = b * d_batch + r * d_row + c;
    dst[d + off_big] = big;
    dst[d + off_small] = small;
    if (off_big2 >= 0) dst[d + off_big2] = big;
  }
}

// The same, four columns a thread with 16-byte loads and stores (every stride and offset a multiple
// of 4, the source 16-byte aligned); one division a row, not three an element: the scalar kernel
// took 12-24% of a split program's time on an H100.
__device__ __forceinline__ float4 sc_tf32_round4(float4 x) {
  return make_float4(sc_tf32_round(x.x), sc_tf32_round(x.y), sc_tf32_round(x.z), sc_tf32_round(x.w));
}

__global__ void sc_split_tf32_v4(const float* __restrict__ src, float* __restrict__ dst, long long rows_total,
                                 long long rows, int cols4, long long s_batch, long long s_row, long long d_batch,
                                 long long d_row, long long off_big, long long off_small, long long off_big2,
                                 long long inner, long long s_outer) {
  const int c4 = blockIdx.x * blockDim.x + threadIdx.x;
  if (c4 >= cols4) return;
  for (long long rt = blockIdx.y * (long long)blockDim.y + threadIdx.y; rt < rows_total;
       rt += (long long)gridDim.y * blockDim.y) {
    const long long b = rt / rows, r = rt - b * rows;
    const float4 x = *reinterpret_cast<const float4*>(src + (b / inner) * s_outer + (b % inner) * s_batch +
                                                      r * s_row + 4LL * c4);
    const float4 big = sc_tf32_round4(x);
    float4 small = sc_tf32_round4(make_float4(x.x - big.x, x.y - big.y, x.z - big.z, x.w - big.w));
    if (!isfinite(x.x)) small.x = 0.0f;
    if (!isfinite(x.y)) small.y = 0.0f;
    if (!isfinite(x.z)) small.z = 0.0f;
    if (!isfinite(x.w)) small.w = 0.0f;
    float* d = dst + b * d_batch + r * d_row + 4LL * c4;
    *reinterpret_cast<float4*>(d + off_big) = big;
    *reinterpret_cast<float4*>(d + off_small) = small;
    if (off_big2 >= 0) *reinterpret_cast<float4*>(d + off_big2) = big;
  }
}

// The same, transposed through a 32x32 tile: element (b, r, c) goes to b*d_batch + c*d_row + r,
// both reads and writes coalesced.
__global__ void sc_split_tf32_t(const float* __restrict__ src, float* __restrict__ dst, int rows, int cols,
                                long long s_batch, long long s_row, long long d_batch, long long d_row,
                                long long off_big, long long off_small, long long off_big2, long long inner,
                                long long s_outer) {
  const float* s = src + (blockIdx.z / inner) * s_outer + (blockIdx.z % inner) * s_batch;
  float* d = dst + blockIdx.z * d_batch;
  sc_tile_transpose(
      rows, cols, blockIdx.y * 32LL, blockIdx.x * 32LL, [&](long long r, long long c) { return s[r * s_row + c]; },
      [&](long long r, long long c, float x) {
        const float big = sc_tf32_round(x);
        const float small = isfinite(x) ? sc_tf32_round(x - big) : 0.0f;
        const long long o = c * d_row + r;
        d[o + off_big] = big;
        d[o + off_small] = small;
        if (off_big2 >= 0) d[o + off_big2] = big;
      });
}

// A convolution's input [n, C, HW] as channels-last halves [n, HW, 3C] through a 32x32 tile (reads
// and writes coalesced): input channel g*cg + c goes to channels g*3cg + j*cg + c, j = 0, 1, 2, copy j
// its small half where bit j of small_at is set.
__global__ void sc_split3_nhwc(const float* __restrict__ src, float* __restrict__ dst, int channels, int cg,
                               long long hw, int small_at) {
  const float* s = src + (long long)blockIdx.z * channels * hw;
  float* d = dst + (long long)blockIdx.z * 3 * channels * hw;
  sc_tile_transpose(
      channels, hw, blockIdx.y * 32LL, blockIdx.x * 32LL, [&](long long c, long long p) { return s[c * hw + p]; },
      [&](long long c, long long p, float x) {
        const float big = sc_tf32_round(x);
        const float small = isfinite(x) ? sc_tf32_round(x - big) : 0.0f;
        float* o = d + p * 3 * channels + (c / cg) * 3 * cg + c % cg;
        o[0] = (small_at & 1) ? small : big;
        o[cg] = (small_at & 2) ? small : big;
        o[2 * cg] = (small_at & 4) ? small : big;
      });
}

// A convolution's weight as its channels-last halves: element (i0, i1, i2, i3) of the contiguous
// [d0, d1, d2, d3] source goes to sum(i_k * t_k) + j * tj for its three copies j.
__global__ void sc_split3_weight(const float* __restrict__ src, float* __restrict__ dst, long long d1,
                                 long long d2, long long d3, long long t0, long long t1, long long t2,
                                 long long t3, long long tj, long long total, int small_at) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long i3 = i % d3, i2 = (i / d3) % d2, i1 = (i / (d3 * d2)) % d1, i0 = i / (d3 * d2 * d1);
    const float x = src[i];
    const float big = sc_tf32_round(x);
    const float small = isfinite(x) ? sc_tf32_round(x - big) : 0.0f;
    float* o = dst + i0 * t0 + i1 * t1 + i2 * t2 + i3 * t3;
    o[0] = (small_at & 1) ? small : big;
    o[tj] = (small_at & 2) ? small : big;
    o[2 * tj] = (small_at & 4) ? small : big;
  }
}

// cuDNN's channels-last output [n, HW, K] back to the program's [n, K, HW], through a 32x32 tile.
__global__ void sc_nhwc_to_nchw(const float* __restrict__ src, float* __restrict__ dst, int channels, long long hw) {
  const float* s = src + (long long)blockIdx.z * channels * hw;
  float* d = dst + (long long)blockIdx.z * channels * hw;
  sc_tile_transpose(
      hw, channels, blockIdx.x * 32LL, blockIdx.y * 32LL, [&](long long p, long long c) { return s[p * channels + c]; },
      [&](long long p, long long c, float x) { d[c * hw + p] = x; });
}
