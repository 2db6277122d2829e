// Naive RMSNorm: one block per row, one pass for the sum of squares (shared-memory tree
// reduction), a second pass that writes x * rsqrt(mean(x^2) + eps) * weight. blockDim.x must be 256.
#define THREADS 256

extern "C" __global__ void rmsnorm_naive(const float* __restrict__ x, const float* __restrict__ weight,
                                         float* __restrict__ out, int rows, int D, float eps) {
  __shared__ float red[THREADS];
  int row = blockIdx.x;
  if (row >= rows) return;
  const float* xr = x + (long long)row * D;
  float* yr = out + (long long)row * D;
  int t = threadIdx.x;
  float sq = 0.0f;
  for (int j = t; j < D; j += THREADS) sq += xr[j] * xr[j];
  red[t] = sq;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  float r = rsqrtf(red[0] / (float)D + eps);
  for (int j = t; j < D; j += THREADS) yr[j] = xr[j] * r * weight[j];
}
