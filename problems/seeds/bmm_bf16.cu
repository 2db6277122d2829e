// Naive bf16 batched matmul: one thread per output element C[b][row][col], fp32 accumulation
// over K from global memory, one rounding to bf16. No tiling, no tensor cores.
#include <cuda_bf16.h>

extern "C" __global__ void bmm_bf16_naive(const __nv_bfloat16* __restrict__ A, const __nv_bfloat16* __restrict__ B,
                                          __nv_bfloat16* __restrict__ C, int M, int N, int K) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  long long b = blockIdx.z;
  if (row >= M || col >= N) return;
  const __nv_bfloat16* Ab = A + b * M * K;
  const __nv_bfloat16* Bb = B + b * K * N;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) {
    acc += __bfloat162float(Ab[(long long)row * K + k]) * __bfloat162float(Bb[(long long)k * N + col]);
  }
  C[b * M * N + (long long)row * N + col] = __float2bfloat16_rn(acc);
}
