// Setup (the arena layout, the reference on the device), the evaluation of a
// candidate as its phases in order, and of a batch. The worker, loading a
// candidate and one run: gpu_evaluator_runs.cc; correctness and the checks of
// outputs and inputs: gpu_evaluator_verify.cc; warm-up, timed runs, the launch
// profile and the figures: gpu_evaluator_timing.cc; distribution-shifted sets
// and other shapes: gpu_evaluator_robust.cc.
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
#include <random>
#include <set>
#include <thread>

#include "common/base64.h"
#include "common/files.h"
#include "common/unique_fd.h"
#include "evaluator/plan/launch_plan.h"
#include "evaluator/profile/roofline.h"
#include "evaluator/worker/sandbox.h"
#include "evaluator/worker/worker_protocol.h"

#include "evaluator/gpu_evaluator_internal.h"

namespace ks {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace gpu_internal;  // NOLINT: the evaluator's own internals

int CompileThreadsPerGpu(size_t gpus) {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, (std::max(cores, 2) - 1) / static_cast<int>(std::max<size_t>(gpus, 1)));
}

GpuEvaluator::GpuEvaluator(const ReferenceData& ref, const GpuEvaluatorOptions& opts)
    : ref_(ref),
      opts_(opts),
      arena_(Arena::Helpers{
          [this](CUdeviceptr p, uint64_t n, size_t width) { return HashRange(p, n, width); },
          [this](CUdeviceptr a, CUdeviceptr b, uint64_t bytes) { return CountDiffWords(a, b, bytes); },
          [this](CUdeviceptr p, uint64_t bytes, uint8_t fill) { return CountNotFill(p, bytes, fill); }}),
      worker_(opts.worker_path, opts.drop_privileges, opts.worker_log_cap) {}

// The worker ends before anything it maps or runs with is released.
GpuEvaluator::~GpuEvaluator() { worker_.Close(); }

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

StatusOr<std::vector<float>> GpuEvaluator::ReadBound(int set, const std::string& key, int64_t blocks) {
  std::vector<float> v(static_cast<size_t>(blocks));
  const uint64_t bytes = static_cast<uint64_t>(blocks) * 4;
  if (ref_.resident) {
    KS_ASSIGN_OR_RETURN(CUdeviceptr src, ResidentTensorPtr(set, key, bytes));
    if (bytes) KS_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyDtoH(v.data(), src, bytes), "cuMemcpyDtoH"));
    return v;
  }
  KS_ASSIGN_OR_RETURN(std::string path, ref_.FilePath(set, key));
  KS_ASSIGN_OR_RETURN(std::string data, ReadFile(path, bytes + 1));
  if (data.size() != bytes) return InvalidArgument(path + ": a bound array of the wrong size");
  std::memcpy(v.data(), data.data(), bytes);
  return v;
}

Status GpuEvaluator::LoadBounds() {
  const std::string level = ContractLevel(contract_);
  for (auto& o : outputs_) {
    o.bounds.clear();
    o.bounds.resize(ref_.sets.size());
    o.bound_rel_norm.assign(ref_.sets.size(), 0);
    if (!IsFloating(o.spec->dtype)) continue;
    const int64_t blocks = (o.spec->numel() + kBoundBlock - 1) / kBoundBlock;
    for (size_t s = 0; s < ref_.sets.size(); ++s) {
      const ReferenceSet& rs = ref_.sets[s];
      const std::string highest_key = BoundKey(o.spec->name, "highest");
      if (rs.truth != "float64" || (!ref_.resident && !rs.files.count(highest_key))) continue;
      auto highest = ReadBound(static_cast<int>(s), highest_key, blocks);
      if (!highest.ok()) {
        if (ref_.resident) continue;  // a resident set without bounds: judged as a float32 truth would be
        return highest.status();
      }
      std::vector<float> at_level;
      if (level != "highest") {
        const std::string key = BoundKey(o.spec->name, level);
        if (ref_.resident || rs.files.count(key)) {
          auto l = ReadBound(static_cast<int>(s), key, blocks);
          if (l.ok()) at_level = std::move(*l);
        }
      }
      std::vector<float> combined = CombineBounds(contract_, *highest, at_level);
      double sum_sq = 0;
      for (size_t b = 0; b < combined.size(); ++b) {
        const double in_block = std::min<double>(kBoundBlock, static_cast<double>(o.spec->numel()) - b * kBoundBlock);
        sum_sq += in_block * static_cast<double>(combined[b]) * combined[b];
      }
      const double rms = s < o.ref_rms.size() ? o.ref_rms[s] : 0;
      if (rms > 0 && std::isfinite(rms) && o.spec->numel() > 0)
        o.bound_rel_norm[s] = std::sqrt(sum_sq / static_cast<double>(o.spec->numel())) / rms;
      KS_ASSIGN_OR_RETURN(o.bounds[s], DeviceBuffer::Alloc(std::max<size_t>(combined.size() * 4, 4)));
      if (!combined.empty())
        KS_RETURN_IF_ERROR(
            d_->Check(d_->cuMemcpyHtoD(o.bounds[s].get(), combined.data(), combined.size() * 4), "cuMemcpyHtoD"));
    }
  }
  return Status::Ok();
}

void GpuEvaluator::SetupPhase(const std::string& name) {
  const auto now = Clock::now();
  setup_phases_.emplace_back(name, std::chrono::duration<double>(now - setup_mark_).count());
  setup_mark_ = now;
}

Status GpuEvaluator::Setup() {
  setup_phases_.clear();
  setup_mark_ = Clock::now();
  KS_ASSIGN_OR_RETURN(contract_, ParseContract(opts_.precision));
  KS_ASSIGN_OR_RETURN(d_, CudaDriver::Get());
  KS_ASSIGN_OR_RETURN(ctx_, PrimaryContext::Open(opts_.device));
  KS_ASSIGN_OR_RETURN(info_, QueryDevice(ctx_.device()));
  // Candidates compile for the arch-specific target (sm_90a), so that wgmma,
  // setmaxnreg and the other Hopper-only instructions assemble instead of
  // being silently skipped behind a __CUDA_ARCH_FEAT_SM90_ALL guard.
  arch_ = opts_.target.empty() ? ArchSpecificTarget(info_.Arch()) : opts_.target;
  SetupPhase("context");
  // The worker's process now: its driver start (its own context) runs while
  // the steps below do; it is told the arena and the helpers at the end.
  KS_RETURN_IF_ERROR(worker_.Spawn(opts_.device));
  SetupPhase("worker spawn");
  KS_ASSIGN_OR_RETURN(HelperCubinOrigin helpers_from, LoadHelpers());
  SetupPhase(helpers_from == HelperCubinOrigin::kCompiled
                 ? "helper kernels (compile)"
                 : std::string("helper kernels (from ") + HelperCubinOriginName(helpers_from) + ")");
  ChooseResidentCopy();
  const int sets = static_cast<int>(ref_.sets.size());
  if (sets == 0) return InvalidArgument("reference has no input sets");
  KS_RETURN_IF_ERROR(LayOutMemory());
  KS_RETURN_IF_ERROR(FillMemory());  // no set staged
  KS_RETURN_IF_ERROR(arena_.StageSet(0));
  KS_RETURN_IF_ERROR(PlaceReferenceOutputs());
  KS_RETURN_IF_ERROR(LoadBounds().WithContext("the reference's bound arrays"));
  CUipcMemHandle h;
  KS_RETURN_IF_ERROR(d_->Check(d_->cuIpcGetMemHandle(&h, arena_.base()), "cuIpcGetMemHandle"));
  ipc_handle_.assign(reinterpret_cast<const char*>(&h), sizeof h);
  SetupPhase("arena (layout, fill, stage, outputs, bounds)");
  if (!correctness_only_) {  // never timed: no bandwidth, no peaks
    // The probe and the peaks measure a GPU that no context creation disturbs.
    KS_RETURN_IF_ERROR(worker_.AwaitSpawned());
    SetupPhase("worker context (wait)");
    KS_RETURN_IF_ERROR(MeasureBandwidth());
    SetupPhase("bandwidth probe");
    if (opts_.peak_tflops <= 0 && opts_.measure_peaks && ref_.signature.flops.value_or(0) > 0) {
      (void)Peaks();
      SetupPhase("peaks");
    }
    KS_RETURN_IF_ERROR(SetupOtherShapes());
    if (!ref_.shape_variants.empty()) SetupPhase("other shapes");
  }
  KS_RETURN_IF_ERROR(StartWorker());
  SetupPhase("worker start");
  return Status::Ok();
}

void GpuEvaluator::ChooseResidentCopy() {
  // Bus ids, not device ordinals: an IPC mapping's ordinal is the importing
  // context's on some drivers (two H100s, 4781f3b). Where either id is
  // unknown the tensors stay mapped, as on one GPU.
  const std::string theirs = ref_.resident ? ref_.resident->pci_bus_id() : "";
  own_copy_ = !theirs.empty() && !info_.pci_bus_id.empty() && !SameBusId(theirs, info_.pci_bus_id);
}

// The trusted helper kernels (kHelperSource), and the hash key no candidate
// sees. The cubin is cached (helper_cache.h) under a key of the source, the
// target and the compiler: only this trusted source, never a candidate's.
StatusOr<HelperCubinOrigin> GpuEvaluator::LoadHelpers() {
  CompileOptions co;
  co.arch = arch_;
  co.worker_path = opts_.worker_path;
  KS_ASSIGN_OR_RETURN(std::string worker, FindWorker(co.worker_path));
  KS_ASSIGN_OR_RETURN(std::string cuda_home, FindCudaHome(co.cuda_home));
  const std::string key = HelperCacheKey(kHelperSource, arch_, HelperCompilerId(worker, cuda_home));
  auto compile = [&]() -> StatusOr<std::string> {
    KS_ASSIGN_OR_RETURN(CompileResult helpers, CompileCandidate(kHelperSource, co));
    if (!helpers.ok) return Internal("evaluator helper kernels do not compile: " + helpers.message + "\n" + helpers.log);
    return std::move(helpers.cubin);
  };
  KS_ASSIGN_OR_RETURN(HelperCubin helpers,
                      GetHelperCubin(key, opts_.helper_cache_dir, compile,
                                     [this](const std::string& cubin) { return BindHelpers(cubin); }));
  helpers_cubin_ = std::move(helpers.cubin);
  std::random_device rd;
  for (uint64_t& k : hash_key_) k = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return helpers.origin;
}

Status GpuEvaluator::BindHelpers(const std::string& cubin) {
  KS_ASSIGN_OR_RETURN(helpers_, Module::Load(cubin));
  for (int i = 0; i < 9; ++i) {
    KS_ASSIGN_OR_RETURN(cmp_fn_[i], helpers_.Function(kCmpNames[i]));
    cmp_grid_[i] = HelperGrid(cmp_fn_[i]);
  }
  KS_ASSIGN_OR_RETURN(diff_words_, helpers_.Function("diff_words"));
  KS_ASSIGN_OR_RETURN(count_not_fill_, helpers_.Function("count_not_fill"));
  for (int i = 0; i < 4; ++i) {
    KS_ASSIGN_OR_RETURN(hash_fn_[i], helpers_.Function(kHashNames[i]));
    hash_grid_[i] = HelperGrid(hash_fn_[i]);
  }
  return Status::Ok();
}

// The arena's layout (evaluator/arena.h): a resident reference's tensors
// serve as the pristine copy where this evaluator maps them (not own_copy_).
Status GpuEvaluator::LayOutMemory() {
  KS_RETURN_IF_ERROR(arena_.LayOut(ref_, ref_.resident && !own_copy_,
                                   [this](int set, const std::string& name, uint64_t bytes) {
                                     return ResidentTensorPtr(set, name, bytes);
                                   }));
  outputs_.clear();
  const auto& regions = arena_.outputs();
  for (size_t i = 0; i < ref_.signature.outputs.size(); ++i) {
    OutputSlot o;
    o.spec = &ref_.signature.outputs[i];
    o.offset = regions[i].offset;
    o.bytes = regions[i].bytes;
    o.guard_offset = regions[i].guard_offset;
    o.guard_bytes = regions[i].guard_bytes;
    outputs_.push_back(std::move(o));
  }
  return Status::Ok();
}

// The arena and the pristine copy allocated, guards written, every set's
// inputs and parameters filled in; the helpers' result buffer.
Status GpuEvaluator::FillMemory() {
  KS_RETURN_IF_ERROR(arena_.Allocate());
  KS_ASSIGN_OR_RETURN(stats_, DeviceBuffer::Alloc(sizeof(Stats)));
  return arena_.Fill(ref_, [this](int set, const std::string& name, CUdeviceptr dst, uint64_t bytes) {
    return FillTensor(set, name, dst, bytes);
  });
}

// Each output's reference on every set, and its RMS.
Status GpuEvaluator::PlaceReferenceOutputs() {
  const int sets = static_cast<int>(ref_.sets.size());
  for (auto& o : outputs_)
    for (int s = 0; s < sets; ++s) {
      if (ref_.resident && !own_copy_) {
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
  return Status::Ok();
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


wire::LoadRequest GpuEvaluator::BuildLoadRequest(const ResolvedPlan& plan, const CompileResult& compiled) const {
  auto index_of = [](const auto& list, const std::string& name) {
    int found = -1;
    for (size_t i = 0; i < list.size() && found < 0; ++i)
      if (list[i].name == name) found = static_cast<int>(i);
    KS_CHECK(found >= 0);  // ResolvePlan resolved every name against these lists
    return found;
  };
  wire::LoadRequest req;
  req.cubin = compiled.cubin;
  for (const auto& l : plan.launches) {
    wire::Launch w;
    w.kernel = l.kernel;
    for (int d = 0; d < 3; ++d) {
      w.shape.grid[d] = static_cast<uint32_t>(l.grid[d]);
      w.shape.block[d] = static_cast<uint32_t>(l.block[d]);
    }
    w.shape.shared_bytes = static_cast<uint32_t>(l.shared_bytes);
    if (l.cluster)
      w.shape.cluster = std::array<uint32_t, 3>{static_cast<uint32_t>((*l.cluster)[0]),
                                                static_cast<uint32_t>((*l.cluster)[1]),
                                                static_cast<uint32_t>((*l.cluster)[2])};
    for (const auto& a : l.args) {
      wire::Arg arg;
      switch (a.kind) {
        case ArgValue::Kind::kTensor: arg.kind = wire::Arg::Kind::kTensor; arg.offsets = arena_.ArenaOffsets(a.name); break;
        case ArgValue::Kind::kScratch: arg.kind = wire::Arg::Kind::kScratch; arg.index = index_of(plan.scratch, a.name); break;
        case ArgValue::Kind::kTensorMap:
          arg.kind = wire::Arg::Kind::kTensorMap;
          arg.index = index_of(plan.tensor_maps, a.name);
          break;
        case ArgValue::Kind::kInt32: arg.kind = wire::Arg::Kind::kI32; arg.i = a.i; break;
        case ArgValue::Kind::kInt64: arg.kind = wire::Arg::Kind::kI64; arg.i = a.i; break;
        case ArgValue::Kind::kFloat32: arg.kind = wire::Arg::Kind::kF32; arg.f = a.f; break;
        case ArgValue::Kind::kFloat64: arg.kind = wire::Arg::Kind::kF64; arg.f = a.f; break;
      }
      w.args.push_back(std::move(arg));
    }
    req.launches.push_back(std::move(w));
  }
  for (const auto& s : plan.scratch) req.scratch_bytes.push_back(static_cast<uint64_t>(s.bytes));
  for (const auto& m : plan.tensor_maps) {
    wire::TensorMap t;
    t.spec = m;
    if (m.scratch) t.scratch = index_of(plan.scratch, m.tensor);
    else t.offsets = arena_.ArenaOffsets(m.tensor);
    req.tensor_maps.push_back(std::move(t));
  }
  for (const auto& g : compiled.globals) req.globals.push_back({g.name, g.size});
  return req;
}

GpuEvaluator::Judgement::Judgement(const Candidate& c, const CompileResult& r)
    : candidate(c), compiled(r), started(Clock::now()), phase_mark(started) {}

void GpuEvaluator::Judgement::Phase(const char* name) {
  auto now = Clock::now();
  e.phases.emplace_back(name, std::chrono::duration<double>(now - phase_mark).count());
  phase_mark = now;
}

void GpuEvaluator::Judgement::KeepWorst(const std::vector<OutputError>& errors) {
  for (const auto& er : errors) {
    auto it = worst.find(er.name);
    if (it == worst.end() || er.rel_norm > it->second.rel_norm || er.mismatches > it->second.mismatches)
      worst[er.name] = er;
  }
}

// The candidate through the phases (gpu_evaluator.h, Judgement), in order:
// any phase may end it with its result.
Evaluation GpuEvaluator::EvaluateCompiled(const Candidate& candidate, const CompileResult& compiled) {
  if (Status st = ctx_.MakeCurrent(); !st.ok()) {
    Evaluation e;
    e.status = EvalStatus::kRuntimeError;
    e.message = "evaluator: the GPU context: " + st.message();
    return e;
  }
  Judgement j(candidate, compiled);
  parts_ = RunParts{};
  repeat_by_hash_ = false;  // until CheckCorrectness knows the kernel has no atomics
  verified_.clear();
  j.e.device = info_.name;
  j.e.target = arch_;
  j.e.compile_log = compiled.log;
  j.e.compile_s = compiled.seconds;
  for (const auto& k : compiled.kernels) j.e.resources.push_back(k.resources);
  if (!compiled.ok) return Conclude(j, EvalStatus::kCompileError, compiled.message);
  if (auto done = LoadCandidate(j)) return std::move(*done);
  if (auto done = CheckCorrectness(j)) return std::move(*done);
  if (correctness_only_) {  // another shape of the problem (CheckOtherShapes): held
    UnloadCandidate();
    return Conclude(j, EvalStatus::kCorrect, "");
  }
  if (auto done = CheckRobustness(j)) return std::move(*done);
  if (auto done = WarmUpPhase(j)) return std::move(*done);
  if (auto done = TimedRuns(j)) return std::move(*done);
  if (auto done = ProfilePhase(j)) return std::move(*done);
  if (auto done = FinalChecks(j)) return std::move(*done);
  ChooseTiming(j);
  j.Phase("final_checks");
  ReportSpeed(j);
  return Conclude(j, EvalStatus::kCorrect, "");
}

Evaluation GpuEvaluator::Conclude(Judgement& j, EvalStatus status, const std::string& message) {
  NamePrecisionContract(j.e);  // in every result, whatever its status
  j.e.status = status;
  j.e.message = message;
  j.e.worker_log = worker_.TakeLog();
  j.e.eval_s = std::chrono::duration<double>(Clock::now() - j.started).count();
  repeat_by_hash_ = false;  // the verified runs were this candidate's
  verified_.clear();
  if (parts_.runs > 0)
    j.e.run_parts = {{"stage", parts_.stage},     {"worker", parts_.worker}, {"kernel", parts_.kernel},
                     {"compare", parts_.compare}, {"inputs", parts_.inputs}, {"guards", parts_.guards},
                     {"final_inputs", parts_.final_inputs}, {"runs", static_cast<double>(parts_.runs)}};
  return std::move(j.e);
}

Evaluation GpuEvaluator::FailRun(Judgement& j, const RunResult& r, const std::string& message, bool own_errors) {
  TakeErrors(j);
  if (own_errors && r.status == EvalStatus::kIncorrect) j.e.errors = r.errors;  // the failing run's own figures
  UnloadCandidate();
  return Conclude(j, r.status, message);
}

void GpuEvaluator::TakeErrors(Judgement& j) const {
  j.e.errors.clear();
  for (const auto& o : outputs_)
    if (auto it = j.worst.find(o.spec->name); it != j.worst.end()) j.e.errors.push_back(it->second);
}

void GpuEvaluator::UnloadCandidate() {
  if (!worker_.ready()) return;
  (void)worker_.Send(wire::UnloadRequest{});
  if (!worker_.Receive<wire::EmptyReply>(30).received.ok()) worker_.Stop();  // unload failed
}

StatusOr<Evaluation> GpuEvaluator::CompileOnly(const Candidate& candidate) {
  CompileOptions co;
  co.arch = arch_;
  co.worker_path = opts_.worker_path;
  co.timeout_s = opts_.compile_timeout_s;
  KS_ASSIGN_OR_RETURN(CompileResult compiled, CompileCandidate(candidate.source, co));
  Evaluation e;
  e.device = info_.name;
  e.target = arch_;
  e.compile_log = compiled.log;
  e.compile_s = compiled.seconds;
  for (const auto& k : compiled.kernels) e.resources.push_back(k.resources);
  if (!compiled.ok) {
    e.status = EvalStatus::kCompileError;
    e.message = compiled.message;
    return e;
  }
  PlanLimits limits;
  if (info_.shared_per_block_optin > 0) limits.max_shared_bytes_per_block = info_.shared_per_block_optin;
  auto plan = ResolvePlan(candidate.plan_json, ref_.signature, compiled.kernels, limits);
  if (!plan.ok()) {
    e.status = EvalStatus::kInvalidPlan;
    e.message = plan.status().message();
    return e;
  }
  e.launches = plan->Summary();
  e.status = EvalStatus::kCorrect;
  e.message = "compiled; not run";
  return e;
}

StatusOr<std::vector<Evaluation>> GpuEvaluator::EvaluateBatch(const std::vector<Candidate>& candidates) {
  // The caller's thread may not be the one that made the evaluator (an
  // agent's practice evaluator runs on the search's generation threads).
  KS_RETURN_IF_ERROR(ctx_.MakeCurrent().WithContext("the evaluator's GPU context"));
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
  int want = opts_.compile_threads > 0 ? opts_.compile_threads : CompileThreadsPerGpu(1);
  int threads = std::max(1, std::min<int>(want, static_cast<int>(candidates.size())));
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

std::vector<int> GpuEvaluator::CheckedSets() const {
  if (practice_) return ref_.PracticeSets();
  std::vector<int> judging(static_cast<size_t>(ref_.JudgingSets()));
  for (int s = 0; s < static_cast<int>(judging.size()); ++s) judging[s] = s;
  return judging;
}

namespace {

// practice_ for the length of one call (the evaluator is one caller at a time).
class PracticeScope {
 public:
  explicit PracticeScope(bool* flag) : flag_(flag) { *flag_ = true; }
  ~PracticeScope() { *flag_ = false; }
  PracticeScope(const PracticeScope&) = delete;
  PracticeScope& operator=(const PracticeScope&) = delete;

 private:
  bool* flag_;
};

// GpuEvaluator::PracticeView: the practice calls under CandidateEvaluator's names.
class PracticeEvaluator final : public CandidateEvaluator {
 public:
  explicit PracticeEvaluator(GpuEvaluator* ev) : ev_(ev) {}
  StatusOr<std::vector<Evaluation>> EvaluateBatch(const std::vector<Candidate>& candidates) override {
    return ev_->EvaluatePractice(candidates);
  }
  StatusOr<Evaluation> CompileOnly(const Candidate& candidate) override { return ev_->CompileOnly(candidate); }
  std::vector<CounterReport> ReadCounters(const std::vector<Candidate>& candidates) override {
    return ev_->ReadPracticeCounters(candidates);
  }
  bool CanReadCounters() const override { return ev_->CanReadCounters(); }
  std::string DeviceName() const override { return ev_->DeviceName(); }

 private:
  GpuEvaluator* const ev_;
};

}  // namespace

StatusOr<std::vector<Evaluation>> GpuEvaluator::EvaluatePractice(const std::vector<Candidate>& candidates) {
  if (!has_practice_sets())
    return FailedPrecondition("this evaluator's reference has no practice sets (ReferenceOptions::practice_sets)");
  PracticeScope scope(&practice_);
  return EvaluateBatch(candidates);
}

std::vector<CounterReport> GpuEvaluator::ReadPracticeCounters(const std::vector<Candidate>& candidates) {
  if (!has_practice_sets())
    return std::vector<CounterReport>(candidates.size(),
                                      CounterReport{{}, "this evaluator's reference has no practice sets", 0});
  PracticeScope scope(&practice_);
  return ReadCounters(candidates);
}

std::unique_ptr<CandidateEvaluator> GpuEvaluator::PracticeView() { return std::make_unique<PracticeEvaluator>(this); }

}  // namespace ks
