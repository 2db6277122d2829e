// The interface every language-model backend implements, and the record each call
// leaves. The backends are listed once, in llm_factory.cc (kBackends).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"
#include "llm/conversation.h"

namespace ks {

struct LlmRequest {
  std::string role;    // "ideas", "implement", "repair", "check": for records and per-role models
  std::string system;  // system prompt, may be empty
  std::string prompt;  // the user message
  double temperature = 0.7;
  int max_tokens = 8192;
  // Borrowed, may be null; must outlive the call. When it becomes true the call
  // stops (between retries, while waiting for a concurrency slot, and during a
  // transfer) and returns Cancelled.
  const std::atomic<bool>* cancel = nullptr;
};

// One call, successful or not. Keys never appear here.
struct LlmCallRecord {
  std::string role;
  std::string backend;  // the spec prefix of the backend that answered (llm_factory.cc)
  std::string model;
  std::string system;
  std::string prompt;
  std::string response;       // the completion text ("" on failure)
  // Normalized across APIs: "stop" for a natural end, "length" when the reply
  // hit the token limit (openai finish_reason=length, anthropic
  // stop_reason=max_tokens): the text is returned but is probably cut short.
  // Other values are passed through as the API gave them.
  std::string finish_reason;
  int64_t tokens_in = 0;
  int64_t tokens_out = 0;
  double latency_s = 0;  // wall clock of the whole call, retries and waits included
  double cost_usd = 0;
  int attempts = 0;      // HTTP requests sent (or commands run); 0 when none was
  std::string error;  // "" on success

  bool truncated() const { return finish_reason == "length"; }
};

class LlmClient {
 public:
  virtual ~LlmClient() = default;
  // Thread-safe: the search calls it from several threads at once. Fills *record
  // in every case (also on failure) when record is not null.
  virtual StatusOr<std::string> Complete(const LlmRequest& request, LlmCallRecord* record) = 0;
  virtual std::string Describe() const = 0;  // "openai:gpt-4o @ https://...", no keys
  // One assistant turn of a conversation with tools (llm/conversation.h).
  // Thread-safe as Complete. The record's prompt is ConversationToJson of the
  // request and its response ReplyToJson of the reply, so that transcripts
  // and the store keep conversations as they keep completions. A backend that
  // cannot hold a conversation answers FailedPrecondition (the default).
  virtual StatusOr<AssistantReply> Converse(const ConversationRequest& request, LlmCallRecord* record) {
    (void)request;
    if (record) record->error = Describe() + " cannot hold a conversation with tools";
    return FailedPrecondition(Describe() + " cannot hold a conversation with tools");
  }
};

}  // namespace ks
