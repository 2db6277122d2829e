// Naive softmax over rows: one block per row, three passes over global memory
// (row max, sum of exp(x - max), then write exp(x - max) / sum). blockDim.x must be 256.
#define THREADS 256

extern "C" __global__ void softmax_rows_naive(const float* __restrict__ x, float* __restrict__ out,
                                              int rows, int cols) {
  __shared__ float red[THREADS];
  int row = blockIdx.x;
  if (row >= rows) return;
  const float* xr = x + (long long)row * cols;
  float* yr = out + (long long)row * cols;
  int t = threadIdx.x;

  float m = -3.402823466e+38f;  // -FLT_MAX
  for (int j = t; j < cols; j += THREADS) m = fmaxf(m, xr[j]);
  red[t] = m;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] = fmaxf(red[t], red[t + s]);
    __syncthreads();
  }
  m = red[0];
  __syncthreads();

  float sum = 0.0f;
  for (int j = t; j < cols; j += THREADS) sum += expf(xr[j] - m);
  red[t] = sum;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  float inv = 1.0f / red[0];

  for (int j = t; j < cols; j += THREADS) yr[j] = expf(xr[j] - m) * inv;
}
