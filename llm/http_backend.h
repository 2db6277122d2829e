// The machinery shared by the HTTP backends (openai, anthropic): key lookup,
// the concurrency limit, retries with back-off, error classification, cost and
// the call record. A subclass only says how to build a request and how to read
// a successful reply. Thread-safe; immutable after construction apart from the
// limiter.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llm/concurrency_limiter.h"
#include "llm/http_client.h"
#include "llm/llm_client.h"
#include "llm/llm_config.h"

namespace ks {

class HttpBackend : public LlmClient {
 public:
  HttpBackend(std::string backend, std::string model, std::string base_url, std::string key_env,
              std::string key, LlmConfig config);
  HttpBackend(const HttpBackend&) = delete;
  HttpBackend& operator=(const HttpBackend&) = delete;

  StatusOr<std::string> Complete(const LlmRequest& request, LlmCallRecord* record) final;
  // Conversations with tools, in the subclass's dialect (BuildConverseCall);
  // the same retries, limits and record as Complete.
  StatusOr<AssistantReply> Converse(const ConversationRequest& request, LlmCallRecord* record) final;
  std::string Describe() const override;

 protected:
  struct Call {
    std::string url;
    std::vector<std::string> headers;  // may hold the key
    std::string body;
  };
  struct Reply {
    std::string text;
    std::string finish_reason;  // normalized: "stop", "length", or as given
    int64_t tokens_in = 0;
    int64_t tokens_out = 0;
    std::vector<ToolCall> tool_calls;  // a conversation's tool calls, in order
  };
  // `request` already has the config's overrides applied.
  virtual Call BuildCall(const LlmRequest& request) const = 0;
  // The same for a conversation with tools (`request` with overrides applied).
  virtual Call BuildConverseCall(const ConversationRequest& request) const = 0;
  // Reads a 2xx reply; an error names what is missing.
  virtual StatusOr<Reply> ParseReply(const nlohmann::json& body) const = 0;

  const std::string& model() const { return model_; }
  const std::string& base_url() const { return base_url_; }
  const std::string& key() const { return key_; }
  const LlmConfig& config() const { return config_; }

 private:
  StatusOr<std::string> CompleteInner(const LlmRequest& request, LlmCallRecord* record);
  StatusOr<Reply> ConverseInner(const ConversationRequest& request, const CancelFlags& flags, LlmCallRecord* rec);
  // Sends `call` with retries and reads the reply; fills the record's usage,
  // finish reason and attempts.
  StatusOr<Reply> Exchange(const Call& call, const CancelFlags& flags, LlmCallRecord* rec);
  void StartRecord(const std::string& role, const std::string& system, const std::string& prompt,
                   LlmCallRecord* rec) const;
  // Turns a non-2xx answer into a Status that says what to do about it.
  Status ClassifyHttpError(const HttpResponse& resp, const std::string& url) const;
  // Removes the key from text that came from the server (some echo it back).
  std::string Redact(std::string text) const;

  const std::string backend_;
  const std::string model_;
  const std::string base_url_;
  const std::string key_env_;
  const std::string key_;  // never logged, never in a record or message
  const LlmConfig config_;
  ConcurrencyLimiter limiter_;
};

// Looks up the key: `config.api_key_env` when set (then required), else
// `default_env` (required when `required_by_default`). "" when absent and optional.
// `env_used` receives the variable's name for messages.
StatusOr<std::string> LookUpKey(const LlmConfig& config, const std::string& default_env,
                                bool required_by_default, std::string* env_used);

// The HTTP backends (openai_client.cc, anthropic_client.cc); `rest` is the
// spec after "name:". The others: MakeReplayClient (transcript.h) and
// MakeCommandClient (command_client.h).
StatusOr<std::unique_ptr<LlmClient>> MakeOpenAiClient(const std::string& rest, const LlmConfig& config);
StatusOr<std::unique_ptr<LlmClient>> MakeAnthropicClient(const std::string& rest, const LlmConfig& config);

}  // namespace ks
