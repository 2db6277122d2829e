#include "evaluator/gpu_evaluator.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <future>
#include <set>
#include <thread>

#include "common/base64.h"
#include "common/files.h"
#include "common/unique_fd.h"
#include "evaluator/launch_plan.h"
#include "evaluator/sandbox.h"
#include "evaluator/worker_protocol.h"

namespace ks {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kAlign = 256;
constexpr uint64_t kGuard = 64 * 1024;
constexpr uint8_t kGuardByte = 0xCD;

uint64_t AlignUp(uint64_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// GPU time queued ahead of every run's start event (timing.py PAD_US, the same).
constexpr uint64_t kTimingPadNs = 100000;

// Comparison and integrity kernels of the trusted side. They read candidate
// outputs and reference outputs, both in this process's context.
constexpr const char* kHelperSource = R"CUDA(
#include <cuda_fp16.h>
#include <cuda_bf16.h>
struct Stats {
  unsigned long long mismatches, first, unwritten, nonfinite;
  double sum_sq_diff, sum_sq_ref;
  unsigned int max_abs_bits, max_rel_bits;
  unsigned long long considered, large, hash;
};
// An order-independent hash of an output's bits: the sum of a mix of (index, bits).
__device__ __forceinline__ unsigned long long Mix(unsigned long long i, unsigned long long b) {
  unsigned long long z = (i * 0x9E3779B97F4A7C15ull) ^ (b + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ __forceinline__ double Val(const float* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ double Val(const double* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ double Val(const __half* p, unsigned long long i) { return __half2float(p[i]); }
__device__ __forceinline__ double Val(const __nv_bfloat16* p, unsigned long long i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ double Val(const int* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ double Val(const long long* p, unsigned long long i) { return (double)p[i]; }
__device__ __forceinline__ double Val(const signed char* p, unsigned long long i) { return p[i]; }
__device__ __forceinline__ double Val(const unsigned char* p, unsigned long long i) { return p[i]; }

// tiny: |ref| below it is not "considered" for the large-error share; large_rel:
// the relative error that counts as large (Tolerance in evaluator/signature.h).
template <typename T, typename B>
__device__ void Compare(const T* out, const T* ref, unsigned long long n, double atol, double rtol, double tiny,
                        double large_rel, B poison, Stats* st) {
  unsigned long long mism = 0, first = ~0ull, unw = 0, nonf = 0, cons = 0, large = 0, hash = 0;
  double ssd = 0, ssr = 0;
  float mabs = 0.f, mrel = 0.f;
  const B* ob = reinterpret_cast<const B*>(out);
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
       i += (unsigned long long)gridDim.x * blockDim.x) {
    double o = Val(out, i), r = Val(ref, i);
    hash += Mix(i, (unsigned long long)ob[i]);
    bool bad = false;
    if (ob[i] == poison) { ++unw; bad = true; }
    else if (isnan(r)) bad = !isnan(o);
    else if (isinf(r)) bad = o != r;
    else if (!isfinite(o)) { bad = true; ++nonf; }
    else {
      double d = fabs(o - r);
      ssd += d * d;
      ssr += r * r;
      mabs = fmaxf(mabs, (float)d);
      mrel = fmaxf(mrel, (float)(d / fmax(fabs(r), 1e-30)));
      bad = d > atol + rtol * fabs(r);
      if (fabs(r) >= tiny) {
        ++cons;
        if (d > large_rel * fabs(r)) ++large;
      }
    }
    if (bad) { ++mism; if (i < first) first = i; }
  }
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
                                  double tiny, double large_rel, unsigned long long poison, Stats* st) {  \
    Compare<T, B>(out, ref, n, atol, rtol, tiny, large_rel, (B)poison, st);                               \
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

const char* kCmpNames[9] = {"cmp_f32", "cmp_f16", "cmp_bf16", "cmp_f64", "cmp_i32",
                            "cmp_i64", "cmp_i8",  "cmp_u8",   "cmp_bool"};

// The pattern written into an output before each run, and the element bits it leaves.
void PoisonFor(DType d, PoisonPattern* p, uint64_t* bits) {
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

double ElementAsDouble(DType d, const unsigned char* p) {
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

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

TimingStats Summarize(std::vector<double> ms) {
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

}  // namespace

GpuEvaluator::GpuEvaluator(const ReferenceData& ref, const GpuEvaluatorOptions& opts) : ref_(ref), opts_(opts) {}

GpuEvaluator::~GpuEvaluator() {
  if (worker_.running()) {
    (void)SendMessage(worker_.stdin_fd(), {{"cmd", "quit"}});
    (void)ReceiveMessage(worker_.stdout_fd(), 2);
    worker_.Kill();
  }
  if (!worker_log_path_.empty()) unlink(worker_log_path_.c_str());
}

StatusOr<std::unique_ptr<GpuEvaluator>> GpuEvaluator::Create(const ReferenceData& ref, const GpuEvaluatorOptions& opts) {
  std::unique_ptr<GpuEvaluator> e(new GpuEvaluator(ref, opts));
  KS_RETURN_IF_ERROR(e->Setup());
  return e;
}

Status GpuEvaluator::LoadTensor(const std::string& path, CUdeviceptr dst, uint64_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("reference file " + path + " cannot be opened");
  std::vector<char> buf(std::min<uint64_t>(bytes, 64u << 20));
  uint64_t done = 0;
  while (done < bytes) {
    uint64_t n = std::min<uint64_t>(buf.size(), bytes - done);
    in.read(buf.data(), static_cast<std::streamsize>(n));
    if (static_cast<uint64_t>(in.gcount()) != n) return Internal("reference file " + path + " is shorter than expected");
    KS_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyHtoD(dst + done, buf.data(), n), "cuMemcpyHtoD"));
    done += n;
  }
  return Status::Ok();
}

StatusOr<CUdeviceptr> GpuEvaluator::ResidentTensorPtr(int set, const std::string& name, uint64_t bytes) {
  KS_ASSIGN_OR_RETURN(ResidentTensor t, ref_.resident->At(set, name));
  if (t.bytes != bytes)
    return Internal("resident reference: '" + name + "' has " + std::to_string(t.bytes) + " bytes, expected " +
                    std::to_string(bytes));
  if (bytes == 0) return CUdeviceptr{0};
  auto it = resident_maps_.find(t.handle);
  if (it == resident_maps_.end()) {
    auto m = IpcMapping::Open(t.handle);
    if (!m.ok()) return m.status().WithContext("mapping the resident reference's '" + name + "'");
    it = resident_maps_.emplace(t.handle, std::move(m).value()).first;
  }
  return it->second.get() + t.offset;
}

Status GpuEvaluator::FillTensor(int set, const std::string& name, CUdeviceptr dst, uint64_t bytes) {
  if (ref_.resident) {
    KS_ASSIGN_OR_RETURN(CUdeviceptr src, ResidentTensorPtr(set, name, bytes));
    if (bytes == 0) return Status::Ok();
    return d_->Check(d_->cuMemcpyDtoD(dst, src, bytes), "cuMemcpyDtoD");
  }
  KS_ASSIGN_OR_RETURN(std::string path, ref_.FilePath(set, name));
  return LoadTensor(path, dst, bytes);
}

Status GpuEvaluator::Setup() {
  KS_ASSIGN_OR_RETURN(d_, CudaDriver::Get());
  KS_ASSIGN_OR_RETURN(ctx_, PrimaryContext::Open(opts_.device));
  KS_ASSIGN_OR_RETURN(info_, QueryDevice(ctx_.device()));
  arch_ = info_.Arch();
  {
    CompileOptions co;
    co.arch = arch_;
    co.worker_path = opts_.worker_path;
    KS_ASSIGN_OR_RETURN(CompileResult helpers, CompileCandidate(kHelperSource, co));
    if (!helpers.ok) return Internal("evaluator helper kernels do not compile: " + helpers.message + "\n" + helpers.log);
    KS_ASSIGN_OR_RETURN(helpers_, Module::Load(helpers.cubin));
    helpers_cubin_ = helpers.cubin;
    for (int i = 0; i < 9; ++i) {
      KS_ASSIGN_OR_RETURN(cmp_fn_[i], helpers_.Function(kCmpNames[i]));
    }
    KS_ASSIGN_OR_RETURN(diff_words_, helpers_.Function("diff_words"));
    KS_ASSIGN_OR_RETURN(count_not_fill_, helpers_.Function("count_not_fill"));
  }
  const Signature& sig = ref_.signature;
  const int sets = static_cast<int>(ref_.sets.size());
  if (sets == 0) return InvalidArgument("reference has no input sets");
  // Arena layout: [guard][set 0 inputs]...[set K-1 inputs][parameters][out0][guard][out1][guard]...
  uint64_t off = kGuard;
  set_inputs_.assign(sets, {});
  for (int s = 0; s < sets; ++s)
    for (const auto& t : sig.inputs)
      if (!t.is_scalar) {
        set_inputs_[s].push_back({t.name, off, static_cast<uint64_t>(t.bytes())});
        off = AlignUp(off + t.bytes());
      }
  for (const auto& t : sig.parameters)
    if (!t.is_scalar) {
      params_.push_back({t.name, off, static_cast<uint64_t>(t.bytes())});
      off = AlignUp(off + t.bytes());
    }
  inputs_end_ = off;
  outputs_.clear();
  for (const auto& t : sig.outputs) {
    OutputSlot o;
    o.spec = &t;
    o.offset = off;
    o.bytes = t.bytes();
    // The guard starts at the output's last byte, not at the next aligned
    // offset: alignment padding a kernel could keep state in is guard too.
    o.guard_offset = off + t.bytes();
    o.guard_bytes = AlignUp(o.guard_offset + kGuard) - o.guard_offset;
    off = o.guard_offset + o.guard_bytes;
    outputs_.push_back(std::move(o));
  }
  KS_ASSIGN_OR_RETURN(arena_, DeviceBuffer::Alloc(off));
  KS_ASSIGN_OR_RETURN(pristine_, DeviceBuffer::Alloc(inputs_end_));
  KS_ASSIGN_OR_RETURN(stats_, DeviceBuffer::Alloc(sizeof(Stats)));
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(arena_.get(), 0, off), "cuMemsetD8"));
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(arena_.get(), kGuardByte, kGuard), "cuMemsetD8"));
  for (const auto& o : outputs_)
    KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(arena_.get() + o.guard_offset, kGuardByte, o.guard_bytes), "cuMemsetD8"));
  for (int s = 0; s < sets; ++s)
    for (const auto& slot : set_inputs_[s])
      KS_RETURN_IF_ERROR(FillTensor(s, slot.name, arena_.get() + slot.offset, slot.bytes));
  for (const auto& slot : params_) KS_RETURN_IF_ERROR(FillTensor(0, slot.name, arena_.get() + slot.offset, slot.bytes));
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyDtoD(pristine_.get(), arena_.get(), inputs_end_), "cuMemcpyDtoD"));
  for (auto& o : outputs_)
    for (int s = 0; s < sets; ++s) {
      if (ref_.resident) {
        // The reference outputs stay where the bridge computed them (mapped,
        // never copied): a multi-GB output is not held twice on the GPU.
        KS_ASSIGN_OR_RETURN(CUdeviceptr p, ResidentTensorPtr(s, o.spec->name, o.bytes));
        o.refs.push_back(p);
      } else {
        KS_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Alloc(o.bytes));
        KS_RETURN_IF_ERROR(FillTensor(s, o.spec->name, b.get(), o.bytes));
        o.refs.push_back(b.get());
        o.ref_buffers.push_back(std::move(b));
      }
      KS_ASSIGN_OR_RETURN(double ss, ReferenceSumSquares(o, s));
      o.ref_rms.push_back(o.spec->numel() > 0 ? std::sqrt(ss / o.spec->numel()) : 0);
    }
  CUipcMemHandle h;
  KS_RETURN_IF_ERROR(d_->Check(d_->cuIpcGetMemHandle(&h, arena_.get()), "cuIpcGetMemHandle"));
  ipc_handle_.assign(reinterpret_cast<const char*>(&h), sizeof h);
  KS_RETURN_IF_ERROR(MeasureBandwidth());
  if (opts_.peak_tflops <= 0 && opts_.measure_peaks && ref_.signature.flops.value_or(0) > 0) (void)Peaks();
  return StartWorker();
}

StatusOr<DevicePeaks> GpuEvaluator::Peaks() {
  if (!peaks_) {
    PeaksOptions po;
    po.bridge.python = opts_.python;
    po.device_index = opts_.device;
    po.device_name = info_.name;
    peaks_ = MeasureDevicePeaks(po);
  }
  return *peaks_;
}

Status GpuEvaluator::MeasureBandwidth() {
  const size_t bytes = 512u << 20;
  KS_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Alloc(bytes));
  KS_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Alloc(bytes));
  KS_ASSIGN_OR_RETURN(Event e0, Event::Create());
  KS_ASSIGN_OR_RETURN(Event e1, Event::Create());
  d_->cuMemsetD32(a.get(), 0x3f800000u, bytes / 4);
  std::vector<double> ms;
  for (int i = 0; i < 7; ++i) {
    d_->cuEventRecord(e0.get(), nullptr);
    d_->cuMemcpyDtoD(b.get(), a.get(), bytes);
    d_->cuEventRecord(e1.get(), nullptr);
    KS_RETURN_IF_ERROR(d_->Check(d_->cuEventSynchronize(e1.get()), "bandwidth probe"));
    float t = 0;
    d_->cuEventElapsedTime(&t, e0.get(), e1.get());
    if (i > 1) ms.push_back(t);
  }
  double median = Summarize(ms).median_ms;
  bandwidth_gbps_ = median > 0 ? 2.0 * bytes / (median * 1e-3) / 1e9 : 0;  // bytes read + written
  return Status::Ok();
}

Status GpuEvaluator::StartWorker() {
  worker_ready_ = false;
  KS_ASSIGN_OR_RETURN(std::string worker, FindWorker(opts_.worker_path));
  if (worker_log_path_.empty()) {
    char tmpl[] = "/tmp/ks-worker-XXXXXX.log";
    int fd = mkstemps(tmpl, 4);
    if (fd < 0) return PosixError("creating the worker log", errno);
    close(fd);
    worker_log_path_ = tmpl;
  }
  SandboxLimits limits;
  limits.drop_privileges = opts_.drop_privileges;
  // Diagnostics: KS_WORKER_SANDBOX=keepuser,nonetns,dumpable relaxes single steps.
  if (const char* v = getenv("KS_WORKER_SANDBOX")) {
    std::string s = v;
    if (s.find("keepuser") != std::string::npos) limits.drop_privileges = false;
    if (s.find("nonetns") != std::string::npos) limits.new_network_namespace = false;
    if (s.find("dumpable") != std::string::npos) limits.keep_dumpable = true;
  }
  KS_ASSIGN_OR_RETURN(worker_, ChildProcess::Start({worker, "serve"}, {}, worker_log_path_,
                                                   [limits] { return ApplySandbox(limits); }));
  json outs = json::array();
  for (const auto& o : outputs_) {
    PoisonPattern p;
    uint64_t bits;
    PoisonFor(o.spec->dtype, &p, &bits);
    outs.push_back({{"offset", o.offset}, {"bytes", o.bytes}, {"width", p.width}, {"pattern", p.pattern}});
  }
  json init{{"cmd", "init"},
            {"ipc", Base64Encode(ipc_handle_)},
            {"device", opts_.device},
            {"l2_flush_bytes", std::max<int64_t>(2 * info_.l2_bytes, 64 << 20)},
            {"pad_cubin", Base64Encode(helpers_cubin_)},
            {"pad_ns", kTimingPadNs},
            {"scrub_shared_bytes", info_.shared_per_block_optin},
            {"sms", info_.multiprocessors},
            {"printf_fifo_bytes", 1 << 20},
            {"outputs", outs}};
  KS_RETURN_IF_ERROR(SendMessage(worker_.stdin_fd(), init));
  auto reply = ReceiveMessage(worker_.stdout_fd(), 120);
  if (!reply.ok() || !(*reply).value("ok", false)) {
    std::string why = reply.ok() ? (*reply).value("message", "") : reply.status().message();
    std::string log = TakeWorkerLog();
    worker_.Kill();
    return FailedPrecondition("the GPU worker did not start: " + why + (log.empty() ? "" : "\n" + log));
  }
  worker_heap_bytes_ = (*reply).value("heap_bytes", uint64_t{0});
  worker_ready_ = true;
  return Status::Ok();
}

void GpuEvaluator::StopWorker(const std::string& why) {
  worker_.Kill();
  worker_ready_ = false;
  ++worker_restarts_;
}

std::string GpuEvaluator::TakeWorkerLog() {
  if (worker_log_path_.empty()) return "";
  // Only the head is read: a printf flood can fill the file up to its size limit.
  std::string s;
  int64_t total = 0;
  {
    UniqueFd fd(open(worker_log_path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return "";
    total = lseek(fd.get(), 0, SEEK_END);
    lseek(fd.get(), 0, SEEK_SET);
    s.resize(std::min<int64_t>(std::max<int64_t>(total, 0), opts_.worker_log_cap));
    ssize_t n = s.empty() ? 0 : read(fd.get(), s.data(), s.size());
    s.resize(n > 0 ? n : 0);
  }
  (void)truncate(worker_log_path_.c_str(), 0);
  if (total > static_cast<int64_t>(s.size()))
    s += "\n[... " + std::to_string(total - s.size()) + " more bytes of worker output dropped]\n";
  return s;
}

StatusOr<uint64_t> GpuEvaluator::CountDiffWords(CUdeviceptr a, CUdeviceptr b, uint64_t bytes) {
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(stats_.get(), 0, sizeof(Stats)), "cuMemsetD8"));
  unsigned long long n = (bytes + 3) / 4;
  CUdeviceptr count = stats_.get();
  void* args[] = {&a, &b, &n, &count};
  unsigned grid = static_cast<unsigned>(std::clamp<uint64_t>((n + 255) / 256, 1, info_.multiprocessors * 8));
  KS_RETURN_IF_ERROR(d_->Check(d_->cuLaunchKernel(diff_words_, grid, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "diff_words"));
  uint64_t result = 0;
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyDtoH(&result, count, 8), "cuMemcpyDtoH"));
  return result;
}

StatusOr<uint64_t> GpuEvaluator::CountNotFill(CUdeviceptr p, uint64_t bytes, uint8_t fill) {
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(stats_.get(), 0, sizeof(Stats)), "cuMemsetD8"));
  unsigned long long n = bytes;
  unsigned v = fill;
  CUdeviceptr count = stats_.get();
  void* args[] = {&p, &n, &v, &count};
  unsigned grid = static_cast<unsigned>(std::clamp<uint64_t>((n + 255) / 256, 1, info_.multiprocessors * 8));
  KS_RETURN_IF_ERROR(d_->Check(d_->cuLaunchKernel(count_not_fill_, grid, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "count_not_fill"));
  uint64_t result = 0;
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyDtoH(&result, count, 8), "cuMemcpyDtoH"));
  return result;
}

namespace {

struct CompareArgs {
  CUdeviceptr out, ref;
  unsigned long long n;
  double atol, rtol, tiny, large_rel;
  uint64_t poison;
};

// One launch of a cmp_* helper over a whole output; the figures come back in `stats`.
StatusOr<Stats> LaunchCompare(const CudaDriver* d, CUfunction fn, CUdeviceptr stats, unsigned max_grid, CompareArgs c) {
  Stats init{};
  init.first = ~0ull;
  KS_RETURN_IF_ERROR(d->Check(d->cuMemcpyHtoD(stats, &init, sizeof init), "cuMemcpyHtoD"));
  unsigned long long poison = c.poison;
  void* args[] = {&c.out, &c.ref, &c.n, &c.atol, &c.rtol, &c.tiny, &c.large_rel, &poison, &stats};
  unsigned grid = static_cast<unsigned>(std::clamp<uint64_t>((c.n + 255) / 256, 1, max_grid));
  KS_RETURN_IF_ERROR(d->Check(d->cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "compare"));
  Stats s;
  KS_RETURN_IF_ERROR(d->Check(d->cuMemcpyDtoH(&s, stats, sizeof s), "cuMemcpyDtoH"));
  return s;
}

// The norm rules of Tolerance beside the element-wise one.
bool NormRuleBroken(const OutputError& e) {
  if (e.rel_norm_bound <= 0) return false;
  return e.rel_norm > e.rel_norm_bound ||
         (e.considered > 0 && static_cast<double>(e.large_errors) > e.large_share_cap * e.considered);
}

}  // namespace

StatusOr<double> GpuEvaluator::ReferenceSumSquares(const OutputSlot& o, int set) {
  // The reference against itself: the sum of squares of its finite values.
  CompareArgs a{o.refs[set], o.refs[set], static_cast<unsigned long long>(o.spec->numel()), 0, 0,
                INFINITY, 0, 0};
  PoisonPattern p;
  PoisonFor(o.spec->dtype, &p, &a.poison);
  KS_ASSIGN_OR_RETURN(Stats s, LaunchCompare(d_, cmp_fn_[static_cast<int>(o.spec->dtype)], stats_.get(),
                                             info_.multiprocessors * 8, a));
  return s.sum_sq_ref;
}

Status GpuEvaluator::CompareOutput(OutputSlot& o, int set, OutputError* err, bool* bad, uint64_t* hash) {
  const TensorSpec& t = *o.spec;
  Tolerance tol = ref_.signature.ToleranceFor(t.dtype);
  CompareArgs a{arena_.get() + o.offset, o.refs[set], static_cast<unsigned long long>(t.numel()), tol.atol,
                tol.rtol, INFINITY, 0, 0};
  if (tol.large_rel > 0) {
    // "Not tiny" is relative to the output's RMS, so an honest kernel's
    // rounding (also relative to the RMS) never makes a large relative error.
    a.tiny = std::max(tol.TinyFraction() * o.ref_rms[set], std::numeric_limits<double>::min());
    a.large_rel = tol.large_rel;
  }
  PoisonPattern p;
  PoisonFor(t.dtype, &p, &a.poison);
  KS_ASSIGN_OR_RETURN(Stats s, LaunchCompare(d_, cmp_fn_[static_cast<int>(t.dtype)], stats_.get(),
                                             info_.multiprocessors * 8, a));
  float mabs, mrel;
  std::memcpy(&mabs, &s.max_abs_bits, 4);
  std::memcpy(&mrel, &s.max_rel_bits, 4);
  err->name = t.name;
  err->input_set = set;
  err->max_abs = mabs;
  err->max_rel = mrel;
  err->rel_norm = s.sum_sq_ref > 0 ? std::sqrt(s.sum_sq_diff / s.sum_sq_ref) : std::sqrt(s.sum_sq_diff);
  err->mismatches = static_cast<int64_t>(s.mismatches);
  err->first_mismatch = s.first == ~0ull ? -1 : static_cast<int64_t>(s.first);
  err->unwritten = static_cast<int64_t>(s.unwritten);
  err->nan_mismatches = static_cast<int64_t>(s.nonfinite);
  err->rel_norm_bound = tol.rel_norm;
  err->considered = static_cast<int64_t>(s.considered);
  err->large_errors = static_cast<int64_t>(s.large);
  err->large_rel = tol.large_rel;
  err->large_share_cap = tol.large_share;
  *hash = s.hash;
  *bad = s.mismatches > 0 || NormRuleBroken(*err);
  return Status::Ok();
}

double GpuEvaluator::RunTimeout() const {
  if (opts_.run_timeout_s > 0) return opts_.run_timeout_s;
  // Auto: generous against what PyTorch needs for the same work, so a slow but
  // honest naive kernel finishes while a hang costs seconds, not minutes.
  double eager_s = ref_.eager ? ref_.eager->median_ms / 1e3 : 0;
  return std::clamp(200 * eager_s, 2.0, 60.0);
}

GpuEvaluator::RunResult GpuEvaluator::RunOnce(int set, bool split) {
  RunResult r;
  auto fail = [&](EvalStatus st, std::string msg) {
    r.status = st;
    r.message = std::move(msg);
    return r;
  };
  if (Status s = SendMessage(worker_.stdin_fd(), {{"cmd", "run"}, {"set", set}, {"split", split}}); !s.ok()) {
    StopWorker("send failed");
    return fail(EvalStatus::kRuntimeError, "the worker is gone: " + s.message());
  }
  double limit = RunTimeout();
  auto reply = ReceiveMessage(worker_.stdout_fd(), limit);
  if (!reply.ok()) {
    if (reply.status().code() == Code::kDeadlineExceeded) {
      StopWorker("timeout");
      return fail(EvalStatus::kTimeout, "the launch plan did not finish within " + Num(limit) +
                                            " s; the worker was killed");
    }
    std::string how = worker_.Kill();
    worker_ready_ = false;
    ++worker_restarts_;
    return fail(EvalStatus::kRuntimeError, "the worker died during the run (" + how + ")");
  }
  const json& j = *reply;
  if (!j.value("ok", false)) {
    if (j.value("fatal", false)) {
      worker_.Kill();
      worker_ready_ = false;
      ++worker_restarts_;
    }
    std::string st = j.value("status", "runtime_error");
    return fail(st == "launch_error" ? EvalStatus::kLaunchError : EvalStatus::kRuntimeError, j.value("message", ""));
  }
  r.ms = j.value("ms", 0.0);
  r.ms_device = j.value("ms_device", r.ms);
  if (split) r.launch_ms = j.value("launch_ms", std::vector<double>{});
  if (j.contains("state_changed") && !j["state_changed"].empty()) {
    std::string names;
    for (const auto& n : j["state_changed"]) names += (names.empty() ? "" : ", ") + n.get<std::string>();
    r.status = EvalStatus::kIncorrect;
    r.message = "the kernel keeps state across runs in __device__ variable(s) " + names +
                " (each run of the plan must be independent: no cached results, no call counters)";
  }
  // Verify this run: outputs, then inputs and guards.
  for (auto& o : outputs_) {
    OutputError e;
    bool bad = false;
    uint64_t hash = 0;
    if (Status s = CompareOutput(o, set, &e, &bad, &hash); !s.ok())
      return fail(EvalStatus::kRuntimeError, "evaluator: " + s.message());
    r.errors.push_back(e);
    r.hashes.push_back(hash);
    if (bad && r.status == EvalStatus::kCorrect && e.mismatches == 0) {
      // Within the element-wise tolerance, but not within the norm rules.
      const TensorSpec& t = *o.spec;
      std::string msg = "output '" + t.name + "', input set " + std::to_string(set) + ": ";
      if (e.rel_norm > e.rel_norm_bound)
        msg += "relative error norm ||out - ref|| / ||ref|| = " + Num(e.rel_norm) + " exceeds " + Num(e.rel_norm_bound) +
               " for " + DTypeName(t.dtype);
      else
        msg += std::to_string(e.large_errors) + " of " + std::to_string(e.considered) +
               " elements that are not tiny (|ref| >= " + Num(100 * ref_.signature.ToleranceFor(t.dtype).TinyFraction()) +
               "% of the RMS) have a relative error above " + Num(e.large_rel) +
               " (at most " + Num(100 * e.large_share_cap) + "% may)";
      msg += " although every element is within atol/rtol: is it computed in a lower precision, or are small "
             "outputs skipped?";
      r.status = EvalStatus::kIncorrect;
      r.message = msg;
    } else if (bad && r.status == EvalStatus::kCorrect) {
      const TensorSpec& t = *o.spec;
      Tolerance tol = ref_.signature.ToleranceFor(t.dtype);
      std::string msg = "output '" + t.name + "', input set " + std::to_string(set) + ": " + std::to_string(e.mismatches) +
                        " of " + std::to_string(t.numel()) + " elements wrong (atol " + Num(tol.atol) + ", rtol " +
                        Num(tol.rtol) + ")";
      if (e.unwritten) msg += ", " + std::to_string(e.unwritten) + " never written";
      if (e.nan_mismatches) msg += ", " + std::to_string(e.nan_mismatches) + " NaN/Inf where the reference is finite";
      if (e.first_mismatch >= 0) {
        size_t es = DTypeSize(t.dtype);
        unsigned char got[8] = {}, want[8] = {};
        d_->cuMemcpyDtoH(got, arena_.get() + o.offset + e.first_mismatch * es, es);
        d_->cuMemcpyDtoH(want, o.refs[set] + e.first_mismatch * es, es);
        msg += "; first at index " + std::to_string(e.first_mismatch) + ": got " + Num(ElementAsDouble(t.dtype, got)) +
               ", expected " + Num(ElementAsDouble(t.dtype, want));
      }
      r.status = EvalStatus::kIncorrect;
      r.message = msg;
    }
  }
  // Inputs must be unchanged (stops writing intermediates into inputs and
  // corrupting the data later runs are checked on).
  std::vector<const TensorSlot*> slots;
  for (const auto& s : set_inputs_[set]) slots.push_back(&s);
  for (const auto& s : params_) slots.push_back(&s);
  // A modified input is named first even when outputs are also wrong: it is
  // the cause, and which symptom shows depends on how the candidate's blocks race.
  bool input_named = false;
  for (const TensorSlot* s : slots) {
    auto diff = CountDiffWords(arena_.get() + s->offset, pristine_.get() + s->offset, AlignUp(s->bytes));
    if (!diff.ok()) return fail(EvalStatus::kRuntimeError, "evaluator: " + diff.status().message());
    if (*diff) {
      d_->cuMemcpyDtoD(arena_.get() + s->offset, pristine_.get() + s->offset, AlignUp(s->bytes));
      std::string msg = "input '" + s->name + "' was modified by the candidate (" + std::to_string(*diff) +
                        " 4-byte words changed, input set " + std::to_string(set) + ")";
      if (!input_named && (r.status == EvalStatus::kCorrect || r.status == EvalStatus::kIncorrect)) {
        r.message = r.status == EvalStatus::kCorrect ? msg : msg + "; " + r.message;
        r.status = EvalStatus::kIncorrect;
        input_named = true;
      }
    }
  }
  // Guards around outputs: a write past an output's end is a memory error.
  auto check_guard = [&](uint64_t off, uint64_t bytes, const std::string& what) {
    auto n = CountNotFill(arena_.get() + off, bytes, kGuardByte);
    if (n.ok() && *n) {
      d_->cuMemsetD8(arena_.get() + off, kGuardByte, bytes);
      if (r.status == EvalStatus::kCorrect || r.status == EvalStatus::kIncorrect)
        fail(EvalStatus::kRuntimeError, "wrote " + std::to_string(*n) + " bytes " + what);
    }
  };
  check_guard(0, kGuard, "before the start of its buffers");
  for (const auto& o : outputs_)
    check_guard(o.guard_offset, o.guard_bytes, "past the end of output '" + o.spec->name + "' (its alignment padding included)");
  return r;
}

Evaluation GpuEvaluator::EvaluateCompiled(const Candidate& candidate, const CompileResult& compiled) {
  auto t0 = Clock::now();
  Evaluation e;
  e.device = info_.name;
  e.compile_log = compiled.log;
  e.compile_s = compiled.seconds;
  for (const auto& k : compiled.kernels) e.resources.push_back(k.resources);
  auto finish = [&](EvalStatus st, const std::string& msg) {
    e.status = st;
    e.message = msg;
    e.worker_log = TakeWorkerLog();
    e.eval_s = std::chrono::duration<double>(Clock::now() - t0).count();
    return e;
  };
  if (!compiled.ok) return finish(EvalStatus::kCompileError, compiled.message);
  PlanLimits limits;
  if (info_.shared_per_block_optin > 0) limits.max_shared_bytes_per_block = info_.shared_per_block_optin;
  auto plan = ResolvePlan(candidate.plan_json, ref_.signature, compiled.kernels, limits);
  if (!plan.ok()) return finish(EvalStatus::kInvalidPlan, plan.status().message());
  e.launches = plan->Summary();
  if (!worker_ready_) {
    if (Status s = StartWorker(); !s.ok()) return finish(EvalStatus::kRuntimeError, "evaluator: " + s.message());
  }
  // The load request: tensor arguments become arena offsets, one per input set.
  json launches = json::array();
  for (const auto& l : plan->launches) {
    json args = json::array();
    for (const auto& a : l.args) {
      switch (a.kind) {
        case ArgValue::Kind::kTensor: {
          std::vector<uint64_t> offs;
          for (size_t s = 0; s < set_inputs_.size(); ++s) {
            uint64_t off = 0;
            for (const auto& slot : set_inputs_[s]) if (slot.name == a.name) off = slot.offset;
            for (const auto& slot : params_) if (slot.name == a.name) off = slot.offset;
            for (const auto& o : outputs_) if (o.spec->name == a.name) off = o.offset;
            offs.push_back(off);
          }
          args.push_back({{"k", "tensor"}, {"offsets", offs}});
          break;
        }
        case ArgValue::Kind::kScratch: {
          int idx = 0;
          for (size_t i = 0; i < plan->scratch.size(); ++i) if (plan->scratch[i].name == a.name) idx = static_cast<int>(i);
          args.push_back({{"k", "scratch"}, {"i", idx}});
          break;
        }
        case ArgValue::Kind::kInt32: args.push_back({{"k", "i32"}, {"v", a.i}}); break;
        case ArgValue::Kind::kInt64: args.push_back({{"k", "i64"}, {"v", a.i}}); break;
        case ArgValue::Kind::kFloat32: args.push_back({{"k", "f32"}, {"v", a.f}}); break;
        case ArgValue::Kind::kFloat64: args.push_back({{"k", "f64"}, {"v", a.f}}); break;
      }
    }
    json lj{{"kernel", l.kernel}, {"grid", l.grid}, {"block", l.block}, {"shared", l.shared_bytes}, {"args", args}};
    if (l.cluster) lj["cluster"] = *l.cluster;
    launches.push_back(lj);
  }
  json scratch = json::array();
  for (const auto& s : plan->scratch) scratch.push_back(s.bytes);
  json globals = json::array();
  for (const auto& g : compiled.globals) globals.push_back({{"name", g.name}, {"size", g.size}});
  json load{{"cmd", "load"}, {"cubin", Base64Encode(compiled.cubin)}, {"launches", launches}, {"scratch", scratch},
            {"globals", globals}};
  if (Status s = SendMessage(worker_.stdin_fd(), load); !s.ok()) {
    StopWorker("send failed");
    return finish(EvalStatus::kRuntimeError, "the worker is gone: " + s.message());
  }
  auto reply = ReceiveMessage(worker_.stdout_fd(), 60);
  if (!reply.ok()) {
    StopWorker("load failed");
    return finish(EvalStatus::kLaunchError, "loading the module: " + reply.status().message());
  }
  if (!(*reply).value("ok", false)) {
    if ((*reply).value("fatal", false)) StopWorker("fatal");
    return finish(EvalStatus::kLaunchError, (*reply).value("message", "load failed"));
  }
  const json occupancy = (*reply).value("occupancy", json::array());

  const int sets = static_cast<int>(ref_.sets.size());
  std::map<std::string, OutputError> worst;
  auto keep_worst = [&](const std::vector<OutputError>& errs) {
    for (const auto& er : errs) {
      auto it = worst.find(er.name);
      if (it == worst.end() || er.rel_norm > it->second.rel_norm || er.mismatches > it->second.mismatches)
        worst[er.name] = er;
    }
  };
  auto take_errors = [&] {
    e.errors.clear();
    for (const auto& o : outputs_)
      if (worst.count(o.spec->name)) e.errors.push_back(worst[o.spec->name]);
  };
  auto unload = [&] {
    if (worker_ready_) {
      (void)SendMessage(worker_.stdin_fd(), {{"cmd", "unload"}});
      if (!ReceiveMessage(worker_.stdout_fd(), 30).ok()) StopWorker("unload failed");
    }
  };
  // Repeated runs on one input set must give the same bits (stops races that
  // pass only sometimes, and answers that depend on timing), unless the
  // kernel uses atomics, whose order may vary: then the tolerance alone holds.
  const bool atomics = PtxUsesAtomics(compiled.ptx);
  std::vector<std::vector<std::optional<uint64_t>>> first_bits(sets, std::vector<std::optional<uint64_t>>(outputs_.size()));
  auto run = [&](int set) {
    RunResult r = RunOnce(set);
    if (r.status != EvalStatus::kCorrect) return r;
    for (size_t i = 0; i < outputs_.size() && i < r.hashes.size(); ++i) {
      auto& seen = first_bits[set][i];
      if (!seen) {
        seen = r.hashes[i];
      } else if (*seen != r.hashes[i] && !atomics) {
        r.status = EvalStatus::kIncorrect;
        r.message = "output '" + outputs_[i].spec->name + "' differs bit for bit between two runs on input set " +
                    std::to_string(set) + " although the kernel uses no atomics: a race, a read of memory " +
                    "nothing wrote, or a result that depends on timing";
        break;
      }
    }
    return r;
  };
  // Correctness on every input set first.
  std::vector<double> first_ms;
  for (int s = 0; s < sets; ++s) {
    RunResult r = run(s);
    keep_worst(r.errors);
    if (r.status != EvalStatus::kCorrect) {
      take_errors();
      if (r.status == EvalStatus::kIncorrect) {
        // Report the failing run's own figures.
        e.errors = r.errors;
      }
      unload();
      return finish(r.status, r.message);
    }
    first_ms.push_back(r.ms);
  }
  // Warm-up, then timed runs; every one of them is verified too.
  double estimate = std::max(Summarize(first_ms).median_ms, 1e-3);
  double warm_total = 0;
  std::vector<double> warm_ms;
  int run_index = 0;
  auto phase_start = Clock::now();
  for (int w = 0; w < 3 || warm_total < opts_.warmup_ms; ++w) {
    RunResult r = run(run_index++ % sets);
    keep_worst(r.errors);
    if (r.status != EvalStatus::kCorrect) {
      take_errors();
      unload();
      return finish(r.status, "warm-up run " + std::to_string(w) + ": " + r.message);
    }
    warm_total += r.ms;
    warm_ms.push_back(r.ms);
    if (w >= 1000) break;  // same cap as the reference's timing.py
  }
  // As timing.py does: the run count comes from the median warm-up time.
  estimate = std::max(Summarize(warm_ms).median_ms, 1e-3);
  int n = static_cast<int>(std::ceil(opts_.target_timed_ms / std::max(estimate, 1e-3)));
  n = std::clamp(n, opts_.min_timed_runs, opts_.max_timed_runs);
  std::vector<double> ms, ms_device;
  for (int i = 0; i < n; ++i) {
    RunResult r = run(run_index++ % sets);
    keep_worst(r.errors);
    if (r.status != EvalStatus::kCorrect) {
      take_errors();
      if (r.status == EvalStatus::kIncorrect) e.errors = r.errors;
      unload();
      return finish(r.status, "timed run " + std::to_string(i) + ": " + r.message);
    }
    ms.push_back(r.ms);
    ms_device.push_back(r.ms_device);
    if (static_cast<int>(ms.size()) >= opts_.min_timed_runs &&
        std::chrono::duration<double>(Clock::now() - phase_start).count() > opts_.max_eval_s)
      break;
  }
  // Each launch on its own, in runs of their own after the timed ones.
  Roofline rf;
  rf.bytes = static_cast<double>(ref_.signature.MinimumBytes());
  rf.flops = ref_.signature.flops.value_or(0);
  rf.peak_gbps = bandwidth_gbps_;
  if (rf.flops > 0) {
    rf.compute_class = ComputeClassFor(ref_.signature);
    if (opts_.peak_tflops > 0) {
      rf.peak_tflops = opts_.peak_tflops;
    } else if (peaks_ && peaks_->ok()) {
      rf.peak_tflops = (*peaks_)->For(rf.compute_class);
    }
    if (rf.peak_tflops <= 0) rf.compute_class.clear();
  }
  {
    RunResult failed;
    auto profiles = ProfileLaunches(*plan, occupancy, rf, run_index, &failed);
    if (!profiles.ok()) {
      keep_worst(failed.errors);
      take_errors();
      if (failed.status == EvalStatus::kIncorrect) e.errors = failed.errors;
      unload();
      return finish(failed.status, "profile run: " + failed.message);
    }
    e.launch_profiles = std::move(*profiles);
  }
  unload();
  take_errors();
  // Every input set, not only the one each run read: a run must not plant
  // data in another set's buffers (or their padding) for a later run to find.
  if (auto diff = CountDiffWords(arena_.get(), pristine_.get(), inputs_end_); !diff.ok()) {
    return finish(EvalStatus::kRuntimeError, "evaluator: " + diff.status().message());
  } else if (*diff) {
    d_->cuMemcpyDtoD(arena_.get(), pristine_.get(), inputs_end_);
    return finish(EvalStatus::kIncorrect, "the candidate modified " + std::to_string(*diff) +
                                              " 4-byte words of the input buffers (another input set's, or padding)");
  }
  // As timing.py: the on-stream series, unless work consistently outlived the stream.
  constexpr double kSyncSlackMs = 0.1;
  double on_stream = Summarize(ms).median_ms, device_wide = Summarize(ms_device).median_ms;
  e.timing = Summarize(device_wide - on_stream > kSyncSlackMs + 0.1 * on_stream ? ms_device : ms);
  e.eager = ref_.eager;
  e.compiled = ref_.compiled;
  if (ref_.eager && e.timing->median_ms > 0) e.speedup_eager = ref_.eager->median_ms / e.timing->median_ms;
  if (ref_.compiled && e.timing->median_ms > 0) e.speedup_compile = ref_.compiled->median_ms / e.timing->median_ms;
  double sec = e.timing->median_ms * 1e-3;
  rf.achieved_gbps = sec > 0 ? rf.bytes / sec / 1e9 : 0;
  rf.achieved_tflops = sec > 0 ? rf.flops / sec / 1e12 : 0;
  double floor_bw = bandwidth_gbps_ > 0 ? rf.bytes / (bandwidth_gbps_ * 1e9) * 1e3 : 0;
  double floor_fl = rf.peak_tflops > 0 ? rf.flops / (rf.peak_tflops * 1e12) * 1e3 : 0;
  rf.floor_ms = std::max(floor_bw, floor_fl);
  rf.bound = floor_fl > floor_bw ? "compute" : "memory";
  rf.fraction_of_floor = e.timing->median_ms > 0 ? rf.floor_ms / e.timing->median_ms : 0;
  e.roofline = rf;
  return finish(EvalStatus::kCorrect, "");
}

StatusOr<std::vector<LaunchProfile>> GpuEvaluator::ProfileLaunches(const ResolvedPlan& plan, const json& occupancy,
                                                                   const Roofline& plan_roofline, int first_run,
                                                                   RunResult* failed) {
  // Few runs: the events inside the plan cost a few microseconds each, and
  // these figures guide a model, they do not rank candidates.
  constexpr int kProfileRuns = 5;
  const int sets = static_cast<int>(ref_.sets.size());
  const size_t n = plan.launches.size();
  std::vector<std::vector<double>> launch_ms(n);
  for (int i = 0; i < kProfileRuns; ++i) {
    RunResult r = RunOnce((first_run + i) % sets, /*split=*/true);
    if (r.status != EvalStatus::kCorrect) {
      *failed = std::move(r);
      return Internal("profile run failed");
    }
    if (r.launch_ms.size() != n) {
      failed->status = EvalStatus::kRuntimeError;
      failed->message = "evaluator: the worker reported " + std::to_string(r.launch_ms.size()) +
                        " launch times for " + std::to_string(n) + " launches";
      return Internal(failed->message);
    }
    for (size_t l = 0; l < n; ++l) launch_ms[l].push_back(r.launch_ms[l]);
  }
  SmLimits sm{info_.registers_per_sm, info_.max_registers_per_block, info_.shared_per_sm,
              info_.reserved_shared_per_block, info_.max_threads_per_sm, info_.max_blocks_per_sm};
  std::vector<std::string> kernels;
  std::vector<double> bytes;
  std::vector<std::optional<Occupancy>> occ;
  for (size_t l = 0; l < n; ++l) {
    const PlannedLaunch& pl = plan.launches[l];
    kernels.push_back(pl.kernel);
    // Each distinct buffer the launch is passed, once: what it could move at
    // least if it touches all of them (a launch may touch only part of one).
    std::set<std::string> seen;
    double b = 0;
    for (const ArgValue& a : pl.args) {
      if (!seen.insert(a.name).second) continue;
      if (a.kind == ArgValue::Kind::kTensor) {
        if (const TensorSpec* t = ref_.signature.Find(a.name)) b += static_cast<double>(t->bytes());
      } else if (a.kind == ArgValue::Kind::kScratch) {
        for (const auto& s : plan.scratch)
          if (s.name == a.name) b += static_cast<double>(s.bytes);
      }
    }
    bytes.push_back(b);
    std::optional<Occupancy> o;
    if (occupancy.is_array() && l < occupancy.size() && occupancy[l].value("blocks_per_sm", -1) >= 0) {
      const json& j = occupancy[l];
      Occupancy v;
      v.blocks_per_sm = j.value("blocks_per_sm", 0);
      v.threads_per_block = j.value("threads", 0);
      v.registers = std::max(0, j.value("registers", 0));
      v.shared_bytes = std::max(0, j.value("static_shared", 0)) + j.value("dynamic_shared", int64_t{0});
      v.cluster_size = j.value("cluster_size", 0);
      v.max_active_clusters = j.value("max_active_clusters", -1);
      ExplainOccupancy(sm, &v);
      o = v;
    }
    occ.push_back(o);
  }
  return BuildLaunchProfiles(kernels, launch_ms, bytes, plan_roofline.flops, plan_roofline.peak_gbps,
                             plan_roofline.peak_tflops, occ);
}

StatusOr<std::vector<Evaluation>> GpuEvaluator::EvaluateBatch(const std::vector<Candidate>& candidates) {
  // Compiles run in parallel (each in its own ks-worker compile child); GPU
  // work follows in order, starting as soon as each compile is done.
  std::vector<std::promise<StatusOr<CompileResult>>> promises(candidates.size());
  std::vector<std::future<StatusOr<CompileResult>>> futures;
  for (auto& p : promises) futures.push_back(p.get_future());
  std::atomic<size_t> next{0};
  CompileOptions co;
  co.arch = arch_;
  co.worker_path = opts_.worker_path;
  co.timeout_s = opts_.compile_timeout_s;
  std::vector<std::thread> pool;
  int threads = std::max(1, std::min<int>(opts_.compile_threads, static_cast<int>(candidates.size())));
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < candidates.size();) promises[i].set_value(CompileCandidate(candidates[i].source, co));
    });
  std::vector<Evaluation> out;
  Status failure;
  for (size_t i = 0; i < candidates.size(); ++i) {
    auto compiled = futures[i].get();
    if (!compiled.ok()) {
      if (failure.ok()) failure = compiled.status();
      continue;
    }
    if (failure.ok()) out.push_back(EvaluateCompiled(candidates[i], *compiled));
  }
  for (auto& t : pool) t.join();
  if (!failure.ok()) return failure;
  return out;
}

}  // namespace ks
