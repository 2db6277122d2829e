// Reading what a model answered: a list of ideas (ideas prompt) or a candidate
// (implement and repair prompts). Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/evaluation.h"

namespace ks {

struct ParsedIdea {
  std::string title;        // may be empty
  std::string description;  // the idea itself; never empty
  // "title: description", or the description alone: what prompts and the store keep.
  std::string Text() const;
};

// A JSON list of ideas, each a string or an object with "idea", "description",
// "text" and/or "title"/"name". Tolerates ```json fences, prose around the JSON
// and an object wrapping the list ({"ideas": [...]}). InvalidArgument saying
// what was found when no list of ideas can be read.
StatusOr<std::vector<ParsedIdea>> ParseIdeas(const std::string& text);

// A candidate reply. Never an error: a reply without a usable cuda block and
// launch plan is a result with ok() false, the parser's reason in parse_error
// and the raw text kept for the lineage store.
struct ParsedCandidate {
  Candidate candidate;      // set when ok()
  std::string parse_error;  // "" when ok()
  std::string raw;          // the whole reply, always
  bool ok() const { return parse_error.empty(); }
};

ParsedCandidate ParseCandidateResponse(const std::string& text);

}  // namespace ks
