// The arena's layout, its allocation and first fill, staging a set into it
// from the pristine copy, and what the checks after each run compare its
// working slots with (the hashes they had when staged; the pristine copy
// where one differs: issue 33).
#include "evaluator/arena.h"

#include <algorithm>
#include <vector>

#include "evaluator/gpu_evaluator_internal.h"

namespace ks {

using namespace gpu_internal;  // NOLINT: the evaluator's own internals (guards, alignment)

Status Arena::LayOut(const ReferenceData& ref, bool map_resident, const ResidentPtr& resident) {
  const Signature& sig = ref.signature;
  const int sets = static_cast<int>(ref.sets.size());
  // A resident reference's tensors are the pristine copy themselves (whole
  // 4-byte words: the comparison's unit); others get room in pristine_.
  uint64_t off = kGuard;
  auto place = [&](int set, TensorSlot slot) -> StatusOr<TensorSlot> {
    if (map_resident && slot.bytes % 4 == 0 && slot.bytes > 0) {
      KS_ASSIGN_OR_RETURN(slot.src, resident(set, slot.name, slot.bytes));
      return slot;
    }
    slot.src = 0;
    slot.offset = off;
    off = AlignUp(off + slot.bytes);
    return slot;
  };
  set_inputs_.assign(sets, {});
  for (int s = 0; s < sets; ++s)
    for (const auto& t : sig.inputs)
      if (!t.is_scalar) {
        KS_ASSIGN_OR_RETURN(TensorSlot slot, place(s, {t.name, 0, static_cast<uint64_t>(t.bytes())}));
        set_inputs_[s].push_back(std::move(slot));
      }
  for (const auto& t : sig.parameters)
    if (!t.is_scalar) {
      KS_ASSIGN_OR_RETURN(TensorSlot slot, place(0, {t.name, 0, static_cast<uint64_t>(t.bytes())}));
      params_.push_back(std::move(slot));
    }
  // A shifted set whose transform changed parameters has its own copy of
  // those (ReferenceSet::own_parameters); every other set shares params_.
  set_params_.assign(sets, params_);
  for (int s = 0; s < sets; ++s)
    for (auto& slot : set_params_[s])
      if (ref.sets[s].OwnsParameter(slot.name)) {
        KS_ASSIGN_OR_RETURN(slot, place(s, slot));
      }
  inputs_end_ = off;
  // The arena: one set's inputs and the parameters, then the outputs.
  off = kGuard;
  work_inputs_ = set_inputs_[0];
  for (auto& slot : work_inputs_) {
    slot.offset = off;
    slot.src = 0;
    off = AlignUp(off + slot.bytes);
  }
  work_params_ = params_;
  for (auto& slot : work_params_) {
    slot.offset = off;
    slot.src = 0;
    off = AlignUp(off + slot.bytes);
  }
  work_end_ = off;
  outputs_.clear();
  output_names_.clear();
  for (const auto& t : sig.outputs) {
    OutputRegion o;
    o.offset = off;
    o.bytes = t.bytes();
    // The guard starts at the output's last byte, not at the next aligned
    // offset: alignment padding a kernel could keep state in is guard too.
    o.guard_offset = off + t.bytes();
    o.guard_bytes = AlignUp(o.guard_offset + kGuard) - o.guard_offset;
    off = o.guard_offset + o.guard_bytes;
    outputs_.push_back(o);
    output_names_.push_back(t.name);
  }
  // The last guard runs to the end of the allocation's last page: the
  // worker maps all of it, and slack nothing checks could keep state.
  arena_bytes_ = (off + kArenaPage - 1) / kArenaPage * kArenaPage;
  if (!outputs_.empty()) outputs_.back().guard_bytes += arena_bytes_ - off;
  return Status::Ok();
}

Status Arena::Allocate() {
  KS_ASSIGN_OR_RETURN(d_, CudaDriver::Get());
  KS_ASSIGN_OR_RETURN(arena_, DeviceBuffer::Alloc(arena_bytes_));
  KS_ASSIGN_OR_RETURN(pristine_, DeviceBuffer::Alloc(inputs_end_));
  return Status::Ok();
}

Status Arena::Fill(const ReferenceData& ref, const FillTensor& fill) {
  const int sets = static_cast<int>(ref.sets.size());
  const uint64_t arena_bytes = arena_bytes_;
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(arena_.get(), 0, arena_bytes), "cuMemsetD8"));
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(arena_.get(), kGuardByte, kGuard), "cuMemsetD8"));
  if (outputs_.empty())  // no output to carry the tail guard: it follows the inputs
    KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(arena_.get() + work_end_, kGuardByte, arena_bytes - work_end_), "cuMemsetD8"));
  tail_guard_offset_ = work_end_;
  tail_guard_bytes_ = outputs_.empty() ? arena_bytes - work_end_ : 0;
  for (const auto& o : outputs_)
    KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(arena_.get() + o.guard_offset, kGuardByte, o.guard_bytes), "cuMemsetD8"));
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemsetD8(pristine_.get(), 0, inputs_end_), "cuMemsetD8"));
  for (int s = 0; s < sets; ++s)
    for (const auto& slot : set_inputs_[s])
      if (!slot.src) KS_RETURN_IF_ERROR(fill(s, slot.name, pristine_.get() + slot.offset, slot.bytes));
  for (const auto& slot : params_)
    if (!slot.src) KS_RETURN_IF_ERROR(fill(0, slot.name, pristine_.get() + slot.offset, slot.bytes));
  for (int s = 0; s < sets; ++s)
    for (const auto& slot : set_params_[s])
      if (ref.sets[s].OwnsParameter(slot.name) && !slot.src)
        KS_RETURN_IF_ERROR(fill(s, slot.name, pristine_.get() + slot.offset, slot.bytes));
  staged_set_ = -1;
  staged_hashes_.assign(sets, {});
  return Status::Ok();
}

Status Arena::StageSet(int set) {
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
      KS_ASSIGN_OR_RETURN(uint64_t h, helpers_.hash_range(arena_.get() + slot->offset, AlignUp(slot->bytes) / 4, 4));
      hashes.push_back(h);
    }
    staged_hashes_[set] = std::move(hashes);
  }
  return Status::Ok();
}

std::vector<const Arena::TensorSlot*> Arena::WorkSlots() const {
  std::vector<const TensorSlot*> slots;
  for (const auto& s : work_inputs_) slots.push_back(&s);
  for (const auto& s : work_params_) slots.push_back(&s);
  return slots;
}

std::vector<Arena::StagedSlot> Arena::StagedSlots(int set) const {
  std::vector<StagedSlot> out;
  const auto work = WorkSlots();
  for (size_t i = 0; i < work.size(); ++i) {
    const TensorSlot* pristine =
        i < work_inputs_.size() ? &set_inputs_[set][i] : &set_params_[set][i - work_inputs_.size()];
    out.push_back({work[i], pristine, staged_hashes_[set][i]});
  }
  return out;
}

StatusOr<uint64_t> Arena::ChangedWords(const TensorSlot& work, const TensorSlot& pristine, uint64_t staged_hash) {
  KS_ASSIGN_OR_RETURN(uint64_t h, helpers_.hash_range(arena_.get() + work.offset, AlignUp(work.bytes) / 4, 4));
  if (h == staged_hash) return uint64_t{0};
  KS_ASSIGN_OR_RETURN(uint64_t n, DiffSlot(work, pristine));
  return std::max<uint64_t>(n, 1);  // the hash saw a change: never "none"
}

Status Arena::RestoreSlot(const TensorSlot& work, const TensorSlot& pristine) {
  const uint64_t padded = AlignUp(work.bytes);
  if (!pristine.src)
    return d_->Check(d_->cuMemcpyDtoD(arena_.get() + work.offset, pristine_.get() + pristine.offset, padded),
                     "cuMemcpyDtoD");
  KS_RETURN_IF_ERROR(d_->Check(d_->cuMemcpyDtoD(arena_.get() + work.offset, pristine.src, work.bytes), "cuMemcpyDtoD"));
  if (padded == work.bytes) return Status::Ok();
  return d_->Check(d_->cuMemsetD8(arena_.get() + work.offset + work.bytes, 0, padded - work.bytes), "cuMemsetD8");
}

StatusOr<uint64_t> Arena::DiffSlot(const TensorSlot& work, const TensorSlot& pristine) {
  const uint64_t padded = AlignUp(work.bytes);
  if (!pristine.src)
    return helpers_.count_diff_words(arena_.get() + work.offset, pristine_.get() + pristine.offset, padded);
  KS_ASSIGN_OR_RETURN(uint64_t body, helpers_.count_diff_words(arena_.get() + work.offset, pristine.src, work.bytes));
  if (padded == work.bytes) return body;
  // The padding against zero (bytes, counted as words: a change shows either way).
  KS_ASSIGN_OR_RETURN(uint64_t pad,
                      helpers_.count_not_fill(arena_.get() + work.offset + work.bytes, padded - work.bytes, 0));
  return body + (pad + 3) / 4;
}

std::vector<uint64_t> Arena::ArenaOffsets(const std::string& name) const {
  // One offset: every set is staged into the same place (StageSet).
  uint64_t off = 0;
  for (const auto& slot : work_inputs_) if (slot.name == name) off = slot.offset;
  for (const auto& slot : work_params_) if (slot.name == name) off = slot.offset;
  for (size_t i = 0; i < outputs_.size(); ++i) if (output_names_[i] == name) off = outputs_[i].offset;
  return {off};
}

StatusOr<uint64_t> Arena::CheckGuard(uint64_t offset, uint64_t bytes) {
  KS_ASSIGN_OR_RETURN(uint64_t n, helpers_.count_not_fill(arena_.get() + offset, bytes, kGuardByte));
  if (n) d_->cuMemsetD8(arena_.get() + offset, kGuardByte, bytes);
  return n;
}

}  // namespace ks
