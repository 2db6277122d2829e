#include "evaluator/compile/candidate_parser.h"

#include <filesystem>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "evaluator/plan/launch_plan.h"

namespace ks {
namespace {

struct Block {
  std::string lang;
  std::string body;
};

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// Fenced blocks (``` or ~~~, three or more, optionally indented up to 3 spaces).
// An unclosed fence at the end (a reply cut off) still yields its block.
std::vector<Block> FencedBlocks(const std::string& text, std::string* outside) {
  std::vector<Block> blocks;
  size_t pos = 0;
  bool in_block = false;
  std::string fence;
  Block cur;
  while (pos <= text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string line = text.substr(pos, eol - pos);
    std::string t = line;
    size_t indent = t.find_first_not_of(' ');
    if (indent != std::string::npos && indent <= 3) t = t.substr(indent);
    if (!in_block) {
      if (t.rfind("```", 0) == 0 || t.rfind("~~~", 0) == 0) {
        char fc = t[0];
        size_t n = t.find_first_not_of(fc);
        if (n == std::string::npos) n = t.size();
        fence = t.substr(0, n);
        cur = Block{Lower(Trim(t.substr(n))), ""};
        size_t sp = cur.lang.find_first_of(" \t{");
        if (sp != std::string::npos) cur.lang = cur.lang.substr(0, sp);
        in_block = true;
      } else if (outside) {
        *outside += line + "\n";
      }
    } else {
      std::string tt = Trim(t);
      if (tt.size() >= fence.size() && tt.rfind(fence, 0) == 0 && tt.find_first_not_of(fence[0]) == std::string::npos) {
        blocks.push_back(cur);
        in_block = false;
      } else {
        cur.body += line + "\n";
      }
    }
    pos = eol + 1;
  }
  if (in_block) blocks.push_back(cur);
  return blocks;
}

bool IsCudaLang(const std::string& l) {
  return l == "cuda" || l == "cu" || l == "c++" || l == "cpp" || l == "c" || l == "cuh" || l == "cuda-c" || l == "cxx";
}

bool DeclaresKernel(const std::string& body) { return body.find("__global__") != std::string::npos; }

bool IsPlanObject(const nlohmann::json& j) { return j.is_object() && j.contains("launches"); }

// A block past the plan limits (launch_plan.h) is never parsed here; one that
// names "launches" is taken as the plan, so that the evaluator refuses it as
// invalid_plan with the limit it breaks and the search goes on.
bool OverLimitPlan(const std::string& body) {
  return !CheckPlanText(body).ok() && body.find("\"launches\"") != std::string::npos;
}

// Bare JSON objects with "launches" in text outside fences: scan balanced braces.
std::optional<std::string> BarePlan(const std::string& text) {
  std::optional<std::string> found;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '{') continue;
    int depth = 0;
    bool in_str = false, esc = false;
    for (size_t j = i; j < text.size(); ++j) {
      char c = text[j];
      if (in_str) {
        if (esc) esc = false;
        else if (c == '\\') esc = true;
        else if (c == '"') in_str = false;
        continue;
      }
      if (c == '"') in_str = true;
      else if (c == '{') ++depth;
      else if (c == '}' && --depth == 0) {
        std::string cand = text.substr(i, j - i + 1);
        if (OverLimitPlan(cand)) {  // the evaluator refuses it (invalid_plan), naming the limit
          found = cand;
          i = j;
          break;
        }
        auto j2 = CheckPlanText(cand).ok() ? nlohmann::json::parse(cand, nullptr, false) : nlohmann::json();
        if (!j2.is_discarded() && IsPlanObject(j2)) {
          found = cand;
          i = j;
        }
        break;
      }
    }
  }
  return found;
}

}  // namespace

StatusOr<Candidate> ParseCandidateMarkdown(const std::string& text) {
  std::string outside;
  auto blocks = FencedBlocks(text, &outside);
  const Block* cuda = nullptr;
  const Block* cuda_any = nullptr;
  std::optional<std::string> plan;
  std::string plan_error;
  for (const auto& b : blocks) {
    if (IsCudaLang(b.lang) || (b.lang.empty() && DeclaresKernel(b.body))) {
      cuda_any = &b;
      if (DeclaresKernel(b.body)) cuda = &b;
    }
    if (b.lang == "json" || b.lang == "jsonc" || b.lang.empty()) {
      if (OverLimitPlan(b.body)) {
        plan = b.body;
        plan_error.clear();
        continue;
      }
      if (!CheckPlanText(b.body).ok()) continue;
      auto j = nlohmann::json::parse(b.body, nullptr, false);
      if (j.is_discarded()) {
        if (b.lang.rfind("json", 0) == 0) {
          // Keep the parser's own message: it says where the JSON breaks.
          try {
            (void)nlohmann::json::parse(b.body);
          } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for 1e999
            plan_error = std::string("launch-plan block is not valid JSON: ") + e.what();
          }
        }
      } else if (IsPlanObject(j)) {
        plan = b.body;
        plan_error.clear();
      } else if (b.lang == "json" && !plan) {
        plan_error = "the ```json block has no \"launches\" list";
      }
    }
  }
  if (!cuda) cuda = cuda_any;
  if (!plan) plan = BarePlan(outside);
  if (!cuda && !plan) return InvalidArgument("no ```cuda block and no launch-plan ```json block found");
  if (!cuda) return InvalidArgument("no ```cuda block found (the launch plan is there)");
  if (!plan) {
    if (!plan_error.empty()) return InvalidArgument(plan_error);
    return InvalidArgument("no launch-plan ```json block found (a JSON object with \"launches\")");
  }
  return Candidate{cuda->body, Trim(*plan)};
}

StatusOr<Candidate> LoadCandidateFiles(const std::string& path, const std::string& plan_path) {
  namespace fs = std::filesystem;
  KS_ASSIGN_OR_RETURN(std::string text, ReadFile(path, 16u << 20));
  fs::path p(path);
  std::string ext = Lower(p.extension().string());
  if (ext == ".md" || ext == ".markdown" || ext == ".txt") {
    auto c = ParseCandidateMarkdown(text);
    if (!c.ok()) return c.status().WithContext(path);
    return c;
  }
  std::string pp = plan_path;
  if (pp.empty()) {
    fs::path guess = p;
    guess.replace_extension(".json");
    if (!fs::exists(guess)) {
      return InvalidArgument(path + ": no launch plan: pass --plan FILE or put " + guess.string() +
                             " next to it (or use one .md file with a ```cuda and a ```json block)");
    }
    pp = guess.string();
  }
  KS_ASSIGN_OR_RETURN(std::string plan, ReadFile(pp, 1u << 20));
  return Candidate{text, plan};
}

}  // namespace ks
