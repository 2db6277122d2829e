// C = A @ B in fp32 (A, B, C: N x N row-major) by 3xTF32 on the tensor
// cores, as accurate as an fp32 GEMM: each operand is split into a tf32 part
// and a tf32 remainder (x = hi + lo), and C = A_hi B_hi + A_hi B_lo + A_lo B_hi
// (A_lo B_lo is below fp32 rounding). wgmma's tf32 operands must be K-major,
// so a split pass writes A_hi, A_lo (M x K) and B_hi, B_lo transposed (N x K)
// to scratch; the GEMM is then the bf16 kernel's pipeline in tf32: 3 stages
// of four 128 x 32 / 128 x 32 tiles, wgmma m64n128k8 three times per K step.
// Requires M % 128 == 0, N % 128 == 0, K % 32 == 0. Compiled for sm_90a.
// Hopper building blocks shared by the benchmark kernels: the tensor-map
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

// d += A * B: m64n128k8, A and B from shared memory (descriptors), both K-major.
__device__ __forceinline__ void wgmma_tf32_m64n128k8(float* d, unsigned long long da, unsigned long long db) {
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
               : "l"(da), "l"(db), "r"(1));
}

#define BM 128
#define BN 128
#define BK 32
#define STAGES 3
#define PROMOTE 2
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
        wgmma_tf32_m64n128k8(d, desc_k128(alo + 32 * k), desc_k128(bhi + 32 * k));
        wgmma_tf32_m64n128k8(d, desc_k128(ahi + 32 * k), desc_k128(blo + 32 * k));
        wgmma_tf32_m64n128k8(d, desc_k128(ahi + 32 * k), desc_k128(bhi + 32 * k));
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
