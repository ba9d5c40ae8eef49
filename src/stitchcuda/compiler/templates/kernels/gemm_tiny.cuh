
// Tiny batched products: one block a matrix, both operands staged in shared memory (A's rows
// padded by one against bank conflicts, B's to a multiple of four for float4 reads), each thread
// a 1 x 4 strip of the output as k-ordered fp32 FMA chains. Matrix b = o*inner + j. The shape is
// compile-time, so the index arithmetic of the staging loops is shifts and multiplies.
template <int M, int N, int K, bool A_ROWS, bool B_ROWS, int THREADS>
__global__ void __launch_bounds__(THREADS) sc_tiny_gemm(const float* __restrict__ A, const float* __restrict__ B,
                                                        float* __restrict__ C, long long lda, long long ldb,
                                                        long long ldc, int inner, long long sa, long long oa,
                                                        long long sb, long long ob, long long sc, long long oc,
                                                        float alpha) {
  constexpr int KP = K + 1, NP = (N + 3) / 4 * 4, NT = NP / 4;
  __shared__ float As[M * KP];
  __shared__ __align__(16) float Bs[K * NP];
  const long long o = blockIdx.x / inner, j = blockIdx.x % inner;
  const float* a = A + o * oa + j * sa;
  const float* b = B + o * ob + j * sb;
  float* c = C + o * oc + j * sc;
  for (int t = threadIdx.x; t < M * K; t += THREADS) {  // along the unit stride: coalesced
    const int i = A_ROWS ? t / K : t % M, kk = A_ROWS ? t % K : t / M;
    As[i * KP + kk] = a[A_ROWS ? i * lda + kk : kk * lda + i];
  }
  for (int t = threadIdx.x; t < K * NP; t += THREADS) {
    const int kk = B_ROWS ? t / NP : t % K, jj = B_ROWS ? t % NP : t / K;
    Bs[kk * NP + jj] = jj < N ? b[B_ROWS ? kk * ldb + jj : jj * ldb + kk] : 0.0f;
  }
  __syncthreads();
  for (int t = threadIdx.x; t < M * NT; t += THREADS) {
    const int i = t / NT, j0 = (t % NT) * 4;
    float acc0 = 0.0f, acc1 = 0.0f, acc2 = 0.0f, acc3 = 0.0f;
#pragma unroll 8
    for (int kk = 0; kk < K; ++kk) {
      const float av = As[i * KP + kk];
      const float4 bv = *reinterpret_cast<const float4*>(&Bs[kk * NP + j0]);
      acc0 = fmaf(av, bv.x, acc0);
      acc1 = fmaf(av, bv.y, acc1);
      acc2 = fmaf(av, bv.z, acc2);
      acc3 = fmaf(av, bv.w, acc3);
    }
    float* row = c + i * ldc + j0;
    row[0] = alpha * acc0;
    if (j0 + 1 < N) row[1] = alpha * acc1;
    if (j0 + 2 < N) row[2] = alpha * acc2;
    if (j0 + 3 < N) row[3] = alpha * acc3;
  }
}
