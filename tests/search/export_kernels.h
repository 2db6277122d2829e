// Known-correct kernels for the export tests (tests/evaluator/gpu_fixtures
// problems), with plans that use what an export must reproduce: several
// launches, a scratch buffer, int32 and int64 parameters, a float literal, a
// parameter tensor, dynamic shared memory over 48 KiB and a thread-block cluster.
#pragma once

namespace ks::testing {

// layernorm_small.py: LayerNorm(1024) over rows of x. Two launches: row
// statistics (mean, 1/std, two-pass) into a scratch buffer, then an
// elementwise normalize over x.numel (an int64 parameter).
inline constexpr const char* kLayerNormSource = R"CUDA(
__device__ float block_sum(float v, float* red) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();  // red is reused by the next call
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = 0.f;
  for (int i = 0; i < blockDim.x / 32; ++i) r += red[i];
  return r;
}

extern "C" __global__ void row_stats(const float* __restrict__ x, float* __restrict__ stats, int cols, float eps) {
  __shared__ float red[32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float s = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) s += row[i];
  float mean = block_sum(s, red) / cols;
  float ss = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) { float d = row[i] - mean; ss += d * d; }
  float var = block_sum(ss, red) / cols;
  if (threadIdx.x == 0) {
    stats[2 * blockIdx.x] = mean;
    stats[2 * blockIdx.x + 1] = rsqrtf(var + eps);
  }
}

extern "C" __global__ void normalize(const float* __restrict__ x, const float* __restrict__ stats,
                                     const float* __restrict__ w, const float* __restrict__ b,
                                     float* __restrict__ out, long long n, int cols) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i >= n) return;
  long long row = i / cols;
  int c = (int)(i % cols);
  out[i] = (x[i] - stats[2 * row]) * stats[2 * row + 1] * w[c] + b[c];
}
)CUDA";

inline constexpr const char* kLayerNormPlan = R"J({"launches": [
  {"kernel": "row_stats", "grid": ["x.shape[0]"], "block": [256], "args": ["x", "stats", "x.shape[1]", "0.00001"]},
  {"kernel": "normalize", "grid": ["cdiv(x.numel, 256)"], "block": [256],
   "args": ["x", "stats", "ln.weight", "ln.bias", "out", "x.numel", "x.shape[1]"]}],
 "scratch": [{"name": "stats", "bytes": "x.shape[0] * 8"}]})J";

// softmax_small.py: softmax over rows, one block per row, the row cached in
// dynamic shared memory. The plan asks for 4x the row (64 KiB at 4096 columns,
// over the 48 KiB default) and, on Hopper, clusters of 2 blocks.
inline constexpr const char* kSoftmaxSource = R"CUDA(
__device__ float block_reduce(float v, bool is_max, float* red) {
  for (int o = 16; o; o >>= 1) {
    float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  __syncthreads();  // red is reused by the next call
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = is_max ? -INFINITY : 0.f;
  for (int i = 0; i < blockDim.x / 32; ++i) r = is_max ? fmaxf(r, red[i]) : r + red[i];
  return r;
}

extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ out, int cols) {
  extern __shared__ float cache[];
  __shared__ float red[32];
  const float* row = x + (size_t)blockIdx.x * cols;
  float m = -INFINITY;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) { float v = row[i]; cache[i] = v; m = fmaxf(m, v); }
  m = block_reduce(m, true, red);
  float s = 0.f;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) { float e = expf(cache[i] - m); cache[i] = e; s += e; }
  float inv = 1.f / block_reduce(s, false, red);
  float* orow = out + (size_t)blockIdx.x * cols;
  for (int i = threadIdx.x; i < cols; i += blockDim.x) orow[i] = cache[i] * inv;
}
)CUDA";

inline constexpr const char* kSoftmaxClusterPlan = R"({"launches": [
  {"kernel": "softmax_rows", "grid": ["x.shape[0]"], "block": [256], "shared_bytes": "x.shape[1] * 16",
   "cluster": [2, 1, 1], "args": ["x", "out", "x.shape[1]"]}]})";
inline constexpr const char* kSoftmaxPlan = R"({"launches": [
  {"kernel": "softmax_rows", "grid": ["x.shape[0]"], "block": [256], "shared_bytes": "x.shape[1] * 16",
   "args": ["x", "out", "x.shape[1]"]}]})";

}  // namespace ks::testing
