// One HTTP POST through libcurl, with connect and total time limits and
// cancellation. No retries here (http_backend.h retries). Thread-safe: each
// call uses its own CURL handle; libcurl's global state is set up once.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace ks {

struct HttpRequest {
  std::string url;
  // "Name: value" lines. They may carry secrets, so they never appear in any
  // message this module produces.
  std::vector<std::string> headers;
  std::string body;
  double connect_timeout_s = 15;
  double timeout_s = 900;
  // Borrowed flags (null entries ignored); any of them true aborts the transfer.
  std::vector<const std::atomic<bool>*> cancel;
};

struct HttpResponse {
  long status = 0;
  std::string body;
  std::optional<double> retry_after_s;  // Retry-After in seconds, when given so
};

// A response with any HTTP status is a value. A transfer that fails is a Status:
// Cancelled, DeadlineExceeded (time limit) or Unavailable (connection refused,
// DNS, reset), the message naming the URL and libcurl's explanation.
StatusOr<HttpResponse> HttpPost(const HttpRequest& request);

// The first `max_chars` of `body` on one line, for error messages.
std::string BodyExcerpt(const std::string& body, size_t max_chars = 300);

}  // namespace ks
