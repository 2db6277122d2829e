// Hinge loss mean(clamp(1 - predictions * targets, min=0)); targets [32768] broadcast
// over the rows of predictions [32768, 32768]; a 0-dim output. Two passes: 2048
// per-block partial sums in double, then one block adds them in a fixed order.
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

// Pass 1: per-block partial sums of clamp(1 - predictions * targets, min=0), where
// targets ([cols]) broadcast along the rows of predictions ([rows, cols]).
extern "C" __global__ void partial_sums(const float* __restrict__ predictions, const float* __restrict__ targets,
                                        double* __restrict__ partial, long long n, long long cols) {
  __shared__ double red[THREADS];
  double acc = 0.0;
  long long stride = (long long)gridDim.x * THREADS;
  for (long long i = (long long)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride)
    acc += (double)fmaxf(1.0f - predictions[i] * targets[i % cols], 0.0f);
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

extern "C" __global__ void finish_mean(const double* __restrict__ partial, float* __restrict__ out, int parts,
                                       long long n) {
  __shared__ double red[THREADS];
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += THREADS) acc += partial[i];
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) out[0] = (float)(acc / (double)n);
}
