// Framing between the trusted evaluator and ks-worker: a 4-byte little-endian
// length, then that many bytes of JSON. Binary (cubin, IPC handles) travels
// base64-encoded inside the JSON. The worker answers each request with one
// message. Messages larger than kMaxMessageBytes are refused.
#pragma once

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ks {

constexpr size_t kMaxMessageBytes = 64u << 20;

Status SendMessage(int fd, const nlohmann::json& msg);
// timeout_s < 0 waits forever. DeadlineExceeded on timeout, Unavailable on EOF.
StatusOr<nlohmann::json> ReceiveMessage(int fd, double timeout_s);

// Poison patterns written into outputs before every run; an element still
// holding its pattern afterwards was never written. Each is a NaN of its type
// (fp16 0x7DA5, bf16 0x7FA5, fp32 0x7FA5A5A5, fp64 0x7FF4A5A5 twice), so an
// unwritten element can never pass as a plausible value; integer types get 0xA5 bytes.
struct PoisonPattern {
  int width = 4;          // 1, 2 or 4: the memset width
  uint32_t pattern = 0;
};

}  // namespace ks
