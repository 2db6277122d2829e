// Naive LayerNorm: one block per row (a row is the whole normalized shape, 64*256*256 values),
// two-pass statistics (mean, then mean of squared deviations) and a third pass that writes.
// Only 16 blocks for the 16 rows: most of the GPU idles. blockDim.x must be 1024.
#define THREADS 1024

extern "C" __global__ void layernorm_naive(const float* __restrict__ x, const float* __restrict__ weight,
                                           const float* __restrict__ bias, float* __restrict__ out,
                                           int rows, int D, float eps) {
  __shared__ float red[THREADS];
  int row = blockIdx.x;
  if (row >= rows) return;
  const float* xr = x + (long long)row * D;
  float* yr = out + (long long)row * D;
  int t = threadIdx.x;

  float sum = 0.0f;
  for (int j = t; j < D; j += THREADS) sum += xr[j];
  red[t] = sum;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  float mean = red[0] / (float)D;
  __syncthreads();

  float sq = 0.0f;
  for (int j = t; j < D; j += THREADS) {
    float d = xr[j] - mean;
    sq += d * d;
  }
  red[t] = sq;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  float rstd = rsqrtf(red[0] / (float)D + eps);

  for (int j = t; j < D; j += THREADS) yr[j] = (xr[j] - mean) * rstd * weight[j] + bias[j];
}
