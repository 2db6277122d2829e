// Swish: x * sigmoid(x), one element per thread iteration (grid-stride loop, 64-bit index:
// x has 1.6e9 elements). Simple and memory-bound; no vectorization.
extern "C" __global__ void elementwise(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = x[i];
    out[i] = v / (1.0f + expf(-v));
  }
}
