// Building language-model clients from a configuration: the backend spec, the
// knobs every backend shares, per-role routing and transcript recording.
//
// Specs:
//   openai:MODEL                 https://api.openai.com/v1, key from $OPENAI_API_KEY
//   openai:MODEL@BASE_URL        any OpenAI-compatible server (vLLM, llama.cpp,
//                                Ollama: http://localhost:11434/v1); the key is
//                                optional unless api_key_env is set
//   anthropic:MODEL[@BASE_URL]   Messages API, key from $ANTHROPIC_API_KEY
//   replay:FILE                  serves a transcript written by record_path
//   command:CMD                  /bin/sh -c CMD, prompt on stdin, completion on stdout
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "llm/llm_client.h"

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

// Builds the client the spec names, wrapped in a recorder when record_path is
// set. InvalidArgument for a malformed spec; FailedPrecondition naming the
// environment variable when a required key is missing; NotFound for a replay
// file that does not exist.
StatusOr<std::unique_ptr<LlmClient>> MakeLlmClient(const LlmConfig& config);

// One client per role: `role_specs` maps a role ("ideas", "implement",
// "repair") to a spec; each such role gets `base` with its spec replaced, and
// every other role goes to base.spec. One recorder (base.record_path) wraps
// the whole router, so all roles land in one transcript.
StatusOr<std::unique_ptr<LlmClient>> MakeRoutedLlmClient(
    const LlmConfig& base, const std::map<std::string, std::string>& role_specs);

// "ROLE=SPEC" → (role, spec), for command-line flags.
StatusOr<std::pair<std::string, std::string>> ParseRoleSpec(const std::string& text);

}  // namespace ks
