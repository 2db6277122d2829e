// TMA tensor maps of a launch plan (the "tensor_maps" key, DESIGN.md contract 2):
// a descriptor of a tile walk over one tensor or scratch buffer, which the
// worker encodes with the driver's cuTensorMapEncodeTiled for each input set
// and passes by value (128 bytes, 64-byte aligned) to the kernel parameter it
// is named for. Everything the driver requires is checked here first, so a bad
// map is an invalid_plan whose message names the rule, not a CUDA error code.
// Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evaluator/signature.h"

namespace ks {

// Every key a "tensor_maps" entry may have (contract_test checks that
// prompts/contract.md documents each one).
inline constexpr std::array<std::string_view, 11> kTensorMapKeys = {
    "name",    "tensor",     "dtype",           "dims",        "byte_strides", "box",
    "element_strides", "interleave", "swizzle", "l2_promotion", "oob_fill"};

inline constexpr int kTensorMapMaxRank = 5;
inline constexpr int kTensorMapBytes = 128;  // sizeof(CUtensorMap)
inline constexpr int kTensorMapAlign = 64;   // alignof(CUtensorMap)

// The enum values are the driver's (CUtensorMapDataType, ...), so the worker
// and export pass them through unchanged.
enum class TmaDataType : int {
  kUint8 = 0, kUint16 = 1, kUint32 = 2, kInt32 = 3, kUint64 = 4, kInt64 = 5,
  kFloat16 = 6, kFloat32 = 7, kFloat64 = 8, kBFloat16 = 9, kTFloat32 = 11,
};
enum class TmaInterleave : int { kNone = 0, k16B = 1, k32B = 2 };
enum class TmaSwizzle : int { kNone = 0, k32B = 1, k64B = 2, k128B = 3 };
enum class TmaL2Promotion : int { kNone = 0, k64B = 1, k128B = 2, k256B = 3 };
enum class TmaOobFill : int { kZero = 0, kNan = 1 };

// A map as the driver takes it: every array innermost dimension first.
struct TensorMapSpec {
  std::string name;    // the launch argument that receives it
  std::string tensor;  // a tensor of the signature, or a scratch buffer
  bool scratch = false;
  int64_t target_bytes = 0;  // the size of that tensor or buffer
  TmaDataType dtype = TmaDataType::kFloat32;
  int rank = 0;
  std::array<uint64_t, kTensorMapMaxRank> dims{};          // elements
  std::array<uint64_t, kTensorMapMaxRank - 1> byte_strides{};  // of dims 1..rank-1
  std::array<uint32_t, kTensorMapMaxRank> box{};
  std::array<uint32_t, kTensorMapMaxRank> element_strides{};
  TmaInterleave interleave = TmaInterleave::kNone;
  TmaSwizzle swizzle = TmaSwizzle::kNone;
  TmaL2Promotion l2_promotion = TmaL2Promotion::kNone;
  TmaOobFill oob_fill = TmaOobFill::kZero;

  bool operator==(const TensorMapSpec&) const = default;
};

int TmaElementBytes(TmaDataType t);

// Parses and checks one "tensor_maps" entry. Dims default to the tensor's
// shape (reversed: innermost first) and byte strides to its contiguous
// strides; both may be integer expressions as grid entries are. `scratch`
// maps the plan's scratch buffers to their sizes. InvalidArgument naming the
// rule otherwise.
StatusOr<TensorMapSpec> ResolveTensorMap(const nlohmann::json& entry, const Signature& sig,
                                         const std::map<std::string, int64_t>& scratch);

// The driver's rules on everything but the address (rank, dims, strides, box,
// element strides, swizzle against the inner box, interleave), plus ours: the
// walk stays inside its tensor. Each failure names its rule.
Status CheckTensorMap(const TensorMapSpec& m);
// The global address must be 16-byte aligned (32 with 32-byte interleave).
// Checked by the worker on each real address before the driver is called.
Status CheckTensorMapAddress(const TensorMapSpec& m, uint64_t address);

nlohmann::json TensorMapToJson(const TensorMapSpec& m);
StatusOr<TensorMapSpec> TensorMapFromJson(const nlohmann::json& j);

}  // namespace ks
