
// The pointer arrays of a product over two batch dimensions: matrix i = o * inner + j.
__global__ void sc_batch_ptrs(const float* a, const float* b, float* c, int inner, int total, long long sa,
                              long long oa, long long sb, long long ob, long long sc, long long oc,
                              const float** pa, const float** pb, float** pc) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  const long long o = i / inner, j = i - o * inner;
  pa[i] = a + o * oa + j * sa;
  pb[i] = b + o * ob + j * sb;
  pc[i] = c + o * oc + j * sc;
}
