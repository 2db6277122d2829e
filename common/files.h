// Small file helpers returning Status with the path and errno text in the message.
#pragma once

#include <string>

#include "common/status.h"

namespace ks {

StatusOr<std::string> ReadFile(const std::string& path, size_t max_bytes = 256u << 20);
Status WriteFile(const std::string& path, const std::string& data);  // atomic (tmp + rename)
// "path: strerror(errno)"
Status PosixError(const std::string& context, int err);
// Hex SHA-256 of data.
std::string Sha256Hex(const std::string& data);

}  // namespace ks
