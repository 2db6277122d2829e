// A 16-byte-per-thread copy for tests/evaluator/gpu_fixtures/copy_large.py:
// the DRAM-bound kernel of `eval --profile` in bench/counters_device.sh.
extern "C" __global__ void copy4(const float4* __restrict__ x, float4* __restrict__ out, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x)
    out[i] = x[i];
}
