// Naive fused linear + bias + GELU in bf16: one thread per output element out[m][n],
// fp32 dot product of x[m,:] and W[n,:] from global memory, plus bias, rounded to bf16
// (as the unfused reference rounds the linear output), then exact erf GELU, rounded again.
#include <cuda_bf16.h>

extern "C" __global__ void linear_bias_gelu_naive(const __nv_bfloat16* __restrict__ x,
                                                  const __nv_bfloat16* __restrict__ W,
                                                  const __nv_bfloat16* __restrict__ bias,
                                                  __nv_bfloat16* __restrict__ out, int M, int N, int K) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  int m = blockIdx.y * blockDim.y + threadIdx.y;
  if (m >= M || n >= N) return;
  const __nv_bfloat16* xr = x + (long long)m * K;
  const __nv_bfloat16* wr = W + (long long)n * K;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc += __bfloat162float(xr[k]) * __bfloat162float(wr[k]);
  float y = __bfloat162float(__float2bfloat16_rn(acc + __bfloat162float(bias[n])));
  float g = 0.5f * y * (1.0f + erff(y * 0.7071067811865476f));
  out[(long long)m * N + n] = __float2bfloat16_rn(g);
}
