// A row softmax kernel for GPU tests (one block per row, warp-shuffle
// reductions); its last argument is how many columns it writes, so that a
// plan passing cols - 1 makes a wrong kernel of the same source.
#pragma once

namespace ks::testing {

inline constexpr const char* kSoftmax = R"CUDA(
__device__ float BlockReduce(float v, bool is_max, float* red) {
  for (int o = 16; o; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : (is_max ? -INFINITY : 0.f);
    for (int o = 16; o; o >>= 1) {
      float w = __shfl_xor_sync(0xffffffffu, v, o);
      v = is_max ? fmaxf(v, w) : v + w;
    }
    if (threadIdx.x == 0) red[0] = v;
  }
  __syncthreads();
  float r = red[0];
  __syncthreads();
  return r;
}
extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ out, int cols, int last) {
  __shared__ float red[32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float* orow = out + (size_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, row[i]);
  m = BlockReduce(m, true, red);
  float s = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += expf(row[i] - m);
  s = BlockReduce(s, false, red);
  float inv = 1.f / s;
  for (int i = threadIdx.x; i < last; i += blockDim.x) orow[i] = expf(row[i] - m) * inv;
}
)CUDA";

}  // namespace ks::testing
