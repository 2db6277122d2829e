#include "common/json_depth.h"

namespace ks {

int JsonNestingDepth(std::string_view text, int stop_above) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > stop_above) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

Status CheckJsonNesting(std::string_view text, int max_depth, const std::string& what) {
  if (JsonNestingDepth(text, max_depth) > max_depth)
    return InvalidArgument(what + " nests [ ] and { } deeper than " + std::to_string(max_depth) + " levels");
  return Status::Ok();
}

}  // namespace ks
