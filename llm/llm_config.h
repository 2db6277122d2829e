// The knobs every model backend shares: which backend and model (the spec),
// keys, sampling overrides, time limits, retries, concurrency, prices and
// transcript recording. Its own header so that a backend includes what it is
// configured with, not the factory that builds every backend.
#pragma once

#include <atomic>
#include <optional>
#include <string>

namespace ks {

struct LlmConfig {
  std::string spec;
  // Environment variable holding the key. Empty: the backend's default
  // (OPENAI_API_KEY, ANTHROPIC_API_KEY), required for hosted APIs and optional
  // for a custom base URL. Set: required. The key itself is never stored.
  std::string api_key_env;
  std::optional<double> temperature;  // overrides LlmRequest::temperature
  std::optional<int> max_tokens;      // overrides LlmRequest::max_tokens
  // openai reasoning models ("low", "medium", "high"). When set, the request
  // carries reasoning_effort and max_completion_tokens and no temperature,
  // which such models reject.
  std::string reasoning_effort;
  double connect_timeout_s = 15;
  double timeout_s = 900;    // one attempt, start to last byte (command: the run)
  int max_retries = 4;       // on 429, 5xx and network errors
  double retry_base_s = 1;   // back-off: base * 2^n with jitter, capped at retry_max_s
  double retry_max_s = 60;   // also caps Retry-After
  int concurrency = 8;       // calls in flight at once, per client
  double price_in_per_mtok = 0;   // USD per 1M prompt tokens
  double price_out_per_mtok = 0;  // USD per 1M completion tokens
  std::string anthropic_version = "2023-06-01";
  // replay: an unknown prompt is an error (strict). Not strict: it gets the
  // next unserved response recorded for the same role, so a search whose
  // prompts carry fresh measurements can still be replayed.
  bool replay_strict = true;
  // When set, every call is appended to this JSON-lines transcript.
  std::string record_path;
  // Borrowed, may be null; must outlive the client. Cancels every call of it.
  const std::atomic<bool>* cancel = nullptr;
};

}  // namespace ks
