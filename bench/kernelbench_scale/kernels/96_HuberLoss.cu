// Smooth L1 (Huber, beta 1) loss: the mean over all 32768 x 32768 elements, a 0-dim output. Two passes:
// 2048 per-block partial sums in double (scratch), then one block adds them in a
// fixed order, so the result does not depend on scheduling.
#define THREADS 256
// Block-wide sum of one double per thread (blockDim.x == THREADS); valid in thread 0.
__device__ double block_sum(double v, double* red) {
  int t = threadIdx.x;
  red[t] = v;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  double r = red[0];
  __syncthreads();
  return r;
}

// Pass 1: each block sums its grid-stride share of the terms into partial[blockIdx.x].
extern "C" __global__ void partial_sums(const float* __restrict__ predictions, const float* __restrict__ targets,
                                        double* __restrict__ partial, long long n) {
  __shared__ double red[THREADS];
  double acc = 0.0;
  long long stride = (long long)gridDim.x * THREADS;
  for (long long i = (long long)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride) {
    float p = predictions[i], t = targets[i];
    acc += (double)(fabsf(p - t) < 1.0f ? 0.5f * (p - t) * (p - t) : fabsf(p - t) - 0.5f);
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Pass 2: one block adds the partials in a fixed order and writes the mean (0-dim out).
extern "C" __global__ void finish_mean(const double* __restrict__ partial, float* __restrict__ out, int parts,
                                       long long n) {
  __shared__ double red[THREADS];
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += THREADS) acc += partial[i];
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) out[0] = (float)(acc / (double)n);
}
