// Conv2d 64 -> 128 channels, 1x1, no bias, on [16, 64, 1024, 1024].
#define OCB 8
// Pointwise (1x1) convolution, no bias: out[n, oc, p] = sum_c w[oc, c] * x[n, c, p].
// grid: (cdiv(H * W, 256), N * OC / OCB); each thread computes OCB output channels
// of one pixel; neighbouring threads on neighbouring pixels (coalesced).
extern "C" __global__ void conv1x1(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                   int N, int C, long long P, int OC) {
  long long p = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  int groups = OC / OCB;
  int n = blockIdx.y / groups, oc0 = (blockIdx.y % groups) * OCB;
  if (p >= P) return;
  float acc[OCB] = {};
  for (int c = 0; c < C; ++c) {
    float v = x[((long long)n * C + c) * P + p];
#pragma unroll
    for (int o = 0; o < OCB; ++o) acc[o] = fmaf(v, w[(oc0 + o) * C + c], acc[o]);
  }
#pragma unroll
  for (int o = 0; o < OCB; ++o) out[((long long)n * OC + oc0 + o) * P + p] = acc[o];
}
