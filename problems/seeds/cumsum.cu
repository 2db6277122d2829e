// Naive row-wise inclusive scan: one thread per row, a sequential running sum along the row
// (neighbouring threads touch addresses a whole row apart: uncoalesced).
extern "C" __global__ void cumsum_rows_naive(const float* __restrict__ x, float* __restrict__ out,
                                             int rows, int cols) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float* xr = x + (long long)row * cols;
  float* yr = out + (long long)row * cols;
  float acc = 0.0f;
  for (int j = 0; j < cols; ++j) {
    acc += xr[j];
    yr[j] = acc;
  }
}
