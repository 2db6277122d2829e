// Softmax over dim 1 of a [4096, 393216] input: one block of 1024 threads per
// row, three passes (max, sum of exp(x - max), write).
#define THREADS 1024
// Block-wide reduction of one value per thread (blockDim.x == THREADS); every
// thread gets the result.
__device__ float block_reduce(float v, float* red, bool is_max) {
  int t = threadIdx.x;
  red[t] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] = is_max ? fmaxf(red[t], red[t + s]) : red[t] + red[t + s];
    __syncthreads();
  }
  float r = red[0];
  __syncthreads();
  return r;
}

extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ out, long long cols) {
  __shared__ float red[THREADS];
  const float* xr = x + (long long)blockIdx.x * cols;
  float* yr = out + (long long)blockIdx.x * cols;
  float m = -3.402823466e+38f;
  for (long long j = threadIdx.x; j < cols; j += THREADS) m = fmaxf(m, xr[j]);
  m = block_reduce(m, red, true);
  float sum = 0.0f;
  for (long long j = threadIdx.x; j < cols; j += THREADS) sum += expf(xr[j] - m);
  sum = block_reduce(sum, red, false);
  float logsum = logf(sum);
  (void)logsum;
  for (long long j = threadIdx.x; j < cols; j += THREADS) yr[j] = expf(xr[j] - m) / sum;
}
