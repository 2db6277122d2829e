// Naive fp16 SwiGLU: one thread per element, scalar half loads, math in fp32, one rounding.
#include <cuda_fp16.h>

extern "C" __global__ void swiglu_naive(const __half* __restrict__ gate, const __half* __restrict__ up,
                                        __half* __restrict__ out, int n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float g = __half2float(gate[i]);
  float u = __half2float(up[i]);
  float silu = g / (1.0f + expf(-g));
  out[i] = __float2half_rn(silu * u);
}
