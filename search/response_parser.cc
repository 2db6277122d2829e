#include "search/response_parser.h"

#include <nlohmann/json.hpp>

#include "evaluator/compile/candidate_parser.h"

namespace ks {
namespace {

using nlohmann::json;

// The contents of every ``` fenced block, in order.
std::vector<std::string> FencedBlocks(const std::string& text) {
  std::vector<std::string> blocks;
  size_t pos = 0;
  for (;;) {
    size_t open = text.find("```", pos);
    if (open == std::string::npos) break;
    size_t body = text.find('\n', open);
    if (body == std::string::npos) break;
    size_t close = text.find("```", body + 1);
    if (close == std::string::npos) {
      blocks.push_back(text.substr(body + 1));  // a reply cut off inside its block
      break;
    }
    blocks.push_back(text.substr(body + 1, close - body - 1));
    pos = close + 3;
  }
  return blocks;
}

std::string FirstString(const json& obj, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (obj.contains(k) && obj[k].is_string() && !obj[k].get<std::string>().empty()) return obj[k].get<std::string>();
  return "";
}

// Ideas from a parsed JSON value: a list, or an object holding a list.
std::vector<ParsedIdea> IdeasFromJson(const json& j) {
  const json* list = nullptr;
  if (j.is_array()) {
    list = &j;
  } else if (j.is_object()) {
    for (const char* k : {"ideas", "items", "optimizations", "suggestions"})
      if (j.contains(k) && j[k].is_array()) list = &j[k];
    if (!list)
      for (auto it = j.begin(); it != j.end(); ++it)
        if (it->is_array()) {
          list = &*it;
          break;
        }
  }
  std::vector<ParsedIdea> ideas;
  if (!list) return ideas;
  for (const auto& item : *list) {
    ParsedIdea idea;
    if (item.is_string()) {
      idea.description = item.get<std::string>();
    } else if (item.is_object()) {
      idea.title = FirstString(item, {"title", "name"});
      idea.description = FirstString(item, {"idea", "description", "text", "details", "summary"});
      if (idea.description.empty()) std::swap(idea.title, idea.description);
    }
    if (!idea.description.empty()) ideas.push_back(std::move(idea));
  }
  return ideas;
}

std::vector<ParsedIdea> TryParse(const std::string& s) {
  json j = json::parse(s, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (j.is_discarded()) return {};
  return IdeasFromJson(j);
}

}  // namespace

std::string ParsedIdea::Text() const { return title.empty() ? description : title + ": " + description; }

StatusOr<std::vector<ParsedIdea>> ParseIdeas(const std::string& text) {
  // Candidates for the JSON, most specific first: fenced blocks (the last one
  // is usually the answer after any drafts), the whole reply, then the widest
  // [...] and {...} spans, which skip prose around a bare list.
  std::vector<std::string> tries;
  std::vector<std::string> blocks = FencedBlocks(text);
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) tries.push_back(*it);
  tries.push_back(text);
  for (auto [open, close] : {std::pair{'[', ']'}, std::pair{'{', '}'}}) {
    size_t b = text.find(open);
    size_t e = text.rfind(close);
    if (b != std::string::npos && e != std::string::npos && e > b) tries.push_back(text.substr(b, e - b + 1));
  }
  for (const auto& t : tries) {
    std::vector<ParsedIdea> ideas = TryParse(t);
    if (!ideas.empty()) return ideas;
  }
  std::string what = blocks.empty() ? "no fenced block and no JSON list in the reply"
                                    : std::to_string(blocks.size()) + " fenced block(s), none a JSON list of ideas";
  return InvalidArgument("no ideas found: " + what);
}

ParsedCandidate ParseCandidateResponse(const std::string& text) {
  ParsedCandidate out;
  out.raw = text;
  StatusOr<Candidate> c = ParseCandidateMarkdown(text);
  if (c.ok()) {
    out.candidate = std::move(c).value();
  } else {
    out.parse_error = c.status().message().empty() ? "unparseable reply" : c.status().message();
  }
  return out;
}

}  // namespace ks
