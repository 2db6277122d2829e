// Naive transpose: one thread per output element; writes are coalesced, reads stride
// through x by a whole row per thread (no shared-memory tiling).
// x: [R][C], out: [C][R].
extern "C" __global__ void transpose_naive(const float* __restrict__ x, float* __restrict__ out, int R, int C) {
  long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long long)R * C) return;
  long long i = idx / R;  // output row = input column
  long long j = idx % R;  // output column = input row
  out[idx] = x[j * C + i];
}
