#include "store/candidate_hash.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "evaluator/plan/launch_plan.h"

namespace ks::store {
namespace {

bool IsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Drops whitespace, keeping one space only where it separates two word
// characters ("unsigned int" stays apart; "f( x )" and "f(x)" become equal).
std::string CollapseWhitespace(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool pending_space = false;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space && IsWordChar(out.back()) && IsWordChar(c)) out.push_back(' ');
    pending_space = false;
    out.push_back(c);
  }
  return out;
}

}  // namespace

std::string NormalizeSource(const std::string& source) {
  std::string stripped;
  stripped.reserve(source.size());
  size_t i = 0, n = source.size();
  while (i < n) {
    char c = source[i];
    if (c == '"' || c == '\'') {
      // Copy the literal whole: "//" inside a string is not a comment.
      char quote = c;
      stripped.push_back(c);
      ++i;
      while (i < n && source[i] != quote) {
        if (source[i] == '\\' && i + 1 < n) stripped.push_back(source[i++]);
        stripped.push_back(source[i++]);
      }
      if (i < n) stripped.push_back(source[i++]);
    } else if (c == '/' && i + 1 < n && source[i + 1] == '/') {
      while (i < n && source[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < n && source[i + 1] == '*') {
      size_t end = source.find("*/", i + 2);
      i = end == std::string::npos ? n : end + 2;
      stripped.push_back(' ');  // a comment separates tokens
    } else {
      stripped.push_back(c);
      ++i;
    }
  }
  return CollapseWhitespace(stripped);
}

std::string NormalizePlan(const std::string& plan_json) {
  if (!CheckPlanText(plan_json).ok()) return CollapseWhitespace(plan_json);  // dump() recurses: limits first
  nlohmann::json j = nlohmann::json::parse(plan_json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return CollapseWhitespace(plan_json);
  return j.dump();  // nlohmann::json objects are std::map: keys come out sorted
}

std::string CandidateContentHash(const std::string& source, const std::string& plan_json) {
  std::string key = NormalizeSource(source);
  key.push_back('\0');  // keeps "ab"+"c" apart from "a"+"bc"
  key += NormalizePlan(plan_json);
  return Sha256Hex(key);
}

}  // namespace ks::store
