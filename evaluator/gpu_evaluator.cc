// Setup (the arena layout, the reference on the device), the evaluation of a
// candidate and of a batch. The worker and one run: gpu_evaluator_runs.cc;
// the checks of outputs and inputs: gpu_evaluator_verify.cc.
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
#include "evaluator/plan/launch_plan.h"
#include "evaluator/roofline.h"
#include "evaluator/sandbox.h"
#include "evaluator/plan/worker_protocol.h"

#include "evaluator/gpu_evaluator_internal.h"

namespace ks {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace gpu_internal;  // NOLINT: the evaluator's own internals

int CompileThreadsPerGpu(size_t gpus) {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::max(1, (std::max(cores, 2) - 1) / static_cast<int>(std::max<size_t>(gpus, 1)));
}

GpuEvaluator::GpuEvaluator(const ReferenceData& ref, const GpuEvaluatorOptions& opts) : ref_(ref), opts_(opts) {}

GpuEvaluator::~GpuEvaluator() {
  if (worker_.running()) {
    (void)SendMessage(worker_.stdin_fd(), wire::ToJson(wire::QuitRequest{}));
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
  // Candidates compile for the arch-specific target (sm_90a), so that wgmma,
  // setmaxnreg and the other Hopper-only instructions assemble instead of
  // being silently skipped behind a __CUDA_ARCH_FEAT_SM90_ALL guard.
  arch_ = opts_.target.empty() ? ArchSpecificTarget(info_.Arch()) : opts_.target;
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
  // A shifted set whose transform changed parameters has its own copy of
  // those (ReferenceSet::own_parameters); every other set shares params_.
  set_params_.assign(sets, params_);
  for (int s = 0; s < sets; ++s)
    for (auto& slot : set_params_[s])
      if (ref_.sets[s].OwnsParameter(slot.name)) {
        slot.offset = off;
        off = AlignUp(off + slot.bytes);
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
  for (int s = 0; s < sets; ++s)
    for (const auto& slot : set_params_[s])
      if (ref_.sets[s].OwnsParameter(slot.name))
        KS_RETURN_IF_ERROR(FillTensor(s, slot.name, arena_.get() + slot.offset, slot.bytes));
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
  if (correctness_only_) return StartWorker();  // never timed: no bandwidth, no peaks
  KS_RETURN_IF_ERROR(MeasureBandwidth());
  if (opts_.peak_tflops <= 0 && opts_.measure_peaks && ref_.signature.flops.value_or(0) > 0) (void)Peaks();
  KS_RETURN_IF_ERROR(SetupOtherShapes());
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


std::vector<uint64_t> GpuEvaluator::ArenaOffsets(const std::string& name) const {
  std::vector<uint64_t> offs;
  for (size_t s = 0; s < set_inputs_.size(); ++s) {
    uint64_t off = 0;
    for (const auto& slot : set_inputs_[s]) if (slot.name == name) off = slot.offset;
    for (const auto& slot : set_params_[s]) if (slot.name == name) off = slot.offset;
    for (const auto& o : outputs_) if (o.spec->name == name) off = o.offset;
    offs.push_back(off);
  }
  return offs;
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
        case ArgValue::Kind::kTensor: arg.kind = wire::Arg::Kind::kTensor; arg.offsets = ArenaOffsets(a.name); break;
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
    else t.offsets = ArenaOffsets(m.tensor);
    req.tensor_maps.push_back(std::move(t));
  }
  for (const auto& g : compiled.globals) req.globals.push_back({g.name, g.size});
  return req;
}

Evaluation GpuEvaluator::EvaluateCompiled(const Candidate& candidate, const CompileResult& compiled) {
  auto t0 = Clock::now();
  Evaluation e;
  e.device = info_.name;
  e.target = arch_;
  auto phase_mark = t0;
  auto phase = [&](const char* name) {
    auto now = Clock::now();
    e.phases.emplace_back(name, std::chrono::duration<double>(now - phase_mark).count());
    phase_mark = now;
  };
  e.compile_log = compiled.log;
  e.compile_s = compiled.seconds;
  for (const auto& k : compiled.kernels) e.resources.push_back(k.resources);
  auto finish = [&](EvalStatus st, const std::string& msg) {
    NamePrecisionContract(e);  // in every result, whatever its status
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
    phase("worker_start");
  }
  if (Status s = SendMessage(worker_.stdin_fd(), wire::ToJson(BuildLoadRequest(*plan, compiled))); !s.ok()) {
    StopWorker("send failed");
    return finish(EvalStatus::kRuntimeError, "the worker is gone: " + s.message());
  }
  auto reply = ReceiveMessage(worker_.stdout_fd(), 60);
  if (!reply.ok()) {
    StopWorker("load failed");
    return finish(EvalStatus::kLaunchError, "loading the module: " + reply.status().message());
  }
  if (auto err = wire::ErrorOf(*reply)) {
    if (err->fatal) StopWorker("fatal");
    // A tensor map the driver refuses is the plan's fault, like any other bad map.
    return finish(err->status == "invalid_plan" ? EvalStatus::kInvalidPlan : EvalStatus::kLaunchError,
                  err->message.empty() ? "load failed" : err->message);
  }
  auto loaded = wire::FromJson<wire::LoadReply>(*reply);
  if (!loaded.ok()) {
    StopWorker("unreadable load reply");
    return finish(EvalStatus::kRuntimeError, "evaluator: " + loaded.status().message());
  }
  const std::vector<wire::Occupancy> occupancy = loaded->occupancy;
  phase("load");

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
      (void)SendMessage(worker_.stdin_fd(), wire::ToJson(wire::UnloadRequest{}));
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
  // Correctness on every get_inputs() set first; the distribution-shifted
  // sets after them only mark a kernel specialised, and are never timed.
  const int judging = ref_.JudgingSets();
  std::vector<double> first_ms;
  for (int s = 0; s < judging; ++s) {
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
  phase("correctness");
  if (correctness_only_) {  // another shape of the problem (CheckOtherShapes): held
    unload();
    return finish(EvalStatus::kCorrect, "");
  }
  Robustness robustness;
  if (auto failed = CheckShiftedSets(run, &robustness)) {
    take_errors();
    unload();
    return finish(failed->status, failed->message);
  }
  phase("shifted_inputs");
  CheckOtherShapes(candidate, compiled, &robustness);
  phase("other_shapes");
  // Warm-up (as timing.py: at least 3 runs and warmup_ms of run time, at most
  // 1000 runs), then timed runs. Every timed run is verified.
  double estimate = std::max(Summarize(first_ms).median_ms, 1e-3);
  int run_index = 0;
  if (opts_.timing == TimingMode::kAdaptive) {
    int runs = static_cast<int>(std::clamp(std::ceil(opts_.warmup_ms / estimate), 3.0, 1000.0));
    RunResult r = WarmUp(runs, 0, estimate);
    keep_worst(r.errors);
    if (r.status != EvalStatus::kCorrect) {
      take_errors();
      if (r.status == EvalStatus::kIncorrect) e.errors = r.errors;
      unload();
      return finish(r.status, "warm-up (" + std::to_string(runs) + " runs): " + r.message);
    }
    run_index = runs;
  } else {
    double warm_total = 0;
    std::vector<double> warm_ms;
    for (int w = 0; w < 3 || warm_total < opts_.warmup_ms; ++w) {
      RunResult r = run(run_index++ % judging);
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
  }
  phase("warmup");
  int n = static_cast<int>(std::ceil(opts_.target_timed_ms / std::max(estimate, 1e-3)));
  n = std::clamp(n, opts_.min_timed_runs, opts_.max_timed_runs);
  std::vector<double> ms, ms_device;
  std::string stopped = "runs";
  auto phase_start = Clock::now();
  for (int i = 0; i < n; ++i) {
    RunResult r = run(run_index++ % judging);
    keep_worst(r.errors);
    if (r.status != EvalStatus::kCorrect) {
      take_errors();
      if (r.status == EvalStatus::kIncorrect) e.errors = r.errors;
      unload();
      return finish(r.status, "timed run " + std::to_string(i) + ": " + r.message);
    }
    ms.push_back(r.ms);
    ms_device.push_back(r.ms_device);
    const int done = static_cast<int>(ms.size());
    if (opts_.timing == TimingMode::kAdaptive) {
      if (done >= opts_.min_timed_runs && MedianStable(ms, opts_.stable_rel, opts_.stable_abs_ms) &&
          MedianStable(ms_device, opts_.stable_rel, opts_.stable_abs_ms)) {
        stopped = "stable";
        break;
      }
      // Clearly slower than the best so far: its fastest run (on the stream,
      // the smaller figure) is far above the best median. Recorded as cut short.
      if (done >= opts_.cut_min_runs && best_ms_ > 0 &&
          *std::min_element(ms.begin(), ms.end()) > opts_.cut_factor * best_ms_) {
        stopped = "slower_than_best";
        break;
      }
    }
    if (done >= opts_.min_timed_runs &&
        std::chrono::duration<double>(Clock::now() - phase_start).count() > opts_.max_eval_s) {
      stopped = "time_cap";
      break;
    }
  }
  phase("timed");
  // Each launch on its own, in runs of their own after the timed ones.
  const DevicePeaks* measured = peaks_ && peaks_->ok() ? &**peaks_ : nullptr;
  Roofline rf = PlanRoofline(ref_.signature, bandwidth_gbps_, measured, opts_.peak_tflops);
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
  phase("profile");
  unload();
  take_errors();
  // Every input set, not only the one each run read: a run must not plant
  // data in another set's buffers (or their padding) for a later run to find.
  {
    RunResult inputs;
    CheckEveryInputSet(inputs);
    if (inputs.status != EvalStatus::kCorrect) return finish(inputs.status, inputs.message);
  }
  // As timing.py: the on-stream series, unless work consistently outlived the stream.
  constexpr double kSyncSlackMs = 0.1;
  double on_stream = Summarize(ms).median_ms, device_wide = Summarize(ms_device).median_ms;
  e.timing = Summarize(device_wide - on_stream > kSyncSlackMs + 0.1 * on_stream ? ms_device : ms);
  e.timing->stopped = stopped;
  if (stopped != "slower_than_best" && (best_ms_ <= 0 || e.timing->median_ms < best_ms_)) best_ms_ = e.timing->median_ms;
  phase("final_checks");
  e.eager = ref_.eager;
  e.compiled = ref_.compiled;
  if (ref_.eager && e.timing->median_ms > 0) e.speedup_eager = ref_.eager->median_ms / e.timing->median_ms;
  if (ref_.compiled && e.timing->median_ms > 0) e.speedup_compile = ref_.compiled->median_ms / e.timing->median_ms;
  FinishRoofline(e.timing->median_ms, &rf);
  e.roofline = rf;
  e.robustness = std::move(robustness);
  return finish(EvalStatus::kCorrect, "");
}

StatusOr<std::vector<LaunchProfile>> GpuEvaluator::ProfileLaunches(const ResolvedPlan& plan,
                                                                   const std::vector<wire::Occupancy>& occupancy,
                                                                   const Roofline& plan_roofline, int first_run,
                                                                   RunResult* failed) {
  // Few runs: the events inside the plan cost a few microseconds each, and
  // these figures guide a model, they do not rank candidates.
  constexpr int kProfileRuns = 5;
  const int sets = ref_.JudgingSets();  // timed and profiled on get_inputs() sets only
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
      std::string name = a.name;
      if (a.kind == ArgValue::Kind::kTensorMap)  // counts as the tensor it walks
        for (const auto& m : plan.tensor_maps)
          if (m.name == a.name) name = m.tensor;
      if (!seen.insert(name).second) continue;
      if (a.kind == ArgValue::Kind::kTensor || a.kind == ArgValue::Kind::kTensorMap) {
        if (const TensorSpec* t = ref_.signature.Find(name)) b += static_cast<double>(t->bytes());
      }
      if (a.kind == ArgValue::Kind::kScratch || a.kind == ArgValue::Kind::kTensorMap) {
        for (const auto& s : plan.scratch)
          if (s.name == name) b += static_cast<double>(s.bytes);
      }
    }
    bytes.push_back(b);
    std::optional<Occupancy> o;
    if (l < occupancy.size() && occupancy[l].blocks_per_sm >= 0) {
      const wire::Occupancy& j = occupancy[l];
      Occupancy v;
      v.blocks_per_sm = j.blocks_per_sm;
      v.threads_per_block = j.threads;
      v.registers = std::max(0, j.registers);
      v.shared_bytes = std::max(0, j.static_shared) + j.dynamic_shared;
      v.cluster_size = j.cluster_size;
      v.max_active_clusters = j.max_active_clusters;
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


}  // namespace ks
