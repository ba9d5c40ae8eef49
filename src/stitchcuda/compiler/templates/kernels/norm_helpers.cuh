
// ---- normalisation family: statistics accumulators (sc_add one element, sc_merge two partials)
struct ScMoments { double s, q; };  // sums of (x - k) and (x - k)^2 around a per-group shift k
struct ScSoftmax { float m, s; };   // running max, sum of exp(x - m)

__device__ __forceinline__ void sc_init(ScMoments& a) { a.s = 0.0; a.q = 0.0; }
__device__ __forceinline__ void sc_init(ScSoftmax& a) { a.m = -INFINITY; a.s = 0.0f; }
__device__ __forceinline__ void sc_add(ScMoments& a, float x, float k) {
  const double d = (double)x - (double)k;
  a.s += d;
  a.q += d * d;
}
// NaN anywhere makes the row NaN (as torch's max does); -inf contributes nothing (an all -inf row
// ends with s == 0 and gives NaN, as torch does).
__device__ __forceinline__ void sc_add(ScSoftmax& a, float x, float) {
  if (isnan(x)) { a.m = x; a.s = x; }
  else if (x > a.m) { a.s = a.s * expf(a.m - x) + 1.0f; a.m = x; }
  else if (x > -INFINITY) a.s += expf(x - a.m);
}
__device__ __forceinline__ void sc_merge(ScMoments& a, const ScMoments& b) { a.s += b.s; a.q += b.q; }
__device__ __forceinline__ void sc_merge(ScSoftmax& a, const ScSoftmax& b) {
  if (isnan(a.m) || isnan(b.m)) { a.m = NAN; a.s = NAN; return; }
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return;
  // the sum is symmetric in a and b, so every lane of a butterfly gets the same bits
  a.s = (a.s == 0.0f ? 0.0f : a.s * expf(a.m - m)) + (b.s == 0.0f ? 0.0f : b.s * expf(b.m - m));
  a.m = m;
}
__device__ __forceinline__ ScMoments sc_shfl(const ScMoments& a, int o) {
  return {__shfl_xor_sync(0xffffffffu, a.s, o), __shfl_xor_sync(0xffffffffu, a.q, o)};
}
__device__ __forceinline__ ScSoftmax sc_shfl(const ScSoftmax& a, int o) {
  return {__shfl_xor_sync(0xffffffffu, a.m, o), __shfl_xor_sync(0xffffffffu, a.s, o)};
}
// partials written by other blocks: read through L2 (L1 is not coherent across blocks)
__device__ __forceinline__ ScMoments sc_load_cg(const ScMoments* p) { return {__ldcg(&p->s), __ldcg(&p->q)}; }
__device__ __forceinline__ ScSoftmax sc_load_cg(const ScSoftmax* p) { return {__ldcg(&p->m), __ldcg(&p->s)}; }

// The whole block's merge, in a fixed order (every thread gets the result; blockDim.x % 32 == 0).
template <typename Acc>
__device__ __forceinline__ Acc sc_block_merge(Acc v, Acc* smem) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sc_merge(v, sc_shfl(v, o));
  const int warps = blockDim.x >> 5;
  if (warps > 1) {
    __syncthreads();
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
    __syncthreads();
    v = smem[0];
    for (int i = 1; i < warps; ++i) sc_merge(v, smem[i]);
  }
  return v;
}
