// The GPU evaluator's checks, run by trusted kernels in this process: outputs
// against the reference (element-wise, relative norm, large-error share, a
// hash of the bits), and inputs, guards and padding against their pristine copies.
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
#include "evaluator/worker/sandbox.h"
#include "evaluator/worker/worker_protocol.h"

#include "evaluator/gpu_evaluator_internal.h"

namespace ks {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace gpu_internal;  // NOLINT: the evaluator's own internals

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

unsigned GpuEvaluator::HelperGrid(CUfunction fn) const {
  // As many blocks of 256 as the GPU holds at once (one wave, no tail), at
  // least one per SM: each thread strides over the buffer.
  int per_sm = 0;
  if (d_->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, 256, 0) != CUDA_SUCCESS || per_sm < 1) per_sm = 8;
  return static_cast<unsigned>(info_.multiprocessors * per_sm);
}

StatusOr<uint64_t> GpuEvaluator::HashRange(CUdeviceptr p, uint64_t n, size_t width) {
  int fn = width == 1 ? 0 : width == 2 ? 1 : width == 4 ? 2 : width == 8 ? 3 : -1;
  if (fn < 0) return Internal("no hash for elements of " + std::to_string(width) + " bytes");
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(stats_.get(), 0, 8), "cuMemsetD8"));
  unsigned long long count = n;
  HashKey key{hash_key_[0], hash_key_[1]};
  CUdeviceptr out = stats_.get();
  void* args[] = {&p, &count, &key, &out};
  unsigned grid = static_cast<unsigned>(std::clamp<uint64_t>((n + 255) / 256, 1, hash_grid_[fn]));
  KS_RETURN_IF_ERROR(d_->Check(d_->cuLaunchKernel(hash_fn_[fn], grid, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr), "hash"));
  uint64_t result = 0;
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyDtoH(&result, out, 8), "cuMemcpyDtoH"));
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
  CUdeviceptr bound = 0;  // per-block bound (judge.h), or 0
  HashKey key = {};
};

// One launch of a cmp_* helper over a whole output; the figures come back in `stats`.
StatusOr<Stats> LaunchCompare(const CudaDriver* d, CUfunction fn, CUdeviceptr stats, unsigned max_grid, CompareArgs c) {
  Stats init{};
  init.first = ~0ull;
  KS_RETURN_IF_ERROR(d->Check(d->cuMemcpyHtoD(stats, &init, sizeof init), "cuMemcpyHtoD"));
  unsigned long long poison = c.poison;
  void* args[] = {&c.out, &c.ref, &c.n, &c.atol, &c.rtol, &c.tiny, &c.large_rel, &poison, &c.bound, &c.key, &stats};
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
                                             cmp_grid_[static_cast<int>(o.spec->dtype)], a));
  return s.sum_sq_ref;
}

Status GpuEvaluator::CompareOutput(OutputSlot& o, int set, OutputError* err, bool* bad, uint64_t* hash) {
  const TensorSpec& t = *o.spec;
  Tolerance tol = SetTolerance(o, set);  // widened by PyTorch's own float32 rounding, where measured
  CompareArgs a{arena_.base() + o.offset, o.refs[set], static_cast<unsigned long long>(t.numel()), tol.atol,
                tol.rtol, INFINITY, 0, 0};
  if (tol.large_rel > 0) {
    // "Not tiny" is relative to the output's RMS, so an honest kernel's
    // rounding (also relative to the RMS) never makes a large relative error.
    a.tiny = std::max(tol.TinyFraction() * o.ref_rms[set], std::numeric_limits<double>::min());
    a.large_rel = tol.large_rel;
  }
  if (set < static_cast<int>(o.bounds.size())) a.bound = o.bounds[set].get();
  a.key = HashKey{hash_key_[0], hash_key_[1]};
  PoisonPattern p;
  PoisonFor(t.dtype, &p, &a.poison);
  KS_ASSIGN_OR_RETURN(Stats s, LaunchCompare(d_, cmp_fn_[static_cast<int>(t.dtype)], stats_.get(),
                                             cmp_grid_[static_cast<int>(o.spec->dtype)], a));
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

// Repeated runs on one input set must give the same bits (stops races that
// pass only sometimes, and answers that depend on timing), unless the
// kernel uses atomics, whose order may vary: then the tolerance alone holds.
GpuEvaluator::RunResult GpuEvaluator::RunChecked(Judgement& j, int set) {
  RunResult r = RunOnce(set);
  if (r.status != EvalStatus::kCorrect) return r;
  for (size_t i = 0; i < outputs_.size() && i < r.hashes.size(); ++i) {
    auto& seen = j.first_bits[set][i];
    if (!seen) {
      seen = r.hashes[i];
      // Verified against the reference: later runs of a kernel without atomics repeat it (CheckRun).
      if (repeat_by_hash_ && i < r.errors.size()) verified_[set][i] = VerifiedOutput{r.hashes[i], r.errors[i]};
    } else if (*seen != r.hashes[i] && !j.atomics) {
      r.status = EvalStatus::kIncorrect;
      r.message = "output '" + outputs_[i].spec->name + "' differs bit for bit between two runs on input set " +
                  std::to_string(set) + " although the kernel uses no atomics: a race, a read of memory " +
                  "nothing wrote, or a result that depends on timing";
      break;
    }
  }
  return r;
}

// Phase 2: every get_inputs() set and every distribution-shifted set, in an
// order drawn at random for each candidate: a kernel can neither count its
// way to the shifted sets nor (one set staged at a time, at the same
// addresses) see the set a shifted one was made from. A get_inputs() set it
// fails ends the judgement; what the shifted sets found is kept for
// CheckRobustness, which only marks a kernel specialised.
std::optional<Evaluation> GpuEvaluator::CheckCorrectness(Judgement& j) {
  j.atomics = PtxUsesAtomics(j.compiled.ptx);
  j.first_bits.assign(ref_.sets.size(), std::vector<std::optional<uint64_t>>(outputs_.size()));
  repeat_by_hash_ = !j.atomics;
  verified_.assign(ref_.sets.size(), std::vector<std::optional<VerifiedOutput>>(outputs_.size()));
  const std::vector<int> checked = CheckedSets();
  std::vector<int> order = checked;
  if (!correctness_only_ && !practice_ && contract_ != Contract::kKernelBench)
    for (const InputTransform& t : ref_.transforms)
      if (t.set >= ref_.JudgingSets() && t.set < static_cast<int>(ref_.sets.size()) && !ref_.sets[t.set].practice)
        order.push_back(t.set);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(std::random_device{}()));
  for (int s : order) {
    RunResult r = RunChecked(j, s);
    if (!ref_.sets[s].transform.empty()) {
      j.shifted[s] = std::move(r);
      // A crash, hang or launch failure on a shifted set fails the candidate as any run does.
      if (j.shifted[s].status != EvalStatus::kCorrect && j.shifted[s].status != EvalStatus::kIncorrect) break;
      continue;
    }
    j.KeepWorst(r.errors);
    if (r.status != EvalStatus::kCorrect) return FailRun(j, r, r.message, /*own_errors=*/true);
    j.first_ms.push_back(r.ms);
  }
  // The timed runs' set, drawn too.
  j.timing_set = checked.empty() ? 0 : checked[std::random_device{}() % checked.size()];
  j.Phase("correctness");
  return std::nullopt;
}

// The last checks, after the module is unloaded: every input set, not only
// the one each run read (a run must not plant data in another set's buffers,
// or their padding, for a later run to find).
std::optional<Evaluation> GpuEvaluator::FinalChecks(Judgement& j) {
  UnloadCandidate();
  TakeErrors(j);
  RunResult inputs;
  CheckEveryInputSet(inputs);
  if (inputs.status != EvalStatus::kCorrect) return Conclude(j, inputs.status, inputs.message);
  return std::nullopt;
}

}  // namespace ks
