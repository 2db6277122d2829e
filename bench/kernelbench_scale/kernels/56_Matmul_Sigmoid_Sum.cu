// Linear (32768 -> 32768, batch 128), sigmoid, sum over dim 1: the GEMM (+ bias)
// into scratch, then one block per row sums the sigmoids.
#define BM 64
#define BN 64
#define BK 16
// A 64x64 output tile per block of 256 threads, each thread 4x4 outputs; the
// K loop stages 64x16 tiles of both operands in shared memory. fp32 throughout
// (torch computes the reference with TF32 off).
extern "C" __global__ void gemm(const float* __restrict__ X, const float* __restrict__ W, float* __restrict__ C,
                                int M, int N, int K, const float* __restrict__ bias) {
  __shared__ float Xs[BK][BM + 1];
  __shared__ float Ws[BK][BN + 1];
  int tid = threadIdx.x;
  int tx = tid % 16, ty = tid / 16;
  int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  float acc[4][4] = {};
  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int i = tid; i < BM * BK; i += 256) {
      int r = i / BK, c = i % BK;
      int m = m0 + r, k = k0 + c;
      Xs[c][r] = (m < M && k < K) ? X[(long long)m * K + k] : 0.0f;
    }
    // W tile: 64 columns (n) x 16 k, read along k (W is [N, K]).
    for (int i = tid; i < BN * BK; i += 256) {
      int r = i / BK, c = i % BK;  // r: n within the tile, c: k within the tile
      int n = n0 + r, k = k0 + c;
      Ws[c][r] = (n < N && k < K) ? W[(long long)n * K + k] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = Xs[kk][ty + 16 * i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = Ws[kk][tx + 16 * j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
      if (m < M && n < N) {
        float v = acc[i][j];
        C[(long long)m * N + n] = v + bias[n];
      }
    }
  }
}

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

// One block per row of the [M, N] product: the sum of sigmoid(v), each
// sigmoid in float (expf, as torch computes it), the sum in double. (A double
// exp per element is the suspect for the 0.7 s this kernel took on the H100.)
extern "C" __global__ void sigmoid_row_sum(const float* __restrict__ y, float* __restrict__ out, long long n) {
  __shared__ double red[THREADS];
  const float* r = y + (long long)blockIdx.x * n;
  double acc = 0.0;
  for (long long j = threadIdx.x; j < n; j += THREADS) acc += (double)(1.0f / (1.0f + expf(-r[j])));
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) out[blockIdx.x] = (float)acc;
}
