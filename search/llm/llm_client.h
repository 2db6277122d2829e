// The interface every language-model backend implements, and the record each call
// leaves. Backends: openai, anthropic, replay:FILE, command:CMD (llm_factory.h).
#pragma once

#include <optional>
#include <string>

#include "common/status.h"

namespace ks {

struct LlmRequest {
  std::string role;    // "ideas", "implement", "repair", "check": for records and per-role models
  std::string system;  // system prompt, may be empty
  std::string prompt;  // the user message
  double temperature = 0.7;
  int max_tokens = 8192;
};

// One call, successful or not. Keys never appear here.
struct LlmCallRecord {
  std::string role;
  std::string backend;  // "openai", "anthropic", "replay", "command"
  std::string model;
  std::string system;
  std::string prompt;
  std::string response;       // the completion text ("" on failure)
  std::string finish_reason;  // "stop", "length", ...
  int64_t tokens_in = 0;
  int64_t tokens_out = 0;
  double latency_s = 0;
  double cost_usd = 0;
  int attempts = 0;
  std::string error;  // "" on success
};

class LlmClient {
 public:
  virtual ~LlmClient() = default;
  // Thread-safe: the search calls it from several threads at once. Fills *record
  // in every case (also on failure) when record is not null.
  virtual StatusOr<std::string> Complete(const LlmRequest& request, LlmCallRecord* record) = 0;
  virtual std::string Describe() const = 0;  // "openai:gpt-4o @ https://...", no keys
};

}  // namespace ks
