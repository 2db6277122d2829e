#!/usr/bin/env python3
"""Writes the two Hopper benchmark kernels of bench/hopper/ (run once; the .cu
files are committed). Generated only because a wgmma with 64 or 128 f32
accumulators takes that many asm operands, which are tedious and error-prone
to type; everything else is ordinary CUDA.

- gemm_bf16_tn.cu: C = A @ B^T, A (M, K) and B (N, K) bf16, fp32 accumulate,
  bf16 out. TMA loads (128B swizzle) into a 4-stage mbarrier pipeline, one
  producer warpgroup and two consumer warpgroups issuing wgmma m64n256k16.
- sgemm_3xtf32.cu: C = A @ B in fp32 (KernelBench level 1, problem 1) by
  3xTF32 on the tensor cores: a split pass writes A = A_hi + A_lo and
  B^T = B_hi^T + B_lo^T (each part rounded to tf32), then the same pipeline
  computes A_hi B_hi + A_hi B_lo + A_lo B_hi with wgmma m64n128k8 tf32.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON = r'''// Hopper building blocks shared by the benchmark kernels: the tensor-map
// type (no cuda.h under NVRTC), mbarriers, TMA loads and wgmma descriptors.
struct alignas(64) CUtensorMap { unsigned long long opaque[16]; };

__device__ __forceinline__ unsigned smem_u32(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(unsigned bar, unsigned parity) {
  unsigned ok;
  asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
               : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
  return ok;
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {}
}
// A 2-D box of `map` at {c0 (innermost), c1} into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const CUtensorMap* map, int c0, int c1, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(dst), "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// A K-major operand tile that TMA wrote with the 128B swizzle: rows of 128
// bytes, 8-row groups 1024 bytes apart (the stride byte offset); the leading
// byte offset is unused for this layout. The tile must be 1024-byte aligned.
__device__ __forceinline__ unsigned long long desc_k128(unsigned addr) {
  unsigned long long d = (unsigned long long)((addr & 0x3FFFF) >> 4);
  d |= 1ull << 16;
  d |= (unsigned long long)(1024 >> 4) << 32;
  d |= 1ull << 62;
  return d;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait1() { asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory"); }
// The tile of a grid of tiles this block computes: groups of GROUP rows of
// tiles, walked column by column, so blocks running together share A rows
// and B columns in L2.
__device__ __forceinline__ void tile_of(int b, int tiles_m, int tiles_n, int group, int* tm, int* tn) {
  int per_group = group * tiles_n;
  int first = (b / per_group) * group;
  int rows = min(tiles_m - first, group);
  int in = b % per_group;
  *tm = first + in % rows;
  *tn = in / rows;
}
'''


def wgmma_fn(name, shape, dtype, n_regs):
    ops = ", ".join("%%%d" % i for i in range(n_regs))
    outs = ", ".join('"+f"(d[%d])' % i for i in range(n_regs))
    # scale-d is a predicate (true: d += A * B); scale-a/b are +1; bf16 takes
    # two transpose flags as well (0: K-major), tf32 none (always K-major).
    return (
        "// d += A * B: %s, A and B from shared memory (descriptors), both K-major.\n"
        "__device__ __forceinline__ void %s(float* d, unsigned long long da, unsigned long long db) {\n"
        "  asm volatile(\"{\\n .reg .pred p;\\n setp.ne.b32 p, %%%d, 0;\\n\"\n"
        "               \" wgmma.mma_async.sync.aligned.%s.f32.%s.%s {%s}, %%%d, %%%d, p, 1, 1%s;\\n}\"\n"
        "               : %s\n"
        "               : \"l\"(da), \"l\"(db), \"r\"(1));\n"
        "}\n" % (shape, name, n_regs + 2, shape, dtype, dtype, ops, n_regs, n_regs + 1,
                 ", 0, 0" if dtype == "bf16" else "", outs))


GEMM_BF16 = r'''// C = A @ B^T (A: M x K, B: N x K, both bf16 row-major, C: M x N bf16),
// fp32 accumulate. A block computes a 128 x 256 tile of C: warpgroup 0
// produces (one thread issues the TMA loads of each 64-wide K slice into a
// 4-stage ring), warpgroups 1 and 2 consume (each a 64 x 256 half with
// wgmma m64n256k16, 128 fp32 accumulators per thread). Full barriers carry
// the bytes TMA delivered; empty barriers the two consumers' release.
// Requires M % 128 == 0, N % 256 == 0, K % 64 == 0. Compiled for sm_90a.
#include <cuda_bf16.h>
@COMMON@
@WGMMA@
#define BM 128
#define BN 256
#define BK 64
#define STAGES 4
#define A_BYTES (BM * BK * 2)
#define B_BYTES (BN * BK * 2)
#define STAGE_BYTES (A_BYTES + B_BYTES)

extern "C" __global__ void __launch_bounds__(384, 1)
gemm_bf16_tn(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
             __nv_bfloat16* __restrict__ C, int M, int N, int K) {
  extern __shared__ unsigned char smem_raw[];
  const unsigned base = (smem_u32(smem_raw) + 1023) & ~1023u;   // the 128B swizzle needs 1024-byte tiles
  const unsigned bars = base + STAGES * STAGE_BYTES;               // full[s], then empty[s]: 8 bytes each
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  int tm, tn;
  tile_of(blockIdx.x, M / BM, N / BN, 16, &tm, &tn);
  const int m0 = tm * BM, n0 = tn * BN, KT = K / BK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);                 // the producer's expect_tx arrival
      mbar_init(bars + 8 * (STAGES + s), 2);      // one arrival per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t == 0) {
      for (int kt = 0; kt < KT; ++kt) {
        const int s = kt % STAGES;
        if (kt >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) - 1) & 1);
        const unsigned full = bars + 8 * s, a = base + s * STAGE_BYTES;
        mbar_expect_tx(full, STAGE_BYTES);
        tma_load_2d(a, &tmA, kt * BK, m0, full);
        tma_load_2d(a + A_BYTES, &tmB, kt * BK, n0, full);
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.f;
    for (int kt = 0; kt < KT; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
      const unsigned a = base + s * STAGE_BYTES + (wg - 1) * (64 * BK * 2), b = base + s * STAGE_BYTES + A_BYTES;
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < BK / 16; ++k) wgmma_bf16_m64n256k16(d, desc_k128(a + 32 * k), desc_k128(b + 32 * k));
      wgmma_commit();
@RELEASE@
    }
@DRAIN@
    // Accumulator layout (m64nNk16, f32): warp w of the warpgroup holds rows
    // 16w + lane/4 and +8; register 4j + {0,1} columns 8j + 2(lane%4) + {0,1}.
    const int w = t / 32, l = t % 32;
    const int r = m0 + (wg - 1) * 64 + 16 * w + l / 4;
    __nv_bfloat16* c0 = C + (long long)r * N + n0 + 2 * (l % 4);
    __nv_bfloat16* c8 = c0 + 8LL * N;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      *reinterpret_cast<__nv_bfloat162*>(c0 + 8 * j) = __floats2bfloat162_rn(d[4 * j], d[4 * j + 1]);
      *reinterpret_cast<__nv_bfloat162*>(c8 + 8 * j) = __floats2bfloat162_rn(d[4 * j + 2], d[4 * j + 3]);
    }
  }
}
'''

GEMM_PLAN = '''{
  "tensor_maps": [
    {"name": "tmA", "tensor": "A", "box": [64, 128], "swizzle": "128B", "l2_promotion": "256B"},
    {"name": "tmB", "tensor": "B", "box": [64, 256], "swizzle": "128B", "l2_promotion": "256B"}
  ],
  "launches": [
    {"kernel": "gemm_bf16_tn", "grid": ["(A.shape[0] / 128) * (B.shape[0] / 256)"], "block": [384],
     "shared_bytes": "4 * (128 * 64 * 2 + 256 * 64 * 2) + 1024 + 64",
     "args": ["tmA", "tmB", "out", "A.shape[0]", "B.shape[0]", "A.shape[1]"]}
  ]
}
'''

SGEMM = r'''// C = A @ B in fp32 (A, B, C: N x N row-major) by 3xTF32 on the tensor
// cores, as accurate as an fp32 GEMM: each operand is split into a tf32 part
// and a tf32 remainder (x = hi + lo), and C = A_hi B_hi + A_hi B_lo + A_lo B_hi
// (A_lo B_lo is below fp32 rounding). wgmma's tf32 operands must be K-major,
// so a split pass writes A_hi, A_lo (M x K) and B_hi, B_lo transposed (N x K)
// to scratch; the GEMM is then the bf16 kernel's pipeline in tf32: 3 stages
// of four 128 x 32 / 128 x 32 tiles, wgmma m64n128k8 three times per K step.
// Requires M % 128 == 0, N % 128 == 0, K % 32 == 0. Compiled for sm_90a.
@COMMON@
@WGMMA@
#define BM 128
#define BN 128
#define BK 32
#define STAGES 3
#define PROMOTE @PROMOTE@
#define TILE_BYTES (128 * BK * 4)
#define STAGE_BYTES (4 * TILE_BYTES)

__device__ __forceinline__ float to_tf32(float x) {
  unsigned r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return __uint_as_float(r);
}

// A (rows x cols) -> hi, lo (same layout).
extern "C" __global__ void split_rows(const float4* __restrict__ a, float4* __restrict__ hi, float4* __restrict__ lo,
                                      long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4; i += (long long)gridDim.x * blockDim.x) {
    float4 v = a[i], h, l;
    h.x = to_tf32(v.x); l.x = to_tf32(v.x - h.x);
    h.y = to_tf32(v.y); l.y = to_tf32(v.y - h.y);
    h.z = to_tf32(v.z); l.z = to_tf32(v.z - h.z);
    h.w = to_tf32(v.w); l.w = to_tf32(v.w - h.w);
    hi[i] = h;
    lo[i] = l;
  }
}

// B (K x N) -> hi^T, lo^T (N x K), 32 x 32 tiles through shared memory.
extern "C" __global__ void split_transpose(const float* __restrict__ b, float* __restrict__ hi, float* __restrict__ lo,
                                           int K, int N) {
  __shared__ float tile[32][33];
  const int k0 = blockIdx.y * 32, n0 = blockIdx.x * 32;
  for (int i = threadIdx.y; i < 32; i += blockDim.y) tile[i][threadIdx.x] = b[(long long)(k0 + i) * N + n0 + threadIdx.x];
  __syncthreads();
  for (int i = threadIdx.y; i < 32; i += blockDim.y) {
    float v = tile[threadIdx.x][i], h = to_tf32(v);
    long long o = (long long)(n0 + i) * K + k0 + threadIdx.x;
    hi[o] = h;
    lo[o] = to_tf32(v - h);
  }
}

extern "C" __global__ void __launch_bounds__(384, 1)
sgemm_3xtf32(const __grid_constant__ CUtensorMap tmAhi, const __grid_constant__ CUtensorMap tmAlo,
             const __grid_constant__ CUtensorMap tmBhi, const __grid_constant__ CUtensorMap tmBlo,
             float* __restrict__ C, int M, int N, int K) {
  extern __shared__ unsigned char smem_raw[];
  const unsigned base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const unsigned bars = base + STAGES * STAGE_BYTES;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128;
  int tm, tn;
  tile_of(blockIdx.x, M / BM, N / BN, 16, &tm, &tn);
  const int m0 = tm * BM, n0 = tn * BN, KT = K / BK;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8 * s, 1);
      mbar_init(bars + 8 * (STAGES + s), 2);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
    if (t == 0) {
      for (int kt = 0; kt < KT; ++kt) {
        const int s = kt % STAGES;
        if (kt >= STAGES) mbar_wait(bars + 8 * (STAGES + s), ((kt / STAGES) - 1) & 1);
        const unsigned full = bars + 8 * s, p = base + s * STAGE_BYTES;
        mbar_expect_tx(full, STAGE_BYTES);
        tma_load_2d(p, &tmAhi, kt * BK, m0, full);
        tma_load_2d(p + TILE_BYTES, &tmAlo, kt * BK, m0, full);
        tma_load_2d(p + 2 * TILE_BYTES, &tmBhi, kt * BK, n0, full);
        tma_load_2d(p + 3 * TILE_BYTES, &tmBlo, kt * BK, n0, full);
      }
    }
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    // The tensor cores' fp32 accumulation drops low bits on each add (seen on
    // the H100: over all of K = 4096 the error grew to 4.3e-5 of the norm, 3x
    // the fp32 bound, always in one direction). So wgmma sums only PROMOTE K
    // steps into d, which is then added into acc by ordinary rounded fp32 adds.
    float d[64], acc[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = acc[i] = 0.f;
    for (int kt = 0; kt < KT; ++kt) {
      const int s = kt % STAGES;
      mbar_wait(bars + 8 * s, (kt / STAGES) & 1);
      const unsigned p = base + s * STAGE_BYTES, half = (wg - 1) * (64 * BK * 4);
      const unsigned ahi = p + half, alo = p + TILE_BYTES + half, bhi = p + 2 * TILE_BYTES, blo = p + 3 * TILE_BYTES;
      wgmma_fence();
#pragma unroll
      for (int k = 0; k < BK / 8; ++k) {
        // The small products first: they are added before the large one grows the sum.
@PRODUCTS@
      }
      wgmma_commit();
      wgmma_wait0();
      if (t == 0) mbar_arrive(bars + 8 * (STAGES + s));
      if ((kt + 1) % PROMOTE == 0 || kt == KT - 1) {
#pragma unroll
        for (int i = 0; i < 64; ++i) {
          acc[i] += d[i];
          d[i] = 0.f;
        }
      }
    }
    const int w = t / 32, l = t % 32;
    const int r = m0 + (wg - 1) * 64 + 16 * w + l / 4;
    float* c0 = C + (long long)r * N + n0 + 2 * (l % 4);
    float* c8 = c0 + 8LL * N;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      *reinterpret_cast<float2*>(c0 + 8 * j) = make_float2(acc[4 * j], acc[4 * j + 1]);
      *reinterpret_cast<float2*>(c8 + 8 * j) = make_float2(acc[4 * j + 2], acc[4 * j + 3]);
    }
  }
}
'''

SGEMM_PLAN = '''{
  "scratch": [
    {"name": "a_hi", "bytes": "A.numel * 4"}, {"name": "a_lo", "bytes": "A.numel * 4"},
    {"name": "bt_hi", "bytes": "B.numel * 4"}, {"name": "bt_lo", "bytes": "B.numel * 4"}
  ],
  "tensor_maps": [
    {"name": "tmAhi", "tensor": "a_hi", "dtype": "tfloat32", "dims": ["A.shape[1]", "A.shape[0]"], "box": [32, 128], "swizzle": "128B", "l2_promotion": "256B"},
    {"name": "tmAlo", "tensor": "a_lo", "dtype": "tfloat32", "dims": ["A.shape[1]", "A.shape[0]"], "box": [32, 128], "swizzle": "128B", "l2_promotion": "256B"},
    {"name": "tmBhi", "tensor": "bt_hi", "dtype": "tfloat32", "dims": ["B.shape[0]", "B.shape[1]"], "box": [32, 128], "swizzle": "128B", "l2_promotion": "256B"},
    {"name": "tmBlo", "tensor": "bt_lo", "dtype": "tfloat32", "dims": ["B.shape[0]", "B.shape[1]"], "box": [32, 128], "swizzle": "128B", "l2_promotion": "256B"}
  ],
  "launches": [
    {"kernel": "split_rows", "grid": [1056], "block": [256], "args": ["A", "a_hi", "a_lo", "A.numel / 4"]},
    {"kernel": "split_transpose", "grid": ["B.shape[1] / 32", "B.shape[0] / 32"], "block": [32, 8],
     "args": ["B", "bt_hi", "bt_lo", "B.shape[0]", "B.shape[1]"]},
    {"kernel": "sgemm_3xtf32", "grid": ["(A.shape[0] / 128) * (B.shape[1] / 128)"], "block": [384],
     "shared_bytes": "3 * 4 * 128 * 32 * 4 + 1024 + 64",
     "args": ["tmAhi", "tmAlo", "tmBhi", "tmBlo", "out", "A.shape[0]", "B.shape[1]", "A.shape[1]"]}
  ]
}
'''


# How a consumer gives a stage back. "wait0": after each K step, wait for its
# wgmmas and release its stage (the tensor cores idle while the next step is
# issued). "wait1": keep one step's group in flight; once the previous step's
# group is done, release the previous stage.
RELEASE = {
    "wait0": ("      wgmma_wait0();\n      if (t == 0) mbar_arrive(bars + 8 * (STAGES + s));", ""),
    "wait1": ("      wgmma_wait1();\n"
              "      if (kt > 0 && t == 0) mbar_arrive(bars + 8 * (STAGES + (kt - 1) % STAGES));",
              "    wgmma_wait0();"),
}


THREE_PRODUCTS = """        wgmma_tf32_m64n128k8(d, desc_k128(alo + 32 * k), desc_k128(bhi + 32 * k));
        wgmma_tf32_m64n128k8(d, desc_k128(ahi + 32 * k), desc_k128(blo + 32 * k));
        wgmma_tf32_m64n128k8(d, desc_k128(ahi + 32 * k), desc_k128(bhi + 32 * k));"""
# Diagnostic only (plain TF32, to show what the two small products buy).
ONE_PRODUCT = """        wgmma_tf32_m64n128k8(d, desc_k128(ahi + 32 * k), desc_k128(bhi + 32 * k));"""


def kernel(template, wgmma, release, group=16, promote=2, products=THREE_PRODUCTS):
    rel, drain = RELEASE[release]
    return (template.replace("@PROMOTE@", str(promote)).replace("@PRODUCTS@", products).replace("@COMMON@", COMMON).replace("@WGMMA@", wgmma).replace("@RELEASE@", rel)
            .replace("@DRAIN@", drain).replace("STAGES, 16, &tm", "STAGES, %d, &tm" % group)
            .replace("M / BM, N / BN, 16, &tm", "M / BM, N / BN, %d, &tm" % group))


def write(name, text):
    with open(os.path.join(HERE, name), "w") as f:
        f.write(text)


BF16_WGMMA = wgmma_fn("wgmma_bf16_m64n256k16", "m64n256k16", "bf16", 128)
TF32_WGMMA = wgmma_fn("wgmma_tf32_m64n128k8", "m64n128k8", "tf32", 64)
# wait1 with groups of 8 and wait0 with 16 ran alike on the H100 (1.48-1.49 ms).
write("gemm_bf16_tn.cu", kernel(GEMM_BF16, BF16_WGMMA, "wait1", 8))
write("gemm_bf16_tn.json", GEMM_PLAN)
write("sgemm_3xtf32.cu", kernel(SGEMM, TF32_WGMMA, "wait0", 16, 2))
write("sgemm_3xtf32.json", SGEMM_PLAN)
# Variants for tuning runs (bench/hopper/variants/, git-ignored): `kernelsearch
# eval PROBLEM variants/bf16` judges them all against one reference.
if os.environ.get("KS_VARIANTS"):
    d = os.path.join(HERE, "variants", "fp32")
    os.makedirs(d, exist_ok=True)
    for promote in (1, 2, 4):
        for group in (8, 16):
            v = "sgemm_3xtf32_p%d_g%d" % (promote, group)
            write(os.path.join(d, v + ".cu"), kernel(SGEMM, TF32_WGMMA, "wait0", group, promote))
            write(os.path.join(d, v + ".json"), SGEMM_PLAN)
    write(os.path.join(d, "sgemm_1xtf32_p2_diag.cu"), kernel(SGEMM, TF32_WGMMA, "wait0", 16, 2, ONE_PRODUCT))
    write(os.path.join(d, "sgemm_1xtf32_p2_diag.json"), SGEMM_PLAN)
