// Base64 (RFC 4648, with padding), for binary blobs inside JSON messages.
#pragma once

#include <string>

#include "common/status.h"

namespace ks {

std::string Base64Encode(const std::string& data);
StatusOr<std::string> Base64Decode(const std::string& text);

}  // namespace ks
