
// One 32x32 tile of a rows x cols matrix (rows from r0, columns from c0), read along its rows and
// written along its columns through shared memory, so that both sides are coalesced:
// load(r, c) reads element (r, c), store(r, c, x) writes it wherever the caller's layout puts it.
// Every transposing conversion (split halves, bf16, channels-last and back) is this loop.
template <typename Load, typename Store>
__device__ __forceinline__ void sc_tile_transpose(long long rows, long long cols, long long r0, long long c0,
                                                  Load load, Store store) {
  __shared__ float tile[32][33];
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const long long r = r0 + j, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[j][threadIdx.x] = load(r, c);
  }
  __syncthreads();
  for (int j = threadIdx.y; j < 32; j += blockDim.y) {
    const long long c = c0 + j, r = r0 + threadIdx.x;
    if (r < rows && c < cols) store(r, c, tile[threadIdx.x][j]);
  }
}
