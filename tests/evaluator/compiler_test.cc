#include "evaluator/compile/compiler.h"

#include <cstdio>
#include <map>

#include "evaluator/gpu_evaluator_internal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace ks {
namespace {

using ::testing::HasSubstr;

CompileOptions Opts() {
  CompileOptions o;
  o.worker_path = KS_WORKER_PATH;
  return o;
}

TEST(CompilerTest, CompilesAndReportsParametersAndResources) {
  auto r = CompileCandidate(R"(
extern "C" __global__ void scale(const float* __restrict__ x, float* out, int n, float a, long long m, double d) {
  __shared__ float tile[256];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.f;
  __syncthreads();
  if (i < n) out[i] = tile[threadIdx.x] * a + (float)(m + d);
}
__device__ int calls;
__device__ float table[16];
)", Opts());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->ok) << r->message << "\n" << r->log;
  ASSERT_EQ(r->kernels.size(), 1u);
  const KernelInfo& k = r->kernels[0];
  EXPECT_EQ(k.name, "scale");
  ASSERT_EQ(k.params.size(), 6u);
  EXPECT_EQ(k.params[0].kind, ParamKind::kB64);
  EXPECT_EQ(k.params[2].kind, ParamKind::kB32);
  EXPECT_EQ(k.params[3].kind, ParamKind::kF32);
  EXPECT_EQ(k.params[4].kind, ParamKind::kB64);
  EXPECT_EQ(k.params[5].kind, ParamKind::kF64);
  EXPECT_GT(k.resources.registers, 0);
  EXPECT_EQ(k.resources.static_shared_bytes, 1024);
  EXPECT_FALSE(r->cubin.empty());
  bool has_calls = false, has_table = false;
  for (const auto& g : r->globals) {
    has_calls |= g.name == "calls" && g.size == 4;
    has_table |= g.name == "table" && g.size == 64;
  }
  EXPECT_TRUE(has_calls);
  EXPECT_TRUE(has_table);
}

TEST(CompilerTest, TheHeadersModelsUseAndCommonMacrosWork) {
  auto r = CompileCandidate(R"(
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <cooperative_groups.h>
#include <cuda/pipeline>
#include <cuda/barrier>
namespace cg = cooperative_groups;
extern "C" __global__ void k(const __half* x, __nv_bfloat16* y, float* z) {
  auto block = cg::this_thread_block();
  float v = __half2float(x[threadIdx.x]);
  y[threadIdx.x] = __float2bfloat16(v);
  z[threadIdx.x] = fmaxf(v, -INFINITY) + FLT_MAX * 0.f + (float)M_PI * 0.f;
  block.sync();
}
)", Opts());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->ok) << r->message << "\n" << r->log;
}

TEST(CompilerTest, ASpillingKernelReportsSpillBytes) {
  // A large register array indexed at run time, with a register cap, lands in local memory.
  auto r = CompileCandidate(R"(
extern "C" __global__ void __launch_bounds__(1024, 2) spill(const float* x, float* out, int n) {
  float acc[256];
  #pragma unroll
  for (int i = 0; i < 256; ++i) acc[i] = x[(threadIdx.x + i) % n];
  float s = 0.f;
  for (int r = 0; r < 4; ++r)
    #pragma unroll
    for (int i = 0; i < 256; ++i) s += acc[i] * acc[(i * 7 + r) % 256];
  out[threadIdx.x] = s + acc[n % 256];
}
)", Opts());
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r->ok) << r->message;
  const auto& res = r->kernels[0].resources;
  EXPECT_GT(res.stack_frame_bytes + res.spill_store_bytes, 0) << r->log;
}

TEST(CompilerTest, ACompileErrorIsAResultWithTheLog) {
  auto r = CompileCandidate("extern \"C\" __global__ void k(float* x) { x[0] = undefined_thing; }", Opts());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->ok);
  EXPECT_THAT(r->message, HasSubstr("undefined_thing"));
  EXPECT_THAT(r->log, HasSubstr("error"));
}

TEST(CompilerTest, IncludesOutsideTheCudaTreeAreRefused) {
  for (const char* src : {"#include \"/etc/passwd\"\n", "#include <../../../etc/passwd>\n",
                          "#define P \"/etc/passwd\"\n#include P\n", "#  include <stdio.h>\n",
                          "#inc\\\nlude \"/etc/passwd\"\n", "# /* hidden */ include \"/etc/shadow\"\n",
                          "#include_next <cuda_fp16.h>\n"}) {
    auto r = CompileCandidate(std::string(src) + "extern \"C\" __global__ void k() {}\n", Opts());
    ASSERT_TRUE(r.ok());
    EXPECT_FALSE(r->ok) << src;
    EXPECT_THAT(r->message, HasSubstr("line ")) << src;
  }
}

TEST(CompilerTest, OversizedSourceIsRefusedBeforeCompiling) {
  CompileOptions o = Opts();
  o.max_source_bytes = 1000;
  auto r = CompileCandidate(std::string(2000, ' ') + "extern \"C\" __global__ void k() {}", o);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->ok);
  EXPECT_THAT(r->message, HasSubstr("limit"));
}

TEST(CompilerTest, DeviceSideLaunchesAreRefused) {
  auto r = CompileCandidate(R"(
extern "C" __global__ void child(float* x) { x[threadIdx.x] = 1.f; }
extern "C" __global__ void parent(float* x) { child<<<1, 32>>>(x); }
)", Opts());
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->ok);
}

TEST(CompilerTest, ACompilerThatRunsTooLongIsStopped) {
  CompileOptions o = Opts();
  o.timeout_s = 2;
  // Each level inlines two copies of the level below: 2^40 inlined calls.
  auto r = CompileCandidate(R"(
template <int N> struct U {
  __device__ __forceinline__ static float f(const float* x, float a) {
    return U<N - 1>::f(x, U<N - 1>::f(x, a) * 1.0001f + x[N & 1023]);
  }
};
template <> struct U<0> { __device__ __forceinline__ static float f(const float*, float a) { return a; } };
extern "C" __global__ void k(float* x) { x[1] = U<40>::f(x, x[0]); }
)", o);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->ok);
  EXPECT_THAT(r->message, HasSubstr("timed out"));
  EXPECT_LE(r->seconds, 10.0);
  // The stuck compiler was killed, not returned to the pool: the next compile works.
  auto next = CompileCandidate("extern \"C\" __global__ void k(float* x) { x[0] = 1.f; }", Opts());
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(next->ok) << next->message;
}

TEST(CompilerTest, CompilesInParallelThroughThePool) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 3; ++i) {
        auto r = CompileCandidate("extern \"C\" __global__ void k" + std::to_string(t) + "_" + std::to_string(i) +
                                      "(float* x) { x[threadIdx.x] = " + std::to_string(i) + ".f; }",
                                  Opts());
        if (r.ok() && r->ok && r->kernels.size() == 1 &&
            r->kernels[0].name == "k" + std::to_string(t) + "_" + std::to_string(i))
          ++ok;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok.load(), 12);
}

TEST(PtxParseTest, StructParametersAndNoParameters) {
  const char* ptx = R"(
.visible .entry tma(
	.param .align 64 .b8 tma_param_0[128],
	.param .u64 .ptr .global .align 8 tma_param_1
)
{ ret; }
.visible .entry empty()
{ ret; }
)";
  auto k = ParsePtxEntries(ptx);
  ASSERT_TRUE(k.ok());
  ASSERT_EQ(k->size(), 2u);
  EXPECT_EQ((*k)[0].params[0].kind, ParamKind::kBytes);
  EXPECT_EQ((*k)[0].params[0].size, 128);
  EXPECT_EQ((*k)[0].params[0].align, 64);
  EXPECT_EQ((*k)[0].params[1].kind, ParamKind::kB64);
  EXPECT_TRUE((*k)[1].params.empty());
}

// Issue 14: the device heap survives from run to run and nothing resets it, so
// any use of it is refused at compile time, with the function named.
TEST(CompilerTest, DeviceHeapUseIsRefusedWithMallocNamed) {
  const char* kinds[] = {
      "float* p = (float*)malloc(64); if (p) { p[0] = x[i]; out[i] = p[0]; free(p); }",
      "float* p = new float[16]; p[0] = x[i]; out[i] = p[0]; delete[] p;",
      "void* p = __nv_aligned_device_malloc(64, 16); out[i] = p ? x[i] : 0.f;",
  };
  for (const char* body : kinds) {
    std::string src = std::string("extern \"C\" __global__ void k(const float* x, float* out) {\n"
                                  "  int i = threadIdx.x;\n  ") + body + "\n}\n";
    auto r = CompileCandidate(src, Opts());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->ok) << body;
    EXPECT_THAT(r->message, HasSubstr("device-side heap allocation is not allowed")) << body;
    EXPECT_THAT(r->message, ::testing::AnyOf(HasSubstr("calls malloc"), HasSubstr("calls __cuda_syscall_aligned_malloc"),
                                             HasSubstr("calls free")))
        << r->message;
  }
  // printf also goes through an .extern function (vprintf): that one is fine.
  auto ok = CompileCandidate("extern \"C\" __global__ void k(float* out) { printf(\"%d\\n\", 1); out[0] = 1.f; }",
                             Opts());
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->ok) << ok->message;
}

TEST(CompilerTest, AtomicsAreSeenInThePtx) {
  auto with = CompileCandidate(
      "extern \"C\" __global__ void k(const float* x, float* out) { atomicAdd(out, x[threadIdx.x]); }", Opts());
  auto without = CompileCandidate(
      "extern \"C\" __global__ void k(const float* x, float* out) { out[threadIdx.x] = x[threadIdx.x]; }", Opts());
  ASSERT_TRUE(with.ok() && without.ok());
  ASSERT_TRUE(with->ok && without->ok);
  EXPECT_TRUE(PtxUsesAtomics(with->ptx));
  EXPECT_FALSE(PtxUsesAtomics(without->ptx));
  EXPECT_EQ(ParsePtxExternFunctions(without->ptx).size(), 0u);
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

// Issue 23: Hopper's arch-specific instructions assemble only for the
// arch-specific target, which candidates compile for on a 9.0 GPU.
constexpr const char* kHopperOnly = R"(
extern "C" __global__ void __launch_bounds__(128, 1) k(float* out, unsigned long long da, unsigned long long db) {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  asm volatile("wgmma.fence.sync.aligned;");
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %6, 0;\n"
               " wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, p, 1, 1, 0, 0;\n}"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "l"(da), "l"(db), "r"(1));
  asm volatile("wgmma.commit_group.sync.aligned;");
  asm volatile("wgmma.wait_group.sync.aligned 0;");
  out[threadIdx.x] = d[0] + d[1] + d[2] + d[3];
}
)";

TEST(CompilerTest, WgmmaAndSetmaxnregAssembleOnlyForTheArchSpecificTarget) {
  CompileOptions o = Opts();
  o.arch = "sm_90a";
  auto r = CompileCandidate(kHopperOnly, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->ok) << r->message << "\n" << r->log;
  EXPECT_THAT(r->log, HasSubstr("for 'sm_90a'"));
  o.arch = "sm_90";
  r = CompileCandidate(kHopperOnly, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->ok);
  EXPECT_THAT(r->message, HasSubstr("not supported on .target 'sm_90'"));
}

TEST(CompilerTest, TheArchSpecificTargetOfEachArchitecture) {
  EXPECT_EQ(ArchSpecificTarget("sm_90"), "sm_90a");
  EXPECT_EQ(ArchSpecificTarget("sm_100"), "sm_100a");
  EXPECT_EQ(ArchSpecificTarget("sm_120"), "sm_120a");
  EXPECT_EQ(ArchSpecificTarget("sm_90a"), "sm_90a");  // already one
  EXPECT_EQ(ArchSpecificTarget("sm_89"), "sm_89");    // none before 9.0
  EXPECT_EQ(ArchSpecificTarget("sm_80"), "sm_80");
  EXPECT_TRUE(IsArchSpecific("sm_90a"));
  EXPECT_FALSE(IsArchSpecific("sm_90"));
  EXPECT_EQ(TargetArch("sm_100a"), "sm_100");
  EXPECT_EQ(TargetArch("sm_90"), "sm_90");
  // compile --arch takes both forms, and nothing else.
  CompileOptions o = Opts();
  o.arch = "compute_90a";
  EXPECT_FALSE(CompileCandidate("extern \"C\" __global__ void k() {}", o).ok());
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

// Issue 31: which images ks-worker loads afresh before every run. Module-scope
// memory of every kind counts, however it is declared; plain code does not.
TEST(CompilerTest, AnImageWithModuleScopeMemoryOfAnyKindIsReloadedAndPlainCodeIsNot) {
  const std::string kernel = R"(extern "C" __global__ void k(float* out) { out[threadIdx.x] = 1.f; })";
  const std::pair<const char*, bool> cases[] = {
      {"", false},
      {"__device__ int counter;\n", true},
      {"__device__ float table[4] = {1, 2, 3, 4};\n", true},
      {"__managed__ unsigned seen[16];\n", true},
      {"__constant__ unsigned bank[16];\n", true},
  };
  for (const auto& [prefix, has_data] : cases) {
    std::string src = std::string(prefix) + kernel;
    if (std::string(prefix).find("__constant__") != std::string::npos)  // used, so that it is kept
      src = std::string(prefix) + R"(extern "C" __global__ void k(float* out) { out[threadIdx.x] = bank[threadIdx.x & 15]; })";
    if (std::string(prefix).find("__managed__") != std::string::npos)
      src = std::string(prefix) + R"(extern "C" __global__ void k(float* out) { out[threadIdx.x] = seen[threadIdx.x & 15]; })";
    auto r = CompileCandidate(src, Opts());
    ASSERT_TRUE(r.ok() && r->ok) << prefix << (r.ok() ? r->log : r.status().ToString());
    EXPECT_EQ(ModuleHasData(r->cubin), has_data) << "'" << prefix << "'";
  }
  // A .global variable declared inside a function's inline PTX.
  auto asm_global = CompileCandidate(R"(extern "C" __global__ void k(unsigned* out) {
  unsigned long long p;
  asm volatile("{\n .global .align 4 .u32 hidden[64];\n mov.u64 %0, hidden;\n}" : "=l"(p));
  out[threadIdx.x] = reinterpret_cast<unsigned*>(p)[threadIdx.x & 63];
})", Opts());
  ASSERT_TRUE(asm_global.ok() && asm_global->ok) << (asm_global.ok() ? asm_global->log : "");
  EXPECT_TRUE(ModuleHasData(asm_global->cubin));
  EXPECT_TRUE(ModuleHasData("not an ELF image"));
  EXPECT_TRUE(ModuleHasData(""));
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

// Issue 33: the evaluator's own helper kernels (the comparison, the keyed
// hash) compile for the H100's target with the parameters the evaluator
// launches them with; compiled at every evaluator's start, so a mistake here
// would stop every GPU evaluation.
TEST(CompilerTest, TheEvaluatorsHelperKernelsCompileWithTheirKeyedHash) {
  CompileOptions o = Opts();
  o.arch = "sm_90a";
  auto r = CompileCandidate(gpu_internal::kHelperSource, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->ok) << r->message << "\n" << r->log;
  std::map<std::string, const KernelInfo*> by_name;
  for (const auto& k : r->kernels) by_name[k.name] = &k;
  for (const char* name : gpu_internal::kCmpNames) {
    ASSERT_TRUE(by_name.count(name)) << name;
    // out, ref, n, atol, rtol, tiny, large_rel, poison, bound, key (16 bytes), stats
    EXPECT_EQ(by_name[name]->params.size(), 11u) << name;
    std::printf("%s: %d registers\n", name, by_name[name]->resources.registers);
  }
  for (const char* name : gpu_internal::kHashNames) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_EQ(by_name[name]->params.size(), 4u) << name;  // p, n, key, out
  }
}

}  // namespace
}  // namespace ks
