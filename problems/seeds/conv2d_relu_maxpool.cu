// Two naive kernels: (1) direct convolution + bias + ReLU, one thread per conv output element,
// written to a scratch buffer; (2) max pooling, one thread per pooled output element.
extern "C" __global__ void conv2d_relu_naive(const float* __restrict__ x, const float* __restrict__ w,
                                             const float* __restrict__ bias, float* __restrict__ y,
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
  y[idx] = acc > 0.0f ? acc : 0.0f;
}

// y: planes x IH x IW, out: planes x PH x PW; window pk x pk, stride ps, no padding (floor mode).
extern "C" __global__ void maxpool2d_naive(const float* __restrict__ y, float* __restrict__ out,
                                           int planes, int IH, int IW, int PH, int PW, int pk, int ps) {
  long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long total = (long long)planes * PH * PW;
  if (idx >= total) return;
  int pw = (int)(idx % PW);
  int ph = (int)((idx / PW) % PH);
  long long plane = idx / ((long long)PW * PH);
  const float* src = y + plane * IH * IW;
  float m = src[(long long)(ph * ps) * IW + pw * ps];
  for (int r = 0; r < pk; ++r) {
    for (int s = 0; s < pk; ++s) {
      float v = src[(long long)(ph * ps + r) * IW + (pw * ps + s)];
      m = v > m ? v : m;
    }
  }
  out[idx] = m;
}
