// The GPU evaluator's requests to its sandboxed worker (the process itself:
// worker/worker_client.h) and one run of a candidate's plan on an input set,
// verified here.
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
#include "evaluator/worker/sandbox.h"
#include "evaluator/worker/worker_protocol.h"

#include "evaluator/gpu_evaluator_internal.h"

namespace ks {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace gpu_internal;  // NOLINT: the evaluator's own internals

Status GpuEvaluator::StartWorker() { return worker_.Start(WorkerInit()); }

wire::InitRequest GpuEvaluator::WorkerInit() const {
  wire::InitRequest init;
  for (const auto& o : outputs_) {
    wire::OutputRegion region{o.offset, o.bytes, {}};
    uint64_t bits;
    PoisonFor(o.spec->dtype, &region.poison, &bits);
    init.outputs.push_back(region);
  }
  init.ipc_handle = ipc_handle_;
  init.device = opts_.device;
  init.l2_flush_bytes = static_cast<uint64_t>(std::max<int64_t>(2 * info_.l2_bytes, 64 << 20));
  init.helper_cubin = helpers_cubin_;
  init.pad_ns = kTimingPadNs;
  init.scrub_shared_bytes = static_cast<uint32_t>(info_.shared_per_block_optin);
  init.sms = static_cast<uint32_t>(info_.multiprocessors);
  init.printf_fifo_bytes = 1 << 20;
  return init;
}

double GpuEvaluator::RunTimeout() const {
  if (opts_.run_timeout_s > 0) return run_timeout_scale_ * opts_.run_timeout_s;
  // Auto: generous against what PyTorch needs for the same work, so a slow but
  // honest naive kernel finishes while a hang costs seconds, not minutes.
  double eager_s = ref_.eager ? ref_.eager->median_ms / 1e3 : 0;
  return run_timeout_scale_ * std::clamp(200 * eager_s, 2.0, 60.0);
}

GpuEvaluator::RunResult GpuEvaluator::RunOnce(int set, bool split) {
  RunResult r;
  auto fail = [&](EvalStatus st, std::string msg) {
    r.status = st;
    r.message = std::move(msg);
    return r;
  };
  {
    PartTimer t(&parts_.stage);
    if (Status s = arena_.StageSet(set); !s.ok()) return fail(EvalStatus::kRuntimeError, "evaluator: " + s.message());
  }
  ++parts_.runs;
  WorkerReply<wire::RunReply> reply;
  double limit = RunTimeout();
  {
    PartTimer t(&parts_.worker);
    // The worker is told no set: every set is staged at the same addresses.
    if (Status s = worker_.Send(wire::RunRequest{0, split}); !s.ok()) {
      worker_.Stop();  // send failed
      return fail(EvalStatus::kRuntimeError, "the worker is gone: " + s.message());
    }
    reply = worker_.Receive<wire::RunReply>(limit);
  }
  if (!ReplyOk(reply, limit, r)) return r;
  const auto& ran = reply.reply;
  if (!ran.ok()) return fail(EvalStatus::kRuntimeError, "evaluator: " + ran.status().message());
  parts_.kernel += ran->ms * 1e-3;
  r.ms = ran->ms;
  r.ms_device = ran->ms_device;
  if (split) r.launch_ms = ran->launch_ms;
  NoteStateChanged(ran->state_changed, r);
  CheckRun(set, r);
  return r;
}

GpuEvaluator::RunResult GpuEvaluator::WarmUp(int runs, int set, double estimate_ms) {
  RunResult r;
  {
    PartTimer t(&parts_.stage);
    if (Status s = arena_.StageSet(set); !s.ok()) {
      r.status = EvalStatus::kRuntimeError;
      r.message = "evaluator: " + s.message();
      return r;
    }
  }
  parts_.runs += runs;
  // Each run may take a run's limit's worth longer than the estimate says, in total.
  double limit = RunTimeout() + 10 * runs * estimate_ms * 1e-3;
  WorkerReply<wire::WarmReply> reply;
  {
    PartTimer t(&parts_.worker);
    if (Status s = worker_.Send(wire::WarmRequest{runs, 1, 0}); !s.ok()) {
      worker_.Stop();  // send failed
      r.status = EvalStatus::kRuntimeError;
      r.message = "the worker is gone: " + s.message();
      return r;
    }
    reply = worker_.Receive<wire::WarmReply>(limit);
  }
  if (!ReplyOk(reply, limit, r)) return r;
  const auto& warmed = reply.reply;
  if (!warmed.ok()) {
    r.status = EvalStatus::kRuntimeError;
    r.message = "evaluator: " + warmed.status().message();
    return r;
  }
  NoteStateChanged(warmed->state_changed, r);
  // The last run's outputs, inputs and guards, as after any run (the inputs
  // are the same set's in every warm-up run: a change by an earlier run shows).
  CheckRun(set, r);
  return r;
}

void GpuEvaluator::CheckEveryInputSet(RunResult& r) {
  // The arena holds one set (StageSet): its inputs and parameters, padding
  // included, against the pristine copy of that set.
  if (arena_.staged_set() < 0) return;
  PartTimer timer(&parts_.final_inputs);
  uint64_t changed = 0;
  Status st;
  for (const StagedSlot& slot : arena_.StagedSlots(arena_.staged_set())) {
    auto diff = arena_.ChangedWords(*slot.work, *slot.pristine, slot.hash);
    if (!diff.ok()) {
      st = diff.status();
      break;
    }
    if (*diff) st = arena_.RestoreSlot(*slot.work, *slot.pristine).WithContext("restoring an input");
    changed += *diff;
    if (!st.ok()) break;
  }
  if (!st.ok()) {
    r.status = EvalStatus::kRuntimeError;
    r.message = "evaluator: " + st.message();
  } else if (changed) {
    r.status = EvalStatus::kIncorrect;
    r.message = "the candidate modified " + std::to_string(changed) + " 4-byte words of the input buffers (or padding)";
  }
}

bool GpuEvaluator::ReplyOk(const Status& received, const std::optional<wire::ErrorReply>& error, double limit,
                           RunResult& r) {
  auto fail = [&](EvalStatus st, std::string msg) {
    r.status = st;
    r.message = std::move(msg);
    return false;
  };
  if (!received.ok()) {
    if (received.code() == Code::kDeadlineExceeded) {
      worker_.Stop();  // timeout
      return fail(EvalStatus::kTimeout, "the launch plan did not finish within " + Num(limit) +
                                            " s; the worker was killed");
    }
    std::string how = worker_.Stop();
    return fail(EvalStatus::kRuntimeError, "the worker died during the run (" + how + ")");
  }
  if (const auto& err = error) {
    if (err->fatal) worker_.Stop();
    return fail(err->status == "launch_error" ? EvalStatus::kLaunchError : EvalStatus::kRuntimeError, err->message);
  }
  return true;
}

void GpuEvaluator::NoteStateChanged(const std::vector<std::string>& changed, RunResult& r) {
  if (!changed.empty()) {
    std::string names;
    for (const auto& n : changed) names += (names.empty() ? "" : ", ") + n;
    r.status = EvalStatus::kIncorrect;
    r.message = "the kernel keeps state across runs in __device__ variable(s) " + names +
                " (each run of the plan must be independent: no cached results, no call counters)";
  }
}

void GpuEvaluator::CheckRun(int set, RunResult& r) {
  auto fail = [&](EvalStatus st, std::string msg) {
    r.status = st;
    r.message = std::move(msg);
  };
  // Verify this run: outputs, then inputs and guards.
  std::optional<PartTimer> timer(&parts_.compare);
  for (size_t oi = 0; oi < outputs_.size(); ++oi) {
    OutputSlot& o = outputs_[oi];
    OutputError e;
    bool bad = false;
    uint64_t hash = 0;
    // A verified run on this set that this one must repeat bit for bit: the
    // same hash is the same bits, so the same figures (one read, not two).
    const auto* known = set < static_cast<int>(verified_.size()) && repeat_by_hash_ ? &verified_[set][oi] : nullptr;
    bool repeated = false;
    if (known && *known) {
      auto h = HashRange(arena_.base() + o.offset, static_cast<uint64_t>(o.spec->numel()), DTypeSize(o.spec->dtype));
      if (!h.ok()) return fail(EvalStatus::kRuntimeError, "evaluator: " + h.status().message());
      repeated = *h == (*known)->hash;
      if (repeated) {
        e = (*known)->error;
        hash = *h;
      }
    }
    if (!repeated)
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
               " for " + DTypeName(t.dtype) + " (" + ref_.signature.DescribeTolerance(t) + ")";
      else
        msg += std::to_string(e.large_errors) + " of " + std::to_string(e.considered) +
               " elements that are not tiny (|ref| >= " + Num(100 * ref_.signature.ToleranceFor(t).TinyFraction()) +
               "% of the RMS) have a relative error above " + Num(e.large_rel) +
               " (at most " + Num(100 * e.large_share_cap) + "% may)";
      msg += " although every element is within atol/rtol: is it computed in a lower precision, or are small "
             "outputs skipped?";
      r.status = EvalStatus::kIncorrect;
      r.message = msg;
    } else if (bad && r.status == EvalStatus::kCorrect) {
      const TensorSpec& t = *o.spec;
      std::string msg = "output '" + t.name + "', input set " + std::to_string(set) + ": " + std::to_string(e.mismatches) +
                        " of " + std::to_string(t.numel()) + " elements wrong (" + ref_.signature.DescribeTolerance(t) + ")";
      if (e.unwritten) msg += ", " + std::to_string(e.unwritten) + " never written";
      if (e.nan_mismatches) msg += ", " + std::to_string(e.nan_mismatches) + " NaN/Inf where the reference is finite";
      if (e.first_mismatch >= 0) {
        size_t es = DTypeSize(t.dtype);
        unsigned char got[8] = {}, want[8] = {};
        d_->cuMemcpyDtoH(got, arena_.base() + o.offset + e.first_mismatch * es, es);
        d_->cuMemcpyDtoH(want, o.refs[set] + e.first_mismatch * es, es);
        msg += "; first at index " + std::to_string(e.first_mismatch) + ": got " + Num(ElementAsDouble(t.dtype, got));
        if (opts_.reveal_reference_values && !practice_) msg += ", expected " + Num(ElementAsDouble(t.dtype, want));
      }
      r.status = EvalStatus::kIncorrect;
      r.message = msg;
    }
  }
  // Inputs must be unchanged (stops writing intermediates into inputs and
  // corrupting the data later runs are checked on): the arena's working
  // slots against the hashes they had when this set was staged, and where
  // one differs, against the pristine copy of this set.
  // A modified input is named first even when outputs are also wrong: it is
  // the cause, and which symptom shows depends on how the candidate's blocks race.
  bool input_named = false;
  timer.reset();
  timer.emplace(&parts_.inputs);
  for (const StagedSlot& slot : arena_.StagedSlots(set)) {
    const TensorSlot* s = slot.work;
    auto diff = arena_.ChangedWords(*s, *slot.pristine, slot.hash);
    if (!diff.ok()) return fail(EvalStatus::kRuntimeError, "evaluator: " + diff.status().message());
    if (*diff) {
      (void)arena_.RestoreSlot(*s, *slot.pristine);
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
  timer.reset();
  timer.emplace(&parts_.guards);
  auto check_guard = [&](uint64_t off, uint64_t bytes, const std::string& what) {
    auto n = arena_.CheckGuard(off, bytes);  // a guard written to is written again
    if (n.ok() && *n) {
      if (r.status == EvalStatus::kCorrect || r.status == EvalStatus::kIncorrect)
        fail(EvalStatus::kRuntimeError, "wrote " + std::to_string(*n) + " bytes " + what);
    }
  };
  check_guard(0, kGuard, "before the start of its buffers");
  if (arena_.tail_guard_bytes())
    check_guard(arena_.tail_guard_offset(), arena_.tail_guard_bytes(), "past the end of its buffers");
  for (const auto& o : outputs_)
    check_guard(o.guard_offset, o.guard_bytes, "past the end of output '" + o.spec->name + "' (its alignment padding included)");
}

// Phase 1: the plan resolved against the kernels NVRTC found, a worker
// running, the module loaded into it (its occupancy per launch comes back).
std::optional<Evaluation> GpuEvaluator::LoadCandidate(Judgement& j) {
  PlanLimits limits;
  if (info_.shared_per_block_optin > 0) limits.max_shared_bytes_per_block = info_.shared_per_block_optin;
  auto plan = ResolvePlan(j.candidate.plan_json, ref_.signature, j.compiled.kernels, limits);
  if (!plan.ok()) return Conclude(j, EvalStatus::kInvalidPlan, plan.status().message());
  j.plan = std::move(plan).value();
  j.e.launches = j.plan->Summary();
  if (!worker_.ready()) {
    if (Status s = StartWorker(); !s.ok()) return Conclude(j, EvalStatus::kRuntimeError, "evaluator: " + s.message());
    j.Phase("worker_start");
  }
  if (Status s = worker_.Send(BuildLoadRequest(*j.plan, j.compiled)); !s.ok()) {
    worker_.Stop();  // send failed
    return Conclude(j, EvalStatus::kRuntimeError, "the worker is gone: " + s.message());
  }
  auto reply = worker_.Receive<wire::LoadReply>(60);
  if (!reply.received.ok()) {
    worker_.Stop();  // load failed
    return Conclude(j, EvalStatus::kLaunchError, "loading the module: " + reply.received.message());
  }
  if (const auto& err = reply.error) {
    if (err->fatal) worker_.Stop();
    // A tensor map the driver refuses is the plan's fault, like any other bad map.
    return Conclude(j, err->status == "invalid_plan" ? EvalStatus::kInvalidPlan : EvalStatus::kLaunchError,
                    err->message.empty() ? "load failed" : err->message);
  }
  const auto& loaded = reply.reply;
  if (!loaded.ok()) {
    worker_.Stop();  // unreadable load reply
    return Conclude(j, EvalStatus::kRuntimeError, "evaluator: " + loaded.status().message());
  }
  j.occupancy = loaded->occupancy;
  j.Phase("load");
  return std::nullopt;
}

}  // namespace ks
