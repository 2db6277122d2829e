// A [2048, 1048576] times B [1048576, 1]: one block per row.
#define THREADS 1024
// One block per row of A: the dot product of the row with the vector B, in
// float per thread and a shared-memory tree across the block.
extern "C" __global__ void matvec(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ out,
                                  long long k) {
  __shared__ float red[THREADS];
  const float* a = A + (long long)blockIdx.x * k;
  float acc = 0.0f;
  for (long long j = threadIdx.x; j < k; j += THREADS) acc += a[j] * B[j];
  int t = threadIdx.x;
  red[t] = acc;
  __syncthreads();
  for (int s = THREADS / 2; s > 0; s >>= 1) {
    if (t < s) red[t] += red[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = red[0];
}
