#include "evaluator/worker_protocol.h"

#include <cstdint>

#include "common/subprocess.h"

namespace ks {

Status SendMessage(int fd, const nlohmann::json& msg) {
  std::string body = msg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (body.size() > kMaxMessageBytes) return ResourceExhausted("worker message of " + std::to_string(body.size()) + " bytes");
  uint32_t n = static_cast<uint32_t>(body.size());
  unsigned char hdr[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                          static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  KS_RETURN_IF_ERROR(WriteAll(fd, hdr, 4));
  return WriteAll(fd, body.data(), body.size());
}

StatusOr<nlohmann::json> ReceiveMessage(int fd, double timeout_s) {
  unsigned char hdr[4];
  KS_RETURN_IF_ERROR(ReadExact(fd, hdr, 4, timeout_s));
  uint32_t n = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (uint32_t(hdr[3]) << 24);
  if (n > kMaxMessageBytes) return Internal("worker message too large: " + std::to_string(n));
  std::string body(n, '\0');
  KS_RETURN_IF_ERROR(ReadExact(fd, body.data(), n, timeout_s));
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded()) return Internal("unreadable worker message");
  return j;
}

}  // namespace ks
