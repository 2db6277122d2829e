// RMSNorm over dim 1 of a [112, 64, 512, 512] input, eps 1e-5.
// One thread per (batch, spatial position): the mean of squares over the 64
// features (stride = spatial size), then x / sqrt(mean + eps). Neighbouring
// threads read neighbouring positions (coalesced).
extern "C" __global__ void rmsnorm_dim1(const float* __restrict__ x, float* __restrict__ out, long long batch,
                                        long long features, long long spatial) {
  long long s = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long b = blockIdx.y;
  if (s >= spatial || b >= batch) return;
  const float* p = x + b * features * spatial + s;
  float* q = out + b * features * spatial + s;
  float acc = 0.0f;
  for (long long c = 0; c < features; ++c) {
    float v = p[c * spatial];
    acc += v * v;
  }
  float inv = 1.0f / sqrtf(acc / (float)features + 1e-5f);
  for (long long c = 0; c < features; ++c) q[c * spatial] = p[c * spatial] * inv;
}
