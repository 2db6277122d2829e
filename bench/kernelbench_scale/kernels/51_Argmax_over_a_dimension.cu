// argmax (int64 out [128, 4095]); the first index of the maximum, as torch over dim 1 of a [128, 4096, 4095] input: one thread per (batch, column),
// looping over the 4096 rows; neighbouring threads read neighbouring columns (coalesced).
extern "C" __global__ void reduce_dim1(const float* __restrict__ x, long long* __restrict__ out, long long batch,
                                       long long rows, long long cols) {
  long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long b = blockIdx.y;
  if (k >= cols || b >= batch) return;
  const float* p = x + b * rows * cols + k;
  float best = -3.402823466e+38f; long long idx = 0;
  for (long long j = 0; j < rows; ++j) {
    float v = p[j * cols];
    if (v > best) { best = v; idx = j; }
  }
  out[b * cols + k] = idx;
}
