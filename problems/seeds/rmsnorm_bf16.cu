// Naive bf16 RMSNorm: one block per row, scalar bf16 loads, statistics and scaling in fp32,
// one rounding to bf16 at the end. blockDim.x must be 256.
#include <cuda_bf16.h>
#define THREADS 256

extern "C" __global__ void rmsnorm_bf16_naive(const __nv_bfloat16* __restrict__ x,
                                              const __nv_bfloat16* __restrict__ weight,
                                              __nv_bfloat16* __restrict__ out, int rows, int D, float eps) {
  __shared__ float red[THREADS];
  int row = blockIdx.x;
  if (row >= rows) return;
  const __nv_bfloat16* xr = x + (long long)row * D;
  __nv_bfloat16* yr = out + (long long)row * D;
  int t = threadIdx.x;
  float sq = 0.0f;
  for (int j = t; j < D; j += THREADS) {
    float v = __bfloat162float(xr[j]);
    sq += v * v;
  }
  red[t] = sq;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  float r = rsqrtf(red[0] / (float)D + eps);
  for (int j = t; j < D; j += THREADS) {
    float v = __bfloat162float(xr[j]) * r * __bfloat162float(weight[j]);
    yr[j] = __float2bfloat16_rn(v);
  }
}
