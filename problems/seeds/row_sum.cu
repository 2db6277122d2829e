// Naive row sum: one block per row, strided per-thread partial sums, shared-memory tree
// reduction. Scalar loads, no vectorization. blockDim.x must be 256.
#define THREADS 256

extern "C" __global__ void row_sum_naive(const float* __restrict__ x, float* __restrict__ out,
                                         int rows, int cols) {
  __shared__ float red[THREADS];
  int row = blockIdx.x;
  if (row >= rows) return;
  const float* xr = x + (long long)row * cols;
  int t = threadIdx.x;
  float sum = 0.0f;
  for (int j = t; j < cols; j += THREADS) sum += xr[j];
  red[t] = sum;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  if (t == 0) out[row] = red[0];
}
