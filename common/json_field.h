// Reading optional fields of a JSON object, the two patterns every reader of
// our JSON (configs, evaluations, bridge replies) needs: "take it when given,
// keep the default otherwise" and "use it only when it has the right kind".
#pragma once

#include <nlohmann/json.hpp>

namespace ks {

// Sets *field from j[key] when j has that key and leaves it otherwise. A value
// of the wrong type throws nlohmann::json::type_error, as json::value does, so
// a reader that catches json::exception reports it.
template <typename T>
void ReadField(const nlohmann::json& j, const char* key, T* field) {
  auto it = j.find(key);
  if (it != j.end()) *field = it->get<T>();
}

// j[key] when j is an object holding key and `is_kind` (&json::is_object,
// &json::is_array, &json::is_number, ...) holds for it; null otherwise.
inline const nlohmann::json* FieldIf(const nlohmann::json& j, const char* key,
                                     bool (nlohmann::json::*is_kind)() const noexcept) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it != j.end() && ((*it).*is_kind)() ? &*it : nullptr;
}

}  // namespace ks
