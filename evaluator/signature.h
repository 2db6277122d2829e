// The problem signature (DESIGN.md, contract 1) as the reference bridge reports
// it, and the reference data layout it writes. Plain data; JSON round trip.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ks {

enum class DType { kFloat32, kFloat16, kBFloat16, kFloat64, kInt32, kInt64, kInt8, kUInt8, kBool };

StatusOr<DType> ParseDType(const std::string& s);  // "float32", "bfloat16", ...
const char* DTypeName(DType d);
size_t DTypeSize(DType d);
bool IsFloating(DType d);

// One named value of the signature: a tensor (shape, contiguous strides) or a
// plain scalar argument of forward (int or float, with its value).
struct TensorSpec {
  std::string name;   // forward parameter name, state_dict key, or out / out0..
  bool is_scalar = false;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;    // tensors only
  std::vector<int64_t> strides;  // elements, contiguous
  double scalar_value = 0;       // scalars only (same in every input set)

  int64_t numel() const;
  int64_t bytes() const { return numel() * static_cast<int64_t>(DTypeSize(dtype)); }
};

struct Tolerance {
  double atol = 0;
  double rtol = 0;
};

struct Signature {
  std::string file;         // the problem file as given
  std::string name;         // file stem
  std::string description;  // DESCRIPTION, or ""
  std::optional<Tolerance> tolerance;  // TOLERANCE, when the problem sets it
  std::optional<double> flops;         // FLOPS, when the problem sets it
  std::vector<TensorSpec> inputs;      // forward's arguments, in order
  std::vector<TensorSpec> parameters;  // state_dict entries
  std::vector<TensorSpec> outputs;     // out, or out0, out1, ...

  // Inputs, then parameters, then outputs.
  const TensorSpec* Find(const std::string& name) const;
  // Bytes that must move: every input and parameter read once, every output written once.
  int64_t MinimumBytes() const;
  // The tolerance to apply to an output: the problem's, else the dtype default.
  Tolerance ToleranceFor(DType output_dtype) const;
};

StatusOr<Signature> SignatureFromJson(const nlohmann::json& j);
nlohmann::json SignatureToJson(const Signature& s);

}  // namespace ks
