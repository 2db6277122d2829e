// The GPU evaluator's memory for the candidate (issue 31, issue 35): the
// arena the sandboxed worker maps (CUDA IPC) and the pristine copy of every
// input set in trusted memory the worker never maps.
//
// Two layouts (LayOut). The pristine copy holds every input set:
// [guard][set 0 inputs]...[set K-1 inputs][parameters][shifted sets' own
// parameters]. The arena holds one set at a time, staged before each run
// (StageSet): [guard][inputs][parameters][out0][guard][out1][guard]... up to
// the end of its last 2 MiB page. A kernel sees no other input set, so it
// cannot relate a shifted set to the set it was made from, nor tell the sets
// apart by their addresses. Guards hold kGuardByte (gpu_evaluator_internal.h);
// the outputs' contents are the worker's and the evaluator's business, not
// the arena's.
//
// The checks need the evaluator's trusted helper kernels (hash, word diff,
// fill count): they come in as Helpers, so the arena knows no evaluator.
// Owned by one GpuEvaluator; not thread-safe (its one-caller-at-a-time rule).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/problem.h"

namespace ks {

class Arena {
 public:
  struct TensorSlot {
    std::string name;
    uint64_t offset = 0;  // in the arena (and in the pristine copy)
    uint64_t bytes = 0;
    // A resident reference's tensor (the bridge's, mapped; trusted memory the
    // worker never maps) serves as the pristine copy itself: inputs are not
    // held twice beside the bridge's. 0: the copy is pristine_ + offset.
    CUdeviceptr src = 0;
  };
  // An output's place in the arena and its guard (from its last byte:
  // alignment padding is guard too; the last one runs to the arena's end).
  struct OutputRegion {
    uint64_t offset = 0;
    uint64_t bytes = 0;
    uint64_t guard_offset = 0;
    uint64_t guard_bytes = 0;
  };
  // A working slot of the staged set, its pristine copy and its hash when staged.
  struct StagedSlot {
    const TensorSlot* work;
    const TensorSlot* pristine;
    uint64_t hash;
  };
  // The evaluator's helper kernels the staging and the checks use.
  struct Helpers {
    // The keyed hash of n elements of `width` bytes at p (GpuEvaluator::HashRange).
    std::function<StatusOr<uint64_t>(CUdeviceptr p, uint64_t n, size_t width)> hash_range;
    // 4-byte words that differ between a and b (bytes long).
    std::function<StatusOr<uint64_t>(CUdeviceptr a, CUdeviceptr b, uint64_t bytes)> count_diff_words;
    // Bytes at p that do not hold `fill`.
    std::function<StatusOr<uint64_t>(CUdeviceptr p, uint64_t bytes, uint8_t fill)> count_not_fill;
  };
  // A resident reference's tensor `name` of set `set`, in trusted memory.
  using ResidentPtr = std::function<StatusOr<CUdeviceptr>(int set, const std::string& name, uint64_t bytes)>;
  // Copies tensor `name` of set `set` (bytes long) to dst.
  using FillTensor = std::function<Status(int set, const std::string& name, CUdeviceptr dst, uint64_t bytes)>;

  explicit Arena(Helpers helpers) : helpers_(std::move(helpers)) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Both layouts for ref's signature and sets (no allocation). With
  // `map_resident`, the tensors of whole 4-byte words are resident(...)
  // itself instead of room in the pristine copy.
  Status LayOut(const ReferenceData& ref, bool map_resident, const ResidentPtr& resident);
  // The arena and the pristine copy allocated (LayOut's sizes).
  Status Allocate();
  // Guards written, every set's inputs and parameters filled in (by `fill`,
  // where the pristine copy has room for them), no set staged.
  Status Fill(const ReferenceData& ref, const FillTensor& fill);

  // Copies input set `set` (inputs, and parameters where the set has its
  // own) from the pristine copy into the arena, unless it is there already.
  Status StageSet(int set);
  int staged_set() const { return staged_set_; }  // -1: none yet
  // The arena's working slot `work` from its pristine copy, padding included
  // (zero, as in pristine_, where the pristine tensor is a resident one).
  Status RestoreSlot(const TensorSlot& work, const TensorSlot& pristine);
  // 4-byte words of `work`, padding included, that differ from its pristine copy.
  StatusOr<uint64_t> DiffSlot(const TensorSlot& work, const TensorSlot& pristine);
  // The words a candidate changed in a working input slot against its set's
  // pristine copy: 0 when its hash matches the hash the slot had when staged
  // (one read); counted against the pristine copy otherwise (DiffSlot).
  StatusOr<uint64_t> ChangedWords(const TensorSlot& work, const TensorSlot& pristine, uint64_t staged_hash);
  // The staged set's working slots (inputs, then parameters) with their pristine copies and staged hashes.
  std::vector<StagedSlot> StagedSlots(int set) const;
  std::vector<const TensorSlot*> WorkSlots() const;  // work_inputs_, then work_params_
  // Where a slot's pristine bytes are (TensorSlot::src, or in pristine_).
  CUdeviceptr PristinePtr(const TensorSlot& pristine) const {
    return pristine.src ? pristine.src : pristine_.get() + pristine.offset;
  }
  // The arena offset of a tensor of the signature (one: every set is staged there).
  std::vector<uint64_t> ArenaOffsets(const std::string& name) const;

  // Bytes of the guard [offset, offset + bytes) that no longer hold
  // kGuardByte; a guard written to is written again.
  StatusOr<uint64_t> CheckGuard(uint64_t offset, uint64_t bytes);
  // A problem with no output: the guard after the inputs (0 bytes otherwise).
  uint64_t tail_guard_offset() const { return tail_guard_offset_; }
  uint64_t tail_guard_bytes() const { return tail_guard_bytes_; }
  // Per output of the signature, in its order.
  const std::vector<OutputRegion>& outputs() const { return outputs_; }

  CUdeviceptr base() const { return arena_.get(); }  // the arena the worker maps
  uint64_t bytes() const { return arena_bytes_; }     // whole pages

 private:
  Helpers helpers_;
  const CudaDriver* d_ = nullptr;  // Allocate
  DeviceBuffer arena_, pristine_;
  uint64_t inputs_end_ = 0;  // the pristine copy's size
  std::vector<std::vector<TensorSlot>> set_inputs_;  // per set, offsets in pristine_
  std::vector<TensorSlot> params_;  // shared by every set (pristine_ offsets)
  // Per set: params_, where the set has its own copy (ReferenceSet::own_parameters) at that copy's offset.
  std::vector<std::vector<TensorSlot>> set_params_;
  // The arena's one working set (StageSet): the inputs and the parameters at
  // their arena offsets, and which set they hold now (-1: none yet).
  std::vector<TensorSlot> work_inputs_, work_params_;
  uint64_t work_end_ = 0;
  std::vector<std::string> output_names_;
  std::vector<OutputRegion> outputs_;
  uint64_t arena_bytes_ = 0;  // whole pages (LayOut)
  int staged_set_ = -1;
  uint64_t tail_guard_offset_ = 0, tail_guard_bytes_ = 0;
  // Per set: the hash of each working slot (inputs, then parameters, padding
  // included) right after StageSet restored it from the pristine copy;
  // computed the first time the set is staged.
  std::vector<std::vector<uint64_t>> staged_hashes_;
};

}  // namespace ks
