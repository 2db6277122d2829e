// Naive bf16 attention: one thread per query row. Each thread streams over all keys with an
// online softmax (running max, running sum, 64-wide fp32 accumulator in registers), reading
// K and V straight from global memory. No tiling, no shared memory, no tensor cores.
// q, k, v, out: [BH][S][HEAD_DIM] contiguous; HEAD_DIM is fixed at 64.
#include <cuda_bf16.h>
#define HEAD_DIM 64

extern "C" __global__ void attention_naive(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                                           const __nv_bfloat16* __restrict__ v, __nv_bfloat16* __restrict__ out,
                                           int BH, int S) {
  long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (long long)BH * S) return;
  long long bh = idx / S;
  const float scale = 1.0f / sqrtf((float)HEAD_DIM);

  float qr[HEAD_DIM];
  float acc[HEAD_DIM];
  const __nv_bfloat16* qp = q + idx * HEAD_DIM;
  for (int d = 0; d < HEAD_DIM; ++d) {
    qr[d] = __bfloat162float(qp[d]);
    acc[d] = 0.0f;
  }
  float m = -3.402823466e+38f;  // running max (-FLT_MAX)
  float l = 0.0f;               // running sum of exp(s - m)

  const __nv_bfloat16* kb = k + bh * S * HEAD_DIM;
  const __nv_bfloat16* vb = v + bh * S * HEAD_DIM;
  for (int j = 0; j < S; ++j) {
    const __nv_bfloat16* kj = kb + (long long)j * HEAD_DIM;
    float s = 0.0f;
    for (int d = 0; d < HEAD_DIM; ++d) s += qr[d] * __bfloat162float(kj[d]);
    s *= scale;
    float m_new = fmaxf(m, s);
    float corr = expf(m - m_new);
    float p = expf(s - m_new);
    l = l * corr + p;
    const __nv_bfloat16* vj = vb + (long long)j * HEAD_DIM;
    for (int d = 0; d < HEAD_DIM; ++d) acc[d] = acc[d] * corr + p * __bfloat162float(vj[d]);
    m = m_new;
  }
  float inv = 1.0f / l;
  __nv_bfloat16* op = out + idx * HEAD_DIM;
  for (int d = 0; d < HEAD_DIM; ++d) op[d] = __float2bfloat16_rn(acc[d] * inv);
}
