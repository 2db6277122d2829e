// The GPU evaluator's arena of one input set (issue 31): staging a set into
// it from the pristine copy, and what the checks after each run compare its
// working slots with (the hashes they had when staged; the pristine copy
// where one differs: issue 33).
#include <algorithm>
#include <vector>

#include "evaluator/gpu_evaluator.h"
#include "evaluator/gpu_evaluator_internal.h"

namespace ks {

using namespace gpu_internal;  // NOLINT: the evaluator's own internals

Status GpuEvaluator::StageSet(int set) {
  if (set < 0 || set >= static_cast<int>(set_inputs_.size())) return Internal("no input set " + std::to_string(set));
  if (set == staged_set_) return Status::Ok();
  for (size_t i = 0; i < work_inputs_.size(); ++i)
    KS_RETURN_IF_ERROR(RestoreSlot(work_inputs_[i], set_inputs_[set][i]).WithContext("staging an input set"));
  for (size_t i = 0; i < work_params_.size(); ++i)
    if (staged_set_ < 0 || PristinePtr(set_params_[staged_set_][i]) != PristinePtr(set_params_[set][i]))
      KS_RETURN_IF_ERROR(RestoreSlot(work_params_[i], set_params_[set][i]).WithContext("staging parameters"));
  // The worker's launches run in another process: the copies end first.
  KS_RETURN_IF_ERROR(d_->Check(d_->cuCtxSynchronize(), "staging an input set"));
  staged_set_ = set;
  if (staged_hashes_[set].empty()) {
    // What each slot holds when restored, for the checks after each run (ChangedWords).
    std::vector<uint64_t> hashes;
    for (const TensorSlot* slot : WorkSlots()) {
      KS_ASSIGN_OR_RETURN(uint64_t h, HashRange(arena_.get() + slot->offset, AlignUp(slot->bytes) / 4, 4));
      hashes.push_back(h);
    }
    staged_hashes_[set] = std::move(hashes);
  }
  return Status::Ok();
}

std::vector<const GpuEvaluator::TensorSlot*> GpuEvaluator::WorkSlots() const {
  std::vector<const TensorSlot*> slots;
  for (const auto& s : work_inputs_) slots.push_back(&s);
  for (const auto& s : work_params_) slots.push_back(&s);
  return slots;
}

std::vector<GpuEvaluator::StagedSlot> GpuEvaluator::StagedSlots(int set) const {
  std::vector<StagedSlot> out;
  const auto work = WorkSlots();
  for (size_t i = 0; i < work.size(); ++i) {
    const TensorSlot* pristine =
        i < work_inputs_.size() ? &set_inputs_[set][i] : &set_params_[set][i - work_inputs_.size()];
    out.push_back({work[i], pristine, staged_hashes_[set][i]});
  }
  return out;
}

StatusOr<uint64_t> GpuEvaluator::ChangedWords(const TensorSlot& work, const TensorSlot& pristine, uint64_t staged_hash) {
  KS_ASSIGN_OR_RETURN(uint64_t h, HashRange(arena_.get() + work.offset, AlignUp(work.bytes) / 4, 4));
  if (h == staged_hash) return uint64_t{0};
  KS_ASSIGN_OR_RETURN(uint64_t n, DiffSlot(work, pristine));
  return std::max<uint64_t>(n, 1);  // the hash saw a change: never "none"
}

Status GpuEvaluator::RestoreSlot(const TensorSlot& work, const TensorSlot& pristine) {
  const uint64_t padded = AlignUp(work.bytes);
  if (!pristine.src)
    return d_->Check(d_->cuMemcpyDtoD(arena_.get() + work.offset, pristine_.get() + pristine.offset, padded),
                     "cuMemcpyDtoD");
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyDtoD(arena_.get() + work.offset, pristine.src, work.bytes), "cuMemcpyDtoD"));
  if (padded == work.bytes) return Status::Ok();
  return d_->Check(d_->cuMemsetD8(arena_.get() + work.offset + work.bytes, 0, padded - work.bytes), "cuMemsetD8");
}

StatusOr<uint64_t> GpuEvaluator::DiffSlot(const TensorSlot& work, const TensorSlot& pristine) {
  const uint64_t padded = AlignUp(work.bytes);
  if (!pristine.src) return CountDiffWords(arena_.get() + work.offset, pristine_.get() + pristine.offset, padded);
  KS_ASSIGN_OR_RETURN(uint64_t body, CountDiffWords(arena_.get() + work.offset, pristine.src, work.bytes));
  if (padded == work.bytes) return body;
  // The padding against zero (bytes, counted as words: a change shows either way).
  KS_ASSIGN_OR_RETURN(uint64_t pad, CountNotFill(arena_.get() + work.offset + work.bytes, padded - work.bytes, 0));
  return body + (pad + 3) / 4;
}

}  // namespace ks
