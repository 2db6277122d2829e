// Naive direct convolution (NCHW, fp32): one thread per output element (n, k, oh, ow),
// looping over input channels and the R x S window with zero padding by bounds checks.
extern "C" __global__ void conv2d_naive(const float* __restrict__ x, const float* __restrict__ w,
                                        const float* __restrict__ bias, float* __restrict__ out,
                                        int N, int C, int H, int W, int K, int R, int S,
                                        int OH, int OW, int stride, int pad) {
  long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long total = (long long)N * K * OH * OW;
  if (idx >= total) return;
  int ow = (int)(idx % OW);
  int oh = (int)((idx / OW) % OH);
  int k = (int)((idx / ((long long)OW * OH)) % K);
  int n = (int)(idx / ((long long)OW * OH * K));
  float acc = bias[k];
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) {
      int ih = oh * stride - pad + r;
      if (ih < 0 || ih >= H) continue;
      for (int s = 0; s < S; ++s) {
        int iw = ow * stride - pad + s;
        if (iw < 0 || iw >= W) continue;
        acc += x[(((long long)n * C + c) * H + ih) * W + iw] * w[(((long long)k * C + c) * R + r) * S + s];
      }
    }
  }
  out[idx] = acc;
}
