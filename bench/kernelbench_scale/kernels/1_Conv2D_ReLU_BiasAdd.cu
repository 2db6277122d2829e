// Conv2d 64 -> 128 channels, 3x3 (+ conv bias), ReLU, + bias [128, 1, 1], on
// [128, 64, 128, 128]: a direct convolution with the chain in its epilogue.
#define OCB 8
// Direct 3x3 convolution, stride 1, no padding. grid: (cdiv(OW, 128), OH,
// N * OC / OCB); each thread computes OCB output channels of one output pixel,
// reusing each input value OCB times; the block's threads share the weights
// (broadcast reads).
extern "C" __global__ void conv3x3(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                                   int N, int C, int H, int W, int OC, const float* __restrict__ conv_bias, const float* __restrict__ bias) {
  int OH = H - 2, OW = W - 2;
  int ow = blockIdx.x * blockDim.x + threadIdx.x;
  int oh = blockIdx.y;
  int groups = OC / OCB;
  int n = blockIdx.z / groups, oc0 = (blockIdx.z % groups) * OCB;
  if (ow >= OW) return;
  float acc[OCB] = {};
  for (int c = 0; c < C; ++c) {
    const float* xp = x + (((long long)n * C + c) * H + oh) * W + ow;
#pragma unroll
    for (int kh = 0; kh < 3; ++kh) {
#pragma unroll
      for (int kw = 0; kw < 3; ++kw) {
        float v = xp[kh * W + kw];
#pragma unroll
        for (int o = 0; o < OCB; ++o) acc[o] = fmaf(v, w[(((long long)(oc0 + o) * C + c) * 3 + kh) * 3 + kw], acc[o]);
      }
    }
  }
#pragma unroll
  for (int o = 0; o < OCB; ++o) {
    int oc = oc0 + o;
    float v = acc[o];
    out[(((long long)n * OC + oc) * OH + oh) * OW + ow] = fmaxf(v + conv_bias[oc], 0.0f) + bias[oc];
  }
}
