// The reference data of a problem as the C++ side reads it: a manifest the
// bridge wrote (a cache entry on disk, or a resident reference's answer) turned
// into a ReferenceData, and its tensor files. Running the bridge is in
// bridge_client.cc, preparing a reference in reference_prep.cc.
#include "evaluator/problem.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/json_field.h"
#include "evaluator/reference/bridge_internal.h"

namespace ks {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace bridge_internal;

// ---- Reference data ----

StatusOr<std::string> ReferenceData::FilePath(int set, const std::string& name) const {
  if (set < 0 || set >= static_cast<int>(sets.size()))
    return NotFound(dir + ": no input set " + std::to_string(set) + " (there are " + std::to_string(sets.size()) + ")");
  auto it = sets[set].files.find(name);
  if (it == sets[set].files.end()) return NotFound(dir + ": set " + std::to_string(set) + " has no tensor '" + name + "'");
  return it->second;
}

int ReferenceData::JudgingSets() const {
  int n = 0;
  while (n < static_cast<int>(sets.size()) && sets[n].transform.empty() && !sets[n].practice) ++n;
  return n;
}

std::vector<int> ReferenceData::PracticeSets() const {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(sets.size()); ++i)
    if (sets[i].practice) out.push_back(i);
  return out;
}

std::string DefaultReferenceCacheDir() {
  if (std::string d = Env("KS_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = Env("XDG_CACHE_HOME"); !d.empty()) return (fs::path(d) / "kernelsearch" / "reference").string();
  std::string home = Env("HOME");
  if (home.empty()) home = "/tmp";
  return (fs::path(home) / ".cache" / "kernelsearch" / "reference").string();
}

namespace bridge_internal {

std::vector<std::string> StringList(const json& j, const char* key) {
  std::vector<std::string> out;
  if (const json* list = FieldIf(j, key, &json::is_array))
    for (const auto& v : *list)
      if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

Status CheckOwnParameters(const Signature& sig, const ReferenceSet& set, const std::string& where) {
  std::set<std::string> seen;
  for (const std::string& name : set.own_parameters) {
    bool known = false;
    for (const auto& p : sig.parameters) known = known || (p.name == name && !p.is_scalar);
    if (!known || !seen.insert(name).second)
      return InvalidArgument(where + ": set with seed " + std::to_string(set.seed) + " names '" + name +
                             "' as its own parameter, which is not a tensor parameter of the signature (or twice)");
  }
  if (!set.own_parameters.empty() && set.transform.empty())
    return InvalidArgument(where + ": a get_inputs() set with parameters of its own");
  return Status::Ok();
}

StatusOr<ReferenceData> ReferenceFromManifest(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("signature") || !j.contains("sets") || !j["sets"].is_array())
    return InvalidArgument(where + ": not a reference manifest");
  ReferenceData d;
  auto sig = SignatureFromJson(j["signature"]);
  if (!sig.ok()) return sig.status().WithContext(where);
  d.signature = std::move(sig).value();
  d.device = j.value("device", "");
  d.torch_version = j.value("torch", "");
  if (const json* t = FieldIf(j, "timing", &json::is_object)) {
    if (const json* f = FieldIf(*t, "eager", &json::is_object)) d.eager = TimingFromJson(*f);
    if (const json* f = FieldIf(*t, "compiled", &json::is_object)) d.compiled = TimingFromJson(*f);
    if (const json* f = FieldIf(*t, "eager_fp32", &json::is_object)) d.eager_fp32 = TimingFromJson(*f);
  }
  if (const json* f = FieldIf(j, "timing_precision", &json::is_string)) d.timing_precision = f->get<std::string>();
  if (const json* f = FieldIf(j, "warnings", &json::is_array))
    for (const auto& w : *f)
      if (w.is_string()) d.warnings.push_back(w.get<std::string>());
  if (const json* f = FieldIf(j, "notes", &json::is_array))
    for (const auto& n : *f)
      if (n.is_string()) d.notes.push_back(n.get<std::string>());
  if (const json* f = FieldIf(j, "degenerate", &json::is_array))
    for (const auto& w : *f)
      if (w.is_string()) d.degenerate.push_back(w.get<std::string>());
  if (const json* f = FieldIf(j, "phases", &json::is_array))
    for (const auto& ph : *f)
      if (ph.is_array() && ph.size() == 2 && ph[0].is_string() && ph[1].is_number())
        d.phases.emplace_back("bridge: " + ph[0].get<std::string>(), ph[1].get<double>());
  if (const json* f = FieldIf(j, "scalars", &json::is_object))
    for (const auto& [k, v] : f->items())
      if (v.is_number()) d.scalars[k] = v.get<double>();
  if (const json* p = FieldIf(j, "default_precision", &json::is_object))
    if (const json* f = FieldIf(*p, "errors", &json::is_object))
      for (const auto& [name, e] : f->items())
        if (e.is_object())
          d.default_precision_error[name] = {e.value("rms", 0.0), e.value("rel_norm", 0.0), e.value("max_abs", 0.0)};
  if (const json* f = FieldIf(j, "shape_variants", &json::is_number_integer))
    d.shape_variant_count = std::max(0, f->get<int>());
  if (const json* f = FieldIf(j, "transforms", &json::is_array))
    for (const auto& t : *f) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) continue;
      InputTransform x;
      x.name = t["name"].get<std::string>();
      const json* set = FieldIf(t, "set", &json::is_number_integer);
      x.set = set ? set->get<int>() : -1;
      x.note = t.value("note", "");
      if (const json* f = FieldIf(t, "reference_error", &json::is_object))
        for (const auto& [name, e] : f->items())
          if (e.is_object()) x.reference_error[name] = {e.value("rms", 0.0), e.value("rel_norm", 0.0)};
      x.parameters = StringList(t, "parameters");
      d.transforms.push_back(std::move(x));
    }
  return d;
}

StatusOr<std::pair<const TensorSpec*, int64_t>> SetTensorKey(const Signature& sig, const std::string& key) {
  const size_t at = key.find('@');
  const std::string base = at == std::string::npos ? key : key.substr(0, at);
  const TensorSpec* spec = sig.Find(base);
  if (!spec || spec->is_scalar) return InvalidArgument("'" + key + "' is not a tensor of the signature");
  if (at == std::string::npos) return std::make_pair(spec, spec->bytes());
  const std::string level = key.substr(at + 1);
  bool output = false;
  for (const auto& o : sig.outputs) output = output || o.name == base;
  if (!output || (level != "highest" && level != "high" && level != "medium"))
    return InvalidArgument("'" + key + "' is not a bound array of an output (out@highest, out@high, out@medium)");
  return std::make_pair(spec, static_cast<int64_t>((spec->numel() + kBoundBlock - 1) / kBoundBlock * 4));
}

void ReadSetJudging(const json& s, ReferenceSet* set) {
  if (const json* f = FieldIf(s, "truth", &json::is_string)) set->truth = f->get<std::string>();
  if (const json* f = FieldIf(s, "truth_note", &json::is_string)) set->truth_note = f->get<std::string>();
  if (const json* f = FieldIf(s, "pytorch_error", &json::is_object))
    for (const auto& [name, e] : f->items())
      if (e.is_object())
        set->pytorch_error[name] = {e.value("rms", 0.0), e.value("rel_norm", 0.0), e.value("max_abs", 0.0),
                                    e.value("ill_conditioned", int64_t{0})};
}

Status ReadSetFacts(const json& s, const Signature& sig, const std::string& where, ReferenceSet* set) {
  ReadSetJudging(s, set);
  set->transform = s.value("transform", "");
  set->practice = s.value("practice", false);
  set->own_parameters = StringList(s, "parameters");
  return CheckOwnParameters(sig, *set, where);
}

Status CheckTransformOrder(const ReferenceData& d, const std::string& where) {
  bool shifted = false;
  for (const auto& s : d.sets) {
    if (!s.transform.empty()) shifted = true;
    else if (shifted) return InvalidArgument(where + ": a get_inputs() set after a distribution-shifted one");
  }
  for (const auto& t : d.transforms)
    if (t.set >= 0 && (t.set >= static_cast<int>(d.sets.size()) || d.sets[t.set].transform != t.name))
      return InvalidArgument(where + ": transform '" + t.name + "' names input set " + std::to_string(t.set) +
                             ", which is not its set");
  return Status::Ok();
}

}  // namespace bridge_internal

StatusOr<ReferenceData> LoadReferenceDir(const std::string& dir_in) {
  const fs::path dir = fs::absolute(dir_in).lexically_normal();
  const std::string manifest_path = (dir / "manifest.json").string();
  KS_ASSIGN_OR_RETURN(std::string text, ReadFile(manifest_path, 64u << 20));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  KS_ASSIGN_OR_RETURN(ReferenceData d, ReferenceFromManifest(j, manifest_path));
  d.dir = dir.string();
  for (const auto& s : j["sets"]) {
    ReferenceSet set;
    set.seed = s.value("seed", uint64_t{0});
    if (!s.contains("files") || !s["files"].is_object())
      return InvalidArgument(manifest_path + ": a set has no 'files'");
    std::map<std::string, std::string> tensors;
    for (const auto& [name, rel] : s["files"].items()) {
      auto key = SetTensorKey(d.signature, name);
      if (!key.ok()) return key.status().WithContext(manifest_path + ": a file");
      fs::path p = (dir / rel.get<std::string>()).lexically_normal();
      std::error_code ec;
      uintmax_t size = fs::file_size(p, ec);
      if (ec) return InvalidArgument(manifest_path + ": " + p.string() + ": " + ec.message());
      if (static_cast<int64_t>(size) != key->second)
        return InvalidArgument(p.string() + ": " + std::to_string(size) + " bytes, expected " +
                               std::to_string(key->second) + " for '" + name + "'");
      set.files[name] = p.string();
      if (name.find('@') == std::string::npos) tensors[name] = p.string();
    }
    KS_RETURN_IF_ERROR(CheckSetComplete(d.signature, tensors, set.seed, manifest_path));
    KS_RETURN_IF_ERROR(ReadSetFacts(s, d.signature, manifest_path, &set));
    d.sets.push_back(std::move(set));
  }
  if (d.sets.empty()) return InvalidArgument(manifest_path + ": no input sets");
  KS_RETURN_IF_ERROR(CheckTransformOrder(d, manifest_path));
  return d;
}

StatusOr<std::string> ReadTensorFile(const std::string& path, const TensorSpec& spec) {
  if (spec.is_scalar) return InvalidArgument("'" + spec.name + "' is a scalar; it has no tensor file");
  const size_t want = static_cast<size_t>(spec.bytes());
  KS_ASSIGN_OR_RETURN(std::string data, ReadFile(path, want + 1));
  if (data.size() != want)
    return InvalidArgument(path + ": " + std::to_string(data.size()) + " bytes, expected " + std::to_string(want) +
                           " for '" + spec.name + "' (" + DTypeName(spec.dtype) + ")");
  return data;
}

}  // namespace ks
