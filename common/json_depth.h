// How deeply a JSON text nests [ ] and { }, found by one pass over the text
// (never recursive), so that a reply nested 150,000 levels deep is refused
// before nlohmann::json builds it: copying or destroying such a value
// recurses once per level and overflows the stack of the trusted process.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace ks {

// The deepest nesting of [ ] and { } outside strings; stops counting (and
// returns it) as soon as it passes `stop_above`.
int JsonNestingDepth(std::string_view text, int stop_above);

// InvalidArgument("<what> nests [ ] and { } deeper than <max_depth> levels") when it does.
Status CheckJsonNesting(std::string_view text, int max_depth, const std::string& what);

// The nesting any model reply, tool-call argument or recorded transcript may
// have (ordinary ones stay under 20).
inline constexpr int kMaxModelJsonDepth = 256;

}  // namespace ks
