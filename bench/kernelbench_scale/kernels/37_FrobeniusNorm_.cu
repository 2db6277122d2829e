// x / ||x||_F over a [112, 64, 512, 512] input: per-block sums of squares in double
// (2048 partials), one block for the norm, then an elementwise divide.
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

extern "C" __global__ void partial_sumsq(const float* __restrict__ x, double* __restrict__ partial, long long n) {
  __shared__ double red[THREADS];
  double acc = 0.0;
  long long stride = (long long)gridDim.x * THREADS;
  for (long long i = (long long)blockIdx.x * THREADS + threadIdx.x; i < n; i += stride) {
    double v = x[i];
    acc += v * v;
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: the norm, from the partials in a fixed order, into norm[0].
extern "C" __global__ void finish_norm(const double* __restrict__ partial, float* __restrict__ norm, int parts) {
  __shared__ double red[THREADS];
  double acc = 0.0;
  for (int i = threadIdx.x; i < parts; i += THREADS) acc += partial[i];
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) norm[0] = (float)sqrt(acc);
}

extern "C" __global__ void divide(const float* __restrict__ x, const float* __restrict__ norm, float* __restrict__ out,
                                  long long n) {
  float d = norm[0];
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) out[i] = x[i] / d;
}
