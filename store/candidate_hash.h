// The identity of a candidate for deduplication: two candidates whose CUDA source
// differs only in comments and whitespace and whose plans are the same JSON value
// are the same candidate, and are evaluated once.
#pragma once

#include <string>

namespace ks::store {

// Source with // and /* */ comments removed (string and character literals kept
// as they are) and whitespace dropped except one space between two word
// characters. (Whitespace inside string literals is collapsed too: device code
// rarely has strings, and printf formats do not change what a kernel computes.)
std::string NormalizeSource(const std::string& source);
// The plan re-serialized canonically (sorted keys, no whitespace); text that is
// not JSON is whitespace-collapsed instead so that it still hashes stably.
std::string NormalizePlan(const std::string& plan_json);
// Hex SHA-256 over the normalized source and plan.
std::string CandidateContentHash(const std::string& source, const std::string& plan_json);

}  // namespace ks::store
