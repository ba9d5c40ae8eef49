// What a persistent kernel (one launch over many dependent steps) needs beyond a block: a barrier
// over a group of co-resident blocks (its shared memory, sized at launch, is the prelude's
// SC_BLOCK_SHARED). The launch is cooperative (cudaLaunchAttributeCooperative), so CUDA refuses
// it rather than start blocks that could never all be resident and would spin forever.
//
// The barrier is a counter per group, zeroed before the launch: after its step a block adds one,
// and the group's next step starts once the counter reaches blocks x steps done. A block's writes
// are ordered before its arrival by __syncthreads and a device-wide fence; a reader's loads after
// the wait go through L2 (__ldcg), never a stale L1 line.
#ifndef SC_GRID_BARRIER
#define SC_GRID_BARRIER

__device__ __forceinline__ void sc_group_arrive(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
  }
}

__device__ __forceinline__ void sc_group_wait(const unsigned* counter, unsigned target) {
  if (threadIdx.x == 0) {
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (seen < target);
    __threadfence();
  }
  __syncthreads();
}

#endif
