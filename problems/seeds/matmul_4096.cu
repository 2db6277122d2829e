// Naive fp32 matmul: one thread per output element C[row][col], a plain dot-product loop
// over K reading A and B straight from global memory (no tiling, no shared memory).
extern "C" __global__ void matmul_naive(const float* __restrict__ A, const float* __restrict__ B,
                                        float* __restrict__ C, int M, int N, int K) {
  int col = blockIdx.x * blockDim.x + threadIdx.x;
  int row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) {
    acc += A[(long long)row * K + k] * B[(long long)k * N + col];
  }
  C[(long long)row * N + col] = acc;
}
