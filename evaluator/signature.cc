#include "evaluator/signature.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace ks {

StatusOr<DType> ParseDType(const std::string& s) {
  if (s == "float32" || s == "float") return DType::kFloat32;
  if (s == "float16" || s == "half") return DType::kFloat16;
  if (s == "bfloat16") return DType::kBFloat16;
  if (s == "float64" || s == "double") return DType::kFloat64;
  if (s == "int32" || s == "int") return DType::kInt32;
  if (s == "int64" || s == "long") return DType::kInt64;
  if (s == "int8") return DType::kInt8;
  if (s == "uint8") return DType::kUInt8;
  if (s == "bool") return DType::kBool;
  return InvalidArgument("unsupported dtype '" + s + "'");
}

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kInt8: return "int8";
    case DType::kUInt8: return "uint8";
    case DType::kBool: return "bool";
  }
  return "?";
}

size_t DTypeSize(DType d) {
  switch (d) {
    case DType::kFloat32: case DType::kInt32: return 4;
    case DType::kFloat16: case DType::kBFloat16: return 2;
    case DType::kFloat64: case DType::kInt64: return 8;
    case DType::kInt8: case DType::kUInt8: case DType::kBool: return 1;
  }
  return 0;
}

bool IsFloating(DType d) {
  return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16 || d == DType::kFloat64;
}

int64_t TensorSpec::numel() const {
  if (is_scalar) return 1;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

const TensorSpec* Signature::Find(const std::string& n) const {
  for (const auto* list : {&inputs, &parameters, &outputs})
    for (const auto& t : *list)
      if (t.name == n) return &t;
  return nullptr;
}

int64_t Signature::MinimumBytes() const {
  int64_t b = 0;
  for (const auto* list : {&inputs, &parameters, &outputs})
    for (const auto& t : *list)
      if (!t.is_scalar) b += t.bytes();
  return b;
}

Tolerance DefaultTolerance(DType d) {
  // The norm bounds sit well above what honest kernels reach (reordered fp32
  // reductions: ~1e-7; one rounding of a bf16 output: ~2e-3) and well below
  // what a lower precision gives (fp16 arithmetic for an fp32 output: ~3e-4).
  switch (d) {
    case DType::kFloat16: return {1e-2, 1e-2, 5e-3, 1e-1, 1e-3};
    case DType::kBFloat16: return {2e-2, 2e-2, 1e-2, 2e-1, 1e-3};
    case DType::kFloat64: return {1e-8, 1e-6, 1e-9, 1e-5, 1e-3};
    case DType::kFloat32: return {1e-4, 1e-4, 1e-5, 1e-3, 1e-3};
    default: return {};  // integers and bool compare exactly
  }
}

Tolerance Signature::ToleranceFor(DType d) const {
  Tolerance t = DefaultTolerance(d);
  if (!tolerance) return t;
  const Tolerance& p = *tolerance;
  t.atol = p.atol;
  t.rtol = p.rtol;
  if (t.rel_norm == 0) return t;  // exact dtypes stay element-wise only
  // A problem that loosens rtol (a TF32 reference, say) loosens the norm
  // bounds with it, unless it names them: rel_norm a quarter of rtol, the
  // large-error threshold ten times rtol.
  t.rel_norm = p.rel_norm > 0 ? p.rel_norm : std::max(t.rel_norm, p.rtol / 4);
  t.large_rel = p.large_rel > 0 ? p.large_rel : std::max(t.large_rel, 10 * p.rtol);
  if (p.large_share > 0) t.large_share = p.large_share;
  return t;
}

Tolerance WidenForRounding(Tolerance t, const ReferenceError& e) {
  if (t.rel_norm == 0 || !(e.rel_norm <= kMaxRoundingRelNorm) || !(e.rms >= 0)) return t;
  t.atol += kRoundingFactor * e.rms;
  t.rel_norm = std::max(t.rel_norm, kRoundingFactor * e.rel_norm);
  t.large_rel = std::max(t.large_rel, 20 * kRoundingFactor * e.rel_norm);
  return t;
}

Tolerance Signature::ToleranceFor(const TensorSpec& output) const {
  Tolerance t = ToleranceFor(output.dtype);
  if (output.dtype != DType::kFloat32) return t;
  auto it = reference_error.find(output.name);
  return it == reference_error.end() ? t : WidenForRounding(t, it->second);
}

Tolerance ShiftedSetTolerance(Tolerance set0, Tolerance base, double scale, const ReferenceError* own) {
  set0.atol *= scale;
  if (!own) return set0;
  base.atol *= scale;
  const Tolerance widened = WidenForRounding(base, *own);
  set0.atol = std::max(set0.atol, widened.atol);
  set0.rel_norm = std::max(set0.rel_norm, widened.rel_norm);
  set0.large_rel = std::max(set0.large_rel, widened.large_rel);
  return set0;
}

namespace {
std::string Short(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}
}  // namespace

std::string Signature::DescribeTolerance(const TensorSpec& output) const {
  const Tolerance base = ToleranceFor(output.dtype), t = ToleranceFor(output);
  std::string s = "atol " + Short(t.atol);
  if (t.atol != base.atol) {
    const ReferenceError& e = reference_error.at(output.name);
    s += " (" + Short(base.atol) + " + " + Short(kRoundingFactor) + " x PyTorch's own float32 error, RMS " +
         Short(e.rms) + ")";
  }
  s += ", rtol " + Short(t.rtol);
  if (t.rel_norm != base.rel_norm) s += ", relative norm " + Short(t.rel_norm) + " (widened likewise)";
  return s;
}

HostComparison CompareOnHost(const Tolerance& tol, const std::vector<double>& out, const std::vector<double>& ref) {
  HostComparison c;
  const size_t n = std::min(out.size(), ref.size());
  double ssd = 0, ssr = 0;
  for (size_t i = 0; i < n; ++i) ssr += std::isfinite(ref[i]) ? ref[i] * ref[i] : 0;
  const double rms = n ? std::sqrt(ssr / n) : 0;
  const double tiny = tol.large_rel > 0 ? std::max(tol.TinyFraction() * rms, std::numeric_limits<double>::min()) : INFINITY;
  for (size_t i = 0; i < n; ++i) {
    const double o = out[i], r = ref[i];
    bool bad;
    if (std::isnan(r)) bad = !std::isnan(o);
    else if (std::isinf(r)) bad = o != r;
    else if (!std::isfinite(o)) bad = true;
    else {
      const double d = std::fabs(o - r);
      ssd += d * d;
      bad = d > tol.atol + tol.rtol * std::fabs(r);
      if (std::fabs(r) >= tiny) {
        ++c.considered;
        if (d > tol.large_rel * std::fabs(r)) ++c.large_errors;
      }
    }
    if (bad) ++c.mismatches;
  }
  c.mismatches += static_cast<int64_t>(std::max(out.size(), ref.size()) - n);
  c.rel_norm = ssr > 0 ? std::sqrt(ssd / ssr) : std::sqrt(ssd);
  const bool norm_broken = tol.rel_norm > 0 && (c.rel_norm > tol.rel_norm ||
                                                (c.considered > 0 && static_cast<double>(c.large_errors) >
                                                                         tol.large_share * c.considered));
  c.passes = c.mismatches == 0 && !norm_broken;
  return c;
}

namespace {

StatusOr<TensorSpec> SpecFromJson(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("name") || !j.contains("dtype"))
    return InvalidArgument("signature entry needs 'name' and 'dtype': " + j.dump());
  TensorSpec t;
  t.name = j["name"].get<std::string>();
  KS_ASSIGN_OR_RETURN(t.dtype, ParseDType(j["dtype"].get<std::string>()));
  t.is_scalar = j.value("kind", "tensor") == "scalar";
  if (t.is_scalar) {
    t.scalar_value = j.value("value", 0.0);
  } else {
    t.shape = j.value("shape", std::vector<int64_t>{});
    t.strides = j.value("strides", std::vector<int64_t>{});
    if (t.strides.empty()) {
      t.strides.resize(t.shape.size());
      int64_t s = 1;
      for (size_t i = t.shape.size(); i-- > 0;) { t.strides[i] = s; s *= t.shape[i]; }
    }
  }
  return t;
}

nlohmann::json SpecToJson(const TensorSpec& t) {
  nlohmann::json j{{"name", t.name}, {"dtype", DTypeName(t.dtype)}, {"kind", t.is_scalar ? "scalar" : "tensor"}};
  if (t.is_scalar) {
    j["value"] = t.scalar_value;
  } else {
    j["shape"] = t.shape;
    j["strides"] = t.strides;
  }
  return j;
}

}  // namespace

StatusOr<Signature> SignatureFromJson(const nlohmann::json& j) {
  if (!j.is_object()) return InvalidArgument("signature is not a JSON object");
  Signature s;
  s.file = j.value("file", "");
  s.name = j.value("name", "");
  s.description = j.value("description", "");
  if (j.contains("tolerance") && j["tolerance"].is_object()) {
    const auto& t = j["tolerance"];
    s.tolerance = Tolerance{t.value("atol", 0.0), t.value("rtol", 0.0), t.value("rel_norm", 0.0),
                            t.value("large_rel", 0.0), t.value("large_share", 0.0)};
  }
  if (j.contains("flops") && j["flops"].is_number()) s.flops = j["flops"].get<double>();
  // The bridge writes null where it has no figure (Python's None).
  auto text = [&](const char* key, const std::string& otherwise) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : otherwise;
  };
  s.flops_source = text("flops_source", s.flops ? "FLOPS" : "");
  s.flops_note = text("flops_note", "");
  if (j.contains("flops_by_class") && j["flops_by_class"].is_object())
    for (const auto& [cls, v] : j["flops_by_class"].items())
      if (v.is_number() && v.get<double>() > 0) s.flops_by_class[cls] = v.get<double>();
  for (auto [key, dst] : {std::pair{"inputs", &s.inputs}, {"parameters", &s.parameters}, {"outputs", &s.outputs}}) {
    if (!j.contains(key)) continue;
    for (const auto& e : j[key]) {
      KS_ASSIGN_OR_RETURN(TensorSpec t, SpecFromJson(e));
      dst->push_back(std::move(t));
    }
  }
  if (s.outputs.empty()) return InvalidArgument("signature has no outputs");
  if (j.contains("reference_error") && j["reference_error"].is_object())
    for (const auto& [name, e] : j["reference_error"].items()) {
      if (!e.is_object() || !e.contains("rms") || !e.contains("rel_norm") || !e["rms"].is_number() ||
          !e["rel_norm"].is_number())
        return InvalidArgument("reference_error of '" + name + "' needs numbers 'rms' and 'rel_norm'");
      s.reference_error[name] = ReferenceError{e["rms"].get<double>(), e["rel_norm"].get<double>()};
    }
  return s;
}

nlohmann::json SignatureToJson(const Signature& s) {
  nlohmann::json j{{"file", s.file}, {"name", s.name}, {"description", s.description}};
  j["tolerance"] = nullptr;
  if (s.tolerance) {
    const Tolerance& t = *s.tolerance;
    j["tolerance"] = {{"atol", t.atol}, {"rtol", t.rtol}};
    for (auto [key, v] : {std::pair{"rel_norm", t.rel_norm}, {"large_rel", t.large_rel}, {"large_share", t.large_share}})
      if (v > 0) j["tolerance"][key] = v;
  }
  j["flops"] = s.flops ? nlohmann::json(*s.flops) : nlohmann::json(nullptr);
  if (!s.flops_source.empty()) j["flops_source"] = s.flops_source;
  if (!s.flops_note.empty()) j["flops_note"] = s.flops_note;
  if (!s.flops_by_class.empty()) j["flops_by_class"] = s.flops_by_class;
  if (!s.reference_error.empty()) {
    j["reference_error"] = nlohmann::json::object();
    for (const auto& [name, e] : s.reference_error) j["reference_error"][name] = {{"rms", e.rms}, {"rel_norm", e.rel_norm}};
  }
  for (auto [key, src] : {std::pair{"inputs", &s.inputs}, {"parameters", &s.parameters}, {"outputs", &s.outputs}}) {
    j[key] = nlohmann::json::array();
    for (const auto& t : *src) j[key].push_back(SpecToJson(t));
  }
  return j;
}

}  // namespace ks
