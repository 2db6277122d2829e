// Naive elementwise GELU (tanh approximation): one thread per element, scalar loads and stores.
extern "C" __global__ void gelu_tanh_naive(const float* __restrict__ x, float* __restrict__ out, int n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v = x[i];
  const float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
  const float kKappa = 0.044715f;
  float inner = kBeta * (v + kKappa * v * v * v);
  out[i] = 0.5f * v * (1.0f + tanhf(inner));
}
