#include "search/gpu_datasheet.h"

#include <algorithm>
#include <cctype>
#include <set>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "evaluator/problem.h"
#include "search/search_config.h"

namespace ks {
namespace {

std::set<std::string> Words(const std::string& text) {
  std::set<std::string> out;
  std::string word;
  for (char c : text + " ") {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!word.empty()) {
      out.insert(word);
      word.clear();
    }
  }
  return out;
}

}  // namespace

StatusOr<std::optional<GpuFacts>> DatasheetGpuFactsFrom(const std::string& json_text, const std::string& name) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("gpus") || !j["gpus"].is_array())
    return InvalidArgument("the GPU datasheet is not an object with a \"gpus\" list");
  const std::set<std::string> words = Words(name);
  for (const auto& entry : j["gpus"]) {
    if (!entry.is_object() || !entry.contains("match") || !entry["match"].is_array())
      return InvalidArgument("the GPU datasheet has an entry without a \"match\" list");
    bool all = !entry["match"].empty();
    for (const auto& m : entry["match"]) {
      if (!m.is_string()) return InvalidArgument("the GPU datasheet has a \"match\" word that is not a string");
      std::set<std::string> w = Words(m.get<std::string>());
      all = all && std::all_of(w.begin(), w.end(), [&](const std::string& x) { return words.count(x) > 0; });
    }
    if (!all) continue;
    GpuFacts g = GpuFactsFromJson(entry);
    g.name = name;
    g.source = "datasheet";
    return std::optional<GpuFacts>(g);
  }
  return std::optional<GpuFacts>();
}

StatusOr<std::optional<GpuFacts>> DatasheetGpuFacts(const std::string& name) {
  KS_ASSIGN_OR_RETURN(std::string path, FindDataFile("prompts/gpu_datasheet.json"));
  KS_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  auto facts = DatasheetGpuFactsFrom(text, name);
  if (!facts.ok()) return facts.status().WithContext(path);
  return facts;
}

}  // namespace ks
