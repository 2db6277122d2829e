// Internal to the GPU evaluator (gpu_evaluator.cc: setup, arena layout and
// the evaluation of a candidate; gpu_evaluator_runs.cc: the worker and one
// run; gpu_evaluator_verify.cc: output and integrity checks; arena.cc: the
// arena's layout and staging): the arena's constants, the trusted helper kernels, and small helpers they share.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "evaluator/evaluation.h"
#include "evaluator/signature.h"
#include "evaluator/worker/worker_protocol.h"

namespace ks::gpu_internal {


inline constexpr uint64_t kAlign = 256;
inline constexpr uint64_t kGuard = 64 * 1024;
inline constexpr uint8_t kGuardByte = 0xCD;
// The arena is a whole number of the driver's 2 MiB pages (the worker maps all of it).
inline constexpr uint64_t kArenaPage = 2u << 20;

inline uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// GPU time queued ahead of every run's start event (timing.py PAD_US, the same).
inline constexpr uint64_t kTimingPadNs = 100000;

// Comparison and integrity kernels of the trusted side. They read candidate
// outputs and reference outputs, both in this process's context.
inline constexpr const char* kHelperSource = R"CUDA(
#include <cuda_fp16.h>
#include <cuda_bf16.h>
struct Stats {
  unsigned long long mismatches, first, unwritten, nonfinite;
  double sum_sq_diff, sum_sq_ref;
  unsigned int max_abs_bits, max_rel_bits;
  unsigned long long considered, large, hash;
};
// An order-independent hash of a buffer's bits: the sum of a mix of (index,
// bits) under a key the evaluator draws at random and never shows a
// candidate, so no kernel can make two different buffers hash the same on
// purpose (the hash stands for a full comparison: GpuEvaluator::CheckRun).
struct HashKey { unsigned long long a, b; };
__device__ __forceinline__ unsigned long long Mix(unsigned long long i, unsigned long long b, HashKey k) {
  // Two multiplies (a multi-GB buffer is hashed at memory speed): the key
  // makes each term unpredictable, which is all an additive hash needs here.
  unsigned long long z = ((i + k.a) * 0x9E3779B97F4A7C15ull) ^ (b + k.b);
  z = (z ^ (z >> 32)) * 0xD6E8FEB86659FD93ull;
  return z ^ (z >> 29);
}
__device__ __forceinline__ double Val(const float* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ double Val(const double* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ double Val(const __half* p, unsigned long long i) { return __half2float(p[i]); }
__device__ __forceinline__ double Val(const __nv_bfloat16* p, unsigned long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ double Val(const int* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ double Val(const long long* p, unsigned long long i) { return (double)p[i]; }
__device__ __forceinline__ double Val(const signed char* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ double Val(const unsigned char* p, unsigned long long i) { return p[i]; }

// One element's part of Compare (the running figures in `a`).
struct CmpAcc {
  unsigned long long mism, first, unw, nonf, cons, large, hash;
  double ssd, ssr;
  float mabs, mrel;
};
template <typename T, typename B>
__device__ __forceinline__ void CompareOne(unsigned long long i, B bits, double r, double atol, double rtol, double tiny,
                                           double large_rel, B poison, const float* bound, HashKey key, CmpAcc& a) {
  T tv;
  memcpy(&tv, &bits, sizeof(T));
  const double o = Val(&tv, 0);
  a.hash += Mix(i, (unsigned long long)bits, key);
  bool bad = false;
  if (bits == poison) { ++a.unw; bad = true; }
  else if (isnan(r)) bad = !isnan(o);
  else if (isinf(r)) bad = o != r;
  else if (!isfinite(o)) { bad = true; ++a.nonf; }
  else {
    double d = fabs(o - r);
    a.ssd += d * d;
    a.ssr += r * r;
    a.mabs = fmaxf(a.mabs, (float)d);
    // A figure to report, never a verdict: divided in float (no FP64 division per element).
    a.mrel = fmaxf(a.mrel, (float)d / fmaxf((float)fabs(r), 1e-30f));
    const double b = bound ? (double)bound[i >> 8] : 0.0;
    bad = d > atol + rtol * fabs(r) + b;
    if (fabs(r) >= tiny) {
      ++a.cons;
      if (d > large_rel * fabs(r) && d > b) ++a.large;
    }
  }
  if (bad) { ++a.mism; if (i < a.first) a.first = i; }
}

// tiny: |ref| below it is not "considered" for the large-error share; large_rel:
// the relative error that counts as large (Tolerance in evaluator/signature.h).
// bound: null, or per block of 256 elements what the element may add to
// atol + rtol * |ref| (the contract's factor times PyTorch's own error there
// against float64; evaluator/judge/judge.h); an element within it is never a
// large error either. Four elements per step, their loads issued together
// (a multi-GB output is compared at memory speed, issue 33).
template <typename T, typename B>
__device__ void Compare(const T* out, const T* ref, unsigned long long n, double atol, double rtol, double tiny,
                        double large_rel, B poison, const float* bound, HashKey key, Stats* st) {
  CmpAcc a = {0, ~0ull, 0, 0, 0, 0, 0, 0.0, 0.0, 0.f, 0.f};
  const B* ob = reinterpret_cast<const B*>(out);
  const unsigned long long S = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  for (; i + 3 * S < n; i += 4 * S) {
    B bits[4];
    double r[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      bits[k] = ob[i + k * S];
      r[k] = Val(ref, i + k * S);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k)
      CompareOne<T, B>(i + k * S, bits[k], r[k], atol, rtol, tiny, large_rel, poison, bound, key, a);
  }
  for (; i < n; i += S) CompareOne<T, B>(i, ob[i], Val(ref, i), atol, rtol, tiny, large_rel, poison, bound, key, a);
  unsigned long long mism = a.mism, first = a.first, unw = a.unw, nonf = a.nonf, cons = a.cons, large = a.large,
                     hash = a.hash;
  double ssd = a.ssd, ssr = a.ssr;
  float mabs = a.mabs, mrel = a.mrel;
  for (int off = 16; off > 0; off >>= 1) {
    mism += __shfl_down_sync(0xffffffffu, mism, off);
    unsigned long long f2 = __shfl_down_sync(0xffffffffu, first, off);
    first = f2 < first ? f2 : first;
    unw += __shfl_down_sync(0xffffffffu, unw, off);
    nonf += __shfl_down_sync(0xffffffffu, nonf, off);
    ssd += __shfl_down_sync(0xffffffffu, ssd, off);
    ssr += __shfl_down_sync(0xffffffffu, ssr, off);
    mabs = fmaxf(mabs, __shfl_down_sync(0xffffffffu, mabs, off));
    mrel = fmaxf(mrel, __shfl_down_sync(0xffffffffu, mrel, off));
    cons += __shfl_down_sync(0xffffffffu, cons, off);
    large += __shfl_down_sync(0xffffffffu, large, off);
    hash += __shfl_down_sync(0xffffffffu, hash, off);
  }
  if ((threadIdx.x & 31) == 0) {
    if (mism) atomicAdd(&st->mismatches, mism);
    if (first != ~0ull) atomicMin(&st->first, first);
    if (unw) atomicAdd(&st->unwritten, unw);
    if (nonf) atomicAdd(&st->nonfinite, nonf);
    atomicAdd(&st->sum_sq_diff, ssd);
    atomicAdd(&st->sum_sq_ref, ssr);
    atomicMax(&st->max_abs_bits, __float_as_uint(mabs));
    atomicMax(&st->max_rel_bits, __float_as_uint(mrel));
    if (cons) atomicAdd(&st->considered, cons);
    if (large) atomicAdd(&st->large, large);
    atomicAdd(&st->hash, hash);
  }
}

#define KS_CMP(name, T, B)                                                                                \
  extern "C" __global__ void name(const T* out, const T* ref, unsigned long long n, double atol, double rtol, \
                                  double tiny, double large_rel, unsigned long long poison,               \
                                  const float* bound, HashKey key, Stats* st) {                           \
    Compare<T, B>(out, ref, n, atol, rtol, tiny, large_rel, (B)poison, bound, key, st);                   \
  }
KS_CMP(cmp_f32, float, unsigned int)
KS_CMP(cmp_f16, __half, unsigned short)
KS_CMP(cmp_bf16, __nv_bfloat16, unsigned short)
KS_CMP(cmp_f64, double, unsigned long long)
KS_CMP(cmp_i32, int, unsigned int)
KS_CMP(cmp_i64, long long, unsigned long long)
KS_CMP(cmp_i8, signed char, unsigned char)
KS_CMP(cmp_u8, unsigned char, unsigned char)
KS_CMP(cmp_bool, unsigned char, unsigned char)

// The hash alone (Compare's, for elements of B's width): one read of the
// buffer instead of two, where the bits are known (a run that must repeat
// a verified run bit for bit) or the expected hash is (a pristine input).
template <typename B>
__device__ void HashBits(const B* p, unsigned long long n, HashKey key, unsigned long long* out) {
  unsigned long long hash = 0;
  const unsigned long long S = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
  for (; i + 3 * S < n; i += 4 * S) {
    B b[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) b[k] = p[i + k * S];
#pragma unroll
    for (int k = 0; k < 4; ++k) hash += Mix(i + k * S, (unsigned long long)b[k], key);
  }
  for (; i < n; i += S) hash += Mix(i, (unsigned long long)p[i], key);
  for (int off = 16; off > 0; off >>= 1) hash += __shfl_down_sync(0xffffffffu, hash, off);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, hash);
}
extern "C" __global__ void hash_b8(const unsigned char* p, unsigned long long n, HashKey k, unsigned long long* o) { HashBits(p, n, k, o); }
extern "C" __global__ void hash_b16(const unsigned short* p, unsigned long long n, HashKey k, unsigned long long* o) { HashBits(p, n, k, o); }
extern "C" __global__ void hash_b32(const unsigned int* p, unsigned long long n, HashKey k, unsigned long long* o) { HashBits(p, n, k, o); }
extern "C" __global__ void hash_b64(const unsigned long long* p, unsigned long long n, HashKey k, unsigned long long* o) { HashBits(p, n, k, o); }

extern "C" __global__ void diff_words(const unsigned int* a, const unsigned int* b, unsigned long long n,
                                      unsigned long long* count) {
  unsigned long long c = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    c += a[i] != b[i];
  for (int off = 16; off > 0; off >>= 1) c += __shfl_down_sync(0xffffffffu, c, off);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}

extern "C" __global__ void count_not_fill(const unsigned char* p, unsigned long long n, unsigned int v,
                                          unsigned long long* count) {
  unsigned long long c = 0;
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x)
    c += p[i] != (unsigned char)v;
  for (int off = 16; off > 0; off >>= 1) c += __shfl_down_sync(0xffffffffu, c, off);
  if ((threadIdx.x & 31) == 0 && c) atomicAdd(count, c);
}
// Shared-memory scrub (sent to the worker): launched before every run with one
// block per SM holding the opt-in maximum, so nothing a kernel left in shared
// memory survives into the next run.
extern "C" __global__ void ks_scrub_shared(unsigned int v) {
  extern __shared__ unsigned int smem[];
  volatile unsigned int* p = smem;  // volatile: stores no one reads are still made
  unsigned int bytes;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
  for (unsigned int i = threadIdx.x; i < bytes / 4; i += blockDim.x) p[i] = v ^ i;
}
// Local-memory scrub (sent to the worker): launched before every run with as
// many blocks as can be resident on every SM at once (they wait for each
// other before writing, so every warp slot holds one), each thread writing a
// frame at least as large as any loaded kernel's frame plus the stack limit
// (a thread's frame starts at the top of its local window, so this frame
// covers every frame and callee stack below it). Nothing a kernel left in
// local memory (its stack, spills, an array it never initializes) survives
// into the next run.
template <int kWords>
__device__ __forceinline__ void ScrubLocal(unsigned int v, unsigned int* arrived, unsigned int target) {
  volatile unsigned int frame[kWords];
  if (threadIdx.x == 0) {
    atomicAdd(arrived, 1u);
    long long t0 = clock64();
    while (atomicAdd(arrived, 0u) < target && clock64() - t0 < 20000000LL) {
    }
  }
  __syncthreads();
  for (int i = 0; i < kWords; ++i) frame[i] = v ^ (unsigned int)i;
}
extern "C" __global__ void ks_scrub_local_1k(unsigned int v, unsigned int* a, unsigned int t) { ScrubLocal<256>(v, a, t); }
extern "C" __global__ void ks_scrub_local_2k(unsigned int v, unsigned int* a, unsigned int t) { ScrubLocal<512>(v, a, t); }
extern "C" __global__ void ks_scrub_local_4k(unsigned int v, unsigned int* a, unsigned int t) { ScrubLocal<1024>(v, a, t); }
extern "C" __global__ void ks_scrub_local_8k(unsigned int v, unsigned int* a, unsigned int t) { ScrubLocal<2048>(v, a, t); }
extern "C" __global__ void ks_scrub_local_16k(unsigned int v, unsigned int* a, unsigned int t) { ScrubLocal<4096>(v, a, t); }
extern "C" __global__ void ks_scrub_local_32k(unsigned int v, unsigned int* a, unsigned int t) { ScrubLocal<8192>(v, a, t); }
extern "C" __global__ void ks_scrub_local_64k(unsigned int v, unsigned int* a, unsigned int t) { ScrubLocal<16384>(v, a, t); }
// Timing pad (sent to the worker): spins one thread for `ns` of the GPU's
// global timer, so that the host enqueues a run's launches while the GPU is
// still busy ahead of the start event (see evaluator/reference/timing.py).
extern "C" __global__ void ks_timing_pad(unsigned long long ns) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
)CUDA";

struct Stats {
  unsigned long long mismatches, first, unwritten, nonfinite;
  double sum_sq_diff, sum_sq_ref;
  unsigned int max_abs_bits, max_rel_bits;
  unsigned long long considered, large, hash;
};

// The key of Mix (HashKey in kHelperSource): drawn per evaluator.
struct HashKey {
  unsigned long long a, b;
};
inline const char* const kHashNames[4] = {"hash_b8", "hash_b16", "hash_b32", "hash_b64"};  // by log2(width)
inline const char* const kCmpNames[9] = {"cmp_f32", "cmp_f16", "cmp_bf16", "cmp_f64", "cmp_i32",
                            "cmp_i64", "cmp_i8",  "cmp_u8",   "cmp_bool"};

// The pattern written into an output before each run, and the element bits it leaves.
inline void PoisonFor(DType d, PoisonPattern* p, uint64_t* bits) {
  switch (d) {
    case DType::kFloat32: *p = {4, 0x7FA5A5A5u}; *bits = 0x7FA5A5A5u; return;
    case DType::kFloat16: *p = {2, 0x7DA5u}; *bits = 0x7DA5u; return;
    case DType::kBFloat16: *p = {2, 0x7FA5u}; *bits = 0x7FA5u; return;
    case DType::kFloat64: *p = {4, 0x7FF4A5A5u}; *bits = 0x7FF4A5A57FF4A5A5ull; return;
    case DType::kInt32: *p = {1, 0xA5u}; *bits = 0xA5A5A5A5u; return;
    case DType::kInt64: *p = {1, 0xA5u}; *bits = 0xA5A5A5A5A5A5A5A5ull; return;
    default: *p = {1, 0xA5u}; *bits = 0xA5u; return;
  }
}

inline double ElementAsDouble(DType d, const unsigned char* p) {
  switch (d) {
    case DType::kFloat32: { float v; std::memcpy(&v, p, 4); return v; }
    case DType::kFloat64: { double v; std::memcpy(&v, p, 8); return v; }
    case DType::kFloat16: {
      uint16_t h; std::memcpy(&h, p, 2);
      int e = (h >> 10) & 0x1f, m = h & 0x3ff;
      double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(m + 1024, e - 25);
      return (h & 0x8000) ? -v : v;
    }
    case DType::kBFloat16: { uint16_t h; std::memcpy(&h, p, 2); uint32_t b = uint32_t(h) << 16; float v; std::memcpy(&v, &b, 4); return v; }
    case DType::kInt32: { int32_t v; std::memcpy(&v, p, 4); return v; }
    case DType::kInt64: { int64_t v; std::memcpy(&v, p, 8); return static_cast<double>(v); }
    case DType::kInt8: return static_cast<int8_t>(*p);
    default: return *p;
  }
}

inline std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Whether the median of `ms` is known well enough: the distribution-free 95%
// confidence interval of the median (order statistics n/2 -+ 0.98 sqrt(n)) has
// a half-width within rel of the median, or within abs_ms.
inline bool MedianStable(std::vector<double> ms, double rel, double abs_ms) {
  const size_t n = ms.size();
  if (n < 3) return false;
  std::sort(ms.begin(), ms.end());
  double half = 0.98 * std::sqrt(static_cast<double>(n));
  auto lo = static_cast<size_t>(std::max(0.0, std::floor(n / 2.0 - half)));
  auto hi = static_cast<size_t>(std::min(static_cast<double>(n - 1), std::ceil(n / 2.0 + half)));
  double median = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  return (ms[hi] - ms[lo]) / 2 <= std::max(rel * median, abs_ms);
}

// Adaptive timing's stop rule (GpuEvaluator::TimedRuns): at least min_runs
// timed runs (min_runs_long for runs of long_ms or more, by the estimate of
// one run), then the first run after which both series' medians are stable
// (MedianStable: the 95% confidence interval of the median within rel of it,
// or within abs_ms).
inline int MinTimedRuns(double estimate_ms, int min_runs, int min_runs_long, double long_ms) {
  return estimate_ms >= long_ms ? std::min(min_runs, min_runs_long) : min_runs;
}
// Adaptive timing's warm-up (GpuEvaluator::WarmUpPhase): at least 3 runs and
// warmup_ms of run time, counting the judging sets' correctness runs just made
// on this GPU (done_ms), and never fewer than one warm-up run; at most 1000.
inline int WarmUpRuns(const std::vector<double>& done_ms, double estimate_ms, double warmup_ms) {
  double done = 0;
  for (double ms : done_ms) done += ms;
  const double at_least = std::max(1.0, 3.0 - static_cast<double>(done_ms.size()));
  return static_cast<int>(std::clamp(std::ceil((warmup_ms - done) / estimate_ms), at_least, 1000.0));
}
inline bool TimingStable(const std::vector<double>& on_stream, const std::vector<double>& device_wide, int min_runs,
                         double rel, double abs_ms) {
  return static_cast<int>(on_stream.size()) >= min_runs && MedianStable(on_stream, rel, abs_ms) &&
         MedianStable(device_wide, rel, abs_ms);
}

inline TimingStats Summarize(std::vector<double> ms) {
  TimingStats t;
  t.runs = static_cast<int>(ms.size());
  if (ms.empty()) return t;
  std::sort(ms.begin(), ms.end());
  size_t n = ms.size();
  t.median_ms = n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  double sum = 0;
  for (double v : ms) sum += v;
  t.mean_ms = sum / n;
  double var = 0;
  for (double v : ms) var += (v - t.mean_ms) * (v - t.mean_ms);
  t.stddev_ms = n > 1 ? std::sqrt(var / (n - 1)) : 0;
  return t;
}


}  // namespace ks::gpu_internal
