// Naive cross-entropy, two launches:
// (1) one block per row: loss[row] = log(sum exp(x - max)) + max - x[target] (two passes);
// (2) one block sums the per-row losses in a fixed order and writes the mean to out[0].
// blockDim.x must be 256 for both.
#define THREADS 256

extern "C" __global__ void ce_rows_naive(const float* __restrict__ logits, const long long* __restrict__ targets,
                                         float* __restrict__ row_loss, int rows, int cols) {
  __shared__ float red[THREADS];
  int row = blockIdx.x;
  if (row >= rows) return;
  const float* xr = logits + (long long)row * cols;
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
  if (t == 0) {
    long long target = targets[row];
    row_loss[row] = logf(red[0]) + m - xr[target];
  }
}

extern "C" __global__ void ce_mean_naive(const float* __restrict__ row_loss, float* __restrict__ out, int rows) {
  __shared__ float red[THREADS];
  int t = threadIdx.x;
  float sum = 0.0f;
  for (int j = t; j < rows; j += THREADS) sum += row_loss[j];
  red[t] = sum;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  if (t == 0) out[0] = red[0] / (float)rows;
}
