// Does a local-memory scrub reach every byte a later kernel can read?
// memo writes a mark (by block) into an uninitialised local array; probe
// (same frame) counts marks of its own block found there in the next launch.
#include <cstdio>
#include <cuda_runtime.h>
__global__ void memo(unsigned* hits, int write) {
  volatile unsigned stash[64];
  const unsigned mark = 0xC0FFEE00u ^ blockIdx.x;
  if (stash[threadIdx.x & 63] == mark) atomicAdd(hits, 1u);
  if (write) stash[threadIdx.x & 63] = mark;
}
template <int W>
__global__ void scrub(unsigned v, unsigned* arrived, unsigned target) {
  volatile unsigned frame[W];
  if (threadIdx.x == 0) {
    atomicAdd(arrived, 1u);
    long long t0 = clock64();
    while (atomicAdd(arrived, 0u) < target && clock64() - t0 < 20000000LL) {}
  }
  __syncthreads();
  for (int i = 0; i < W; ++i) frame[i] = v ^ i;
}
template <int W>
unsigned trial(size_t stack, int do_scrub, unsigned* hits, unsigned* arrived) {
  cudaDeviceSetLimit(cudaLimitStackSize, stack);
  int sms = 0, per = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, scrub<W>, 128, 0);
  unsigned total = 0;
  for (int r = 0; r < 20; ++r) {
    cudaMemset(hits, 0, 4);
    memo<<<4096, 256>>>(hits, 1);
    if (do_scrub) {
      cudaMemset(arrived, 0, 4);
      cudaDeviceSetLimit(cudaLimitStackSize, stack);
      scrub<W><<<per * sms, 128>>>(r * 0x9E3779B9u, arrived, per * sms);
    }
    memo<<<4096, 256>>>(hits, 0);
    unsigned h = 0;
    cudaMemcpy(&h, hits, 4, cudaMemcpyDeviceToHost);
    total += h;
  }
  size_t got = 0;
  cudaDeviceGetLimit(&got, cudaLimitStackSize);
  printf("frame %5d B, stack limit asked %4zu got %4zu, scrub %d (%d blocks/SM): %u marks found in 20 runs (%s)\n",
         W * 4, stack, got, do_scrub, per, total, cudaGetErrorString(cudaGetLastError()));
  return total;
}
int main() {
  unsigned *hits, *arrived;
  cudaMalloc(&hits, 4);
  cudaMalloc(&arrived, 4);
  trial<256>(1024, 0, hits, arrived);
  trial<256>(1024, 1, hits, arrived);
  trial<512>(1024, 1, hits, arrived);
  trial<256>(0, 1, hits, arrived);
  trial<512>(0, 1, hits, arrived);
  trial<256>(0, 0, hits, arrived);
  return 0;
}
