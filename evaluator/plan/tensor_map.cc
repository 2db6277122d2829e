#include "evaluator/plan/tensor_map.h"

#include <utility>

#include "evaluator/plan/launch_plan.h"

namespace ks {
namespace {

using json = nlohmann::json;

template <typename E>
struct Named {
  const char* name;
  E value;
};

constexpr Named<TmaDataType> kDataTypes[] = {
    {"uint8", TmaDataType::kUint8},       {"uint16", TmaDataType::kUint16},   {"uint32", TmaDataType::kUint32},
    {"int32", TmaDataType::kInt32},       {"uint64", TmaDataType::kUint64},   {"int64", TmaDataType::kInt64},
    {"float16", TmaDataType::kFloat16},   {"float32", TmaDataType::kFloat32}, {"float64", TmaDataType::kFloat64},
    {"bfloat16", TmaDataType::kBFloat16}, {"tfloat32", TmaDataType::kTFloat32},
};
constexpr Named<TmaInterleave> kInterleaves[] = {
    {"none", TmaInterleave::kNone}, {"16B", TmaInterleave::k16B}, {"32B", TmaInterleave::k32B}};
constexpr Named<TmaSwizzle> kSwizzles[] = {
    {"none", TmaSwizzle::kNone}, {"32B", TmaSwizzle::k32B}, {"64B", TmaSwizzle::k64B}, {"128B", TmaSwizzle::k128B}};
constexpr Named<TmaL2Promotion> kPromotions[] = {{"none", TmaL2Promotion::kNone},
                                                 {"64B", TmaL2Promotion::k64B},
                                                 {"128B", TmaL2Promotion::k128B},
                                                 {"256B", TmaL2Promotion::k256B}};
constexpr Named<TmaOobFill> kFills[] = {{"zero", TmaOobFill::kZero}, {"nan", TmaOobFill::kNan}};

template <typename E, size_t N>
StatusOr<E> ParseNamed(const json& v, const Named<E> (&table)[N], const char* key) {
  std::string all;
  for (const auto& n : table) all += std::string(all.empty() ? "\"" : ", \"") + n.name + "\"";
  if (v.is_string())
    for (const auto& n : table)
      if (v.get<std::string>() == n.name) return n.value;
  return InvalidArgument(std::string("\"") + key + "\" must be one of " + all + ", got " + v.dump());
}

template <typename E, size_t N>
StatusOr<E> FromInt(int v, const Named<E> (&table)[N], const char* what) {
  for (const auto& n : table)
    if (static_cast<int>(n.value) == v) return n.value;
  return InvalidArgument(std::string("bad ") + what + " " + std::to_string(v));
}

// The map's data type for a tensor's dtype (tf32 is read as float32's bits).
StatusOr<TmaDataType> DataTypeFor(DType d) {
  switch (d) {
    case DType::kFloat32: return TmaDataType::kFloat32;
    case DType::kFloat16: return TmaDataType::kFloat16;
    case DType::kBFloat16: return TmaDataType::kBFloat16;
    case DType::kFloat64: return TmaDataType::kFloat64;
    case DType::kInt32: return TmaDataType::kInt32;
    case DType::kInt64: return TmaDataType::kInt64;
    case DType::kUInt8: case DType::kBool: return TmaDataType::kUint8;
    case DType::kInt8: return InvalidArgument("int8 tensors have no TMA data type; use \"dtype\": \"uint8\"");
  }
  return InvalidArgument("unknown dtype");
}

bool FloatingTma(TmaDataType t) {
  return t == TmaDataType::kFloat16 || t == TmaDataType::kFloat32 || t == TmaDataType::kFloat64 ||
         t == TmaDataType::kBFloat16 || t == TmaDataType::kTFloat32;
}

StatusOr<int64_t> EvalEntry(const json& v, const Signature& sig) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) return EvalIntExpr(v.get<std::string>(), sig);
  return InvalidArgument("expected an integer or an expression string, got " + v.dump());
}

StatusOr<std::vector<int64_t>> EvalList(const json& v, const Signature& sig, const char* key) {
  if (!v.is_array()) return InvalidArgument(std::string("\"") + key + "\" must be a list");
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); ++i) {
    auto r = EvalEntry(v[i], sig);
    if (!r.ok()) return r.status().WithContext(std::string(key) + "[" + std::to_string(i) + "]");
    out.push_back(*r);
  }
  return out;
}

std::string Str(uint64_t v) { return std::to_string(v); }

}  // namespace

int TmaElementBytes(TmaDataType t) {
  switch (t) {
    case TmaDataType::kUint8: return 1;
    case TmaDataType::kUint16: case TmaDataType::kFloat16: case TmaDataType::kBFloat16: return 2;
    case TmaDataType::kUint32: case TmaDataType::kInt32: case TmaDataType::kFloat32: case TmaDataType::kTFloat32:
      return 4;
    case TmaDataType::kUint64: case TmaDataType::kInt64: case TmaDataType::kFloat64: return 8;
  }
  return 0;
}

StatusOr<TensorMapSpec> ResolveTensorMap(const json& e, const Signature& sig,
                                         const std::map<std::string, int64_t>& scratch) {
  if (!e.is_object()) return InvalidArgument("must be an object");
  for (const auto& [key, _] : e.items()) {
    bool known = false;
    for (std::string_view k : kTensorMapKeys) known |= k == key;
    if (!known) {
      std::string all;
      for (std::string_view k : kTensorMapKeys) all += (all.empty() ? "\"" : ", \"") + std::string(k) + "\"";
      return InvalidArgument("unknown key \"" + key + "\" (a tensor map has " + all + ")");
    }
  }
  TensorMapSpec m;
  if (!e.contains("name") || !e["name"].is_string() || e["name"].get<std::string>().empty())
    return InvalidArgument("needs \"name\" (the launch argument that receives the map)");
  m.name = e["name"];
  if (!e.contains("tensor") || !e["tensor"].is_string())
    return InvalidArgument("needs \"tensor\" (a tensor of the signature or a scratch buffer)");
  m.tensor = e["tensor"];
  if (!e.contains("box")) return InvalidArgument("needs \"box\" (the tile, innermost dimension first)");
  const TensorSpec* t = sig.Find(m.tensor);
  std::vector<int64_t> dims, strides;
  if (t && !t->is_scalar) {
    m.target_bytes = t->bytes();
    KS_ASSIGN_OR_RETURN(m.dtype, DataTypeFor(t->dtype));
    for (auto it = t->shape.rbegin(); it != t->shape.rend(); ++it) dims.push_back(*it);
    if (dims.empty()) dims.push_back(1);  // a 0-d tensor is one element
  } else if (auto s = scratch.find(m.tensor); s != scratch.end()) {
    m.scratch = true;
    m.target_bytes = s->second;
    if (!e.contains("dtype") || !e.contains("dims"))
      return InvalidArgument("scratch '" + m.tensor + "' has no shape: give \"dtype\" and \"dims\"");
  } else if (t) {
    return InvalidArgument("'" + m.tensor + "' is a scalar, not a tensor");
  } else {
    return InvalidArgument("unknown tensor '" + m.tensor + "'");
  }
  if (e.contains("dtype")) {
    KS_ASSIGN_OR_RETURN(TmaDataType d, ParseNamed(e["dtype"], kDataTypes, "dtype"));
    // A tensor read as another type of the same width (float32 as tfloat32) is fine;
    // another width would walk a different number of bytes than the tensor has.
    if (t && !m.scratch && static_cast<size_t>(TmaElementBytes(d)) != DTypeSize(t->dtype))
      return InvalidArgument("dtype \"" + e["dtype"].get<std::string>() + "\" is " +
                             std::to_string(TmaElementBytes(d)) + " bytes but '" + m.tensor + "' is " +
                             DTypeName(t->dtype));
    m.dtype = d;
  }
  const int64_t elem = TmaElementBytes(m.dtype);
  if (e.contains("dims")) {
    KS_ASSIGN_OR_RETURN(dims, EvalList(e["dims"], sig, "dims"));
  }
  if (dims.empty() || dims.size() > static_cast<size_t>(kTensorMapMaxRank))
    return InvalidArgument("rank " + std::to_string(dims.size()) + ": a tensor map has 1 to 5 dimensions");
  m.rank = static_cast<int>(dims.size());
  if (e.contains("byte_strides")) {
    KS_ASSIGN_OR_RETURN(strides, EvalList(e["byte_strides"], sig, "byte_strides"));
    if (strides.size() != dims.size() - 1)
      return InvalidArgument("\"byte_strides\" has " + std::to_string(strides.size()) + " entries; a rank-" +
                             std::to_string(m.rank) + " map has " + std::to_string(m.rank - 1) +
                             " (dimension 0 is contiguous)");
  } else {
    // Contiguous: each dimension's stride is the one below times its size.
    int64_t s = elem;
    for (size_t i = 0; i + 1 < dims.size(); ++i) {
      s *= dims[i];
      strides.push_back(s);
    }
  }
  KS_ASSIGN_OR_RETURN(std::vector<int64_t> box, EvalList(e["box"], sig, "box"));
  if (box.size() != dims.size())
    return InvalidArgument("\"box\" has " + std::to_string(box.size()) + " entries for a rank-" +
                           std::to_string(m.rank) + " map");
  std::vector<int64_t> estr(dims.size(), 1);
  if (e.contains("element_strides")) {
    KS_ASSIGN_OR_RETURN(estr, EvalList(e["element_strides"], sig, "element_strides"));
    if (estr.size() != dims.size())
      return InvalidArgument("\"element_strides\" has " + std::to_string(estr.size()) + " entries for a rank-" +
                             std::to_string(m.rank) + " map");
  }
  for (int i = 0; i < m.rank; ++i) {
    if (dims[i] < 1) return InvalidArgument("dims[" + std::to_string(i) + "] = " + std::to_string(dims[i]) + " is not positive");
    // Out-of-range values stop here, before they are narrowed; CheckTensorMap
    // words the same rules for in-range ones.
    if (box[i] < 1 || box[i] > 256)
      return InvalidArgument("box[" + std::to_string(i) + "] = " + std::to_string(box[i]) +
                             " is outside 1..256: a box dimension is 1 to 256 elements");
    if (estr[i] < 1 || estr[i] > 8)
      return InvalidArgument("element_strides[" + std::to_string(i) + "] = " + std::to_string(estr[i]) +
                             ": an element stride is 1 to 8");
    m.dims[i] = static_cast<uint64_t>(dims[i]);
    m.box[i] = static_cast<uint32_t>(box[i]);
    m.element_strides[i] = static_cast<uint32_t>(estr[i]);
  }
  for (size_t i = 0; i < strides.size(); ++i) {
    if (strides[i] < 1)
      return InvalidArgument("byte_strides[" + std::to_string(i) + "] = " + std::to_string(strides[i]) + " is not positive");
    m.byte_strides[i] = static_cast<uint64_t>(strides[i]);
  }
  if (e.contains("interleave")) { KS_ASSIGN_OR_RETURN(m.interleave, ParseNamed(e["interleave"], kInterleaves, "interleave")); }
  if (e.contains("swizzle")) { KS_ASSIGN_OR_RETURN(m.swizzle, ParseNamed(e["swizzle"], kSwizzles, "swizzle")); }
  if (e.contains("l2_promotion")) {
    KS_ASSIGN_OR_RETURN(m.l2_promotion, ParseNamed(e["l2_promotion"], kPromotions, "l2_promotion"));
  }
  if (e.contains("oob_fill")) { KS_ASSIGN_OR_RETURN(m.oob_fill, ParseNamed(e["oob_fill"], kFills, "oob_fill")); }
  KS_RETURN_IF_ERROR(CheckTensorMap(m));
  return m;
}

Status CheckTensorMap(const TensorMapSpec& m) {
  const uint64_t elem = TmaElementBytes(m.dtype);
  if (m.rank < 1 || m.rank > kTensorMapMaxRank)
    return InvalidArgument("rank " + std::to_string(m.rank) + ": a tensor map has 1 to 5 dimensions");
  if (m.interleave != TmaInterleave::kNone && m.rank < 3)
    return InvalidArgument("an interleaved map needs rank 3 or more (it has " + std::to_string(m.rank) + ")");
  for (int i = 0; i < m.rank; ++i) {
    std::string d = "[" + std::to_string(i) + "]";
    if (m.dims[i] < 1 || m.dims[i] > (uint64_t{1} << 32))
      return InvalidArgument("dims" + d + " = " + Str(m.dims[i]) + ": a dimension is 1 to 2^32 elements");
    if (m.box[i] < 1 || m.box[i] > 256)
      return InvalidArgument("box" + d + " = " + Str(m.box[i]) + " is outside 1..256: a box dimension is 1 to 256 elements");
    if (m.element_strides[i] < 1 || m.element_strides[i] > 8)
      return InvalidArgument("element_strides" + d + " = " + Str(m.element_strides[i]) +
                             ": an element stride is 1 to 8");
  }
  const uint64_t stride_align = m.interleave == TmaInterleave::k32B ? 32 : 16;
  for (int i = 0; i + 1 < m.rank; ++i) {
    uint64_t s = m.byte_strides[i];
    if (s % stride_align != 0)
      return InvalidArgument("byte_strides[" + std::to_string(i) + "] = " + Str(s) + " is not a multiple of " +
                             Str(stride_align) + " bytes (TMA rows start 16-byte aligned; pad the row or use another layout)");
    if (s >= (uint64_t{1} << 40))
      return InvalidArgument("byte_strides[" + std::to_string(i) + "] = " + Str(s) + " is not below 2^40");
  }
  const uint64_t inner_bytes = uint64_t{m.box[0]} * elem;
  if (m.interleave == TmaInterleave::kNone && inner_bytes % 16 != 0)
    return InvalidArgument("the inner box (box[0] = " + Str(m.box[0]) + " x " + Str(elem) + " bytes = " +
                           Str(inner_bytes) + " bytes) is not a multiple of 16 bytes");
  if (m.interleave == TmaInterleave::kNone && m.swizzle != TmaSwizzle::kNone) {
    const uint64_t span = uint64_t{16} << static_cast<int>(m.swizzle);  // 32, 64, 128
    if (inner_bytes > span)
      return InvalidArgument("the inner box (box[0] = " + Str(m.box[0]) + " x " + Str(elem) + " bytes = " +
                             Str(inner_bytes) + " bytes) is wider than the " + Str(span) +
                             "B swizzle span: use box[0] <= " + Str(span / elem) + " or a wider swizzle");
  }
  if (m.interleave == TmaInterleave::k32B && m.swizzle != TmaSwizzle::k32B)
    return InvalidArgument("\"interleave\": \"32B\" needs \"swizzle\": \"32B\"");
  if (m.oob_fill == TmaOobFill::kNan && !FloatingTma(m.dtype))
    return InvalidArgument("\"oob_fill\": \"nan\" needs a floating-point dtype");
  // Ours, not the driver's: the walk must stay inside its tensor. A map wider
  // than its tensor would let a kernel read another input set's data or write
  // the guard bytes around an output (stops reaching outside the buffer the
  // plan names through a descriptor the evaluator built).
  unsigned __int128 last = static_cast<unsigned __int128>(m.dims[0]) * elem;
  for (int i = 1; i < m.rank; ++i) last += static_cast<unsigned __int128>(m.dims[i] - 1) * m.byte_strides[i - 1];
  if (last > static_cast<unsigned __int128>(m.target_bytes))
    return InvalidArgument("the map reaches byte " + Str(static_cast<uint64_t>(last)) + " of '" + m.tensor +
                           "', which has " + std::to_string(m.target_bytes) +
                           " bytes: dims and byte_strides must stay inside the tensor");
  return Status::Ok();
}

Status CheckTensorMapAddress(const TensorMapSpec& m, uint64_t address) {
  const uint64_t align = m.interleave == TmaInterleave::k32B ? 32 : 16;
  if (address % align != 0)
    return InvalidArgument("the global address of '" + m.tensor + "' is not " + Str(align) + "-byte aligned");
  return Status::Ok();
}

json TensorMapToJson(const TensorMapSpec& m) {
  std::vector<uint64_t> dims(m.dims.begin(), m.dims.begin() + m.rank);
  std::vector<uint64_t> strides(m.byte_strides.begin(), m.byte_strides.begin() + std::max(0, m.rank - 1));
  std::vector<uint32_t> box(m.box.begin(), m.box.begin() + m.rank);
  std::vector<uint32_t> estr(m.element_strides.begin(), m.element_strides.begin() + m.rank);
  return {{"name", m.name},
          {"tensor", m.tensor},
          {"scratch", m.scratch},
          {"target_bytes", m.target_bytes},
          {"dtype", static_cast<int>(m.dtype)},
          {"dims", dims},
          {"byte_strides", strides},
          {"box", box},
          {"element_strides", estr},
          {"interleave", static_cast<int>(m.interleave)},
          {"swizzle", static_cast<int>(m.swizzle)},
          {"l2_promotion", static_cast<int>(m.l2_promotion)},
          {"oob_fill", static_cast<int>(m.oob_fill)}};
}

StatusOr<TensorMapSpec> TensorMapFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("tensor map: not an object");
  try {
    TensorMapSpec m;
    m.name = j.at("name").get<std::string>();
    m.tensor = j.at("tensor").get<std::string>();
    m.scratch = j.at("scratch").get<bool>();
    m.target_bytes = j.at("target_bytes").get<int64_t>();
    KS_ASSIGN_OR_RETURN(m.dtype, FromInt(j.at("dtype").get<int>(), kDataTypes, "dtype"));
    auto dims = j.at("dims").get<std::vector<uint64_t>>();
    auto strides = j.at("byte_strides").get<std::vector<uint64_t>>();
    auto box = j.at("box").get<std::vector<uint32_t>>();
    auto estr = j.at("element_strides").get<std::vector<uint32_t>>();
    if (dims.empty() || dims.size() > static_cast<size_t>(kTensorMapMaxRank) || strides.size() + 1 != dims.size() ||
        box.size() != dims.size() || estr.size() != dims.size())
      return InvalidArgument("tensor map: inconsistent ranks");
    m.rank = static_cast<int>(dims.size());
    std::copy(dims.begin(), dims.end(), m.dims.begin());
    std::copy(strides.begin(), strides.end(), m.byte_strides.begin());
    std::copy(box.begin(), box.end(), m.box.begin());
    std::copy(estr.begin(), estr.end(), m.element_strides.begin());
    KS_ASSIGN_OR_RETURN(m.interleave, FromInt(j.at("interleave").get<int>(), kInterleaves, "interleave"));
    KS_ASSIGN_OR_RETURN(m.swizzle, FromInt(j.at("swizzle").get<int>(), kSwizzles, "swizzle"));
    KS_ASSIGN_OR_RETURN(m.l2_promotion, FromInt(j.at("l2_promotion").get<int>(), kPromotions, "l2_promotion"));
    KS_ASSIGN_OR_RETURN(m.oob_fill, FromInt(j.at("oob_fill").get<int>(), kFills, "oob_fill"));
    return m;
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("tensor map: ") + e.what());
  }
}

}  // namespace ks
