// Multi-turn conversations with tools (the agent's implement step,
// search/agent.h): the messages, the tools offered, the assistant's reply with
// its tool calls, and their one JSON encoding. That encoding is the `command:`
// backend's protocol, the form a conversation takes in a call record (prompt =
// the request, response = the reply) and so in transcripts that `replay:`
// serves. Each HTTP backend translates it to its dialect (OpenAI `tools` /
// `tool_calls` / `tool` messages; Anthropic `tool_use` / `tool_result` blocks).
//
// The request, as JSON (the command protocol's stdin):
//   {"protocol": "ks-conversation-1", "role": "implement", "system": "...",
//    "tools": [{"name", "description", "parameters": JSON schema}],
//    "messages": [
//      {"role": "user", "text": "..."},
//      {"role": "assistant", "text": "...",
//       "tool_calls": [{"id": "c1", "name": "compile", "arguments": {...}}]},
//      {"role": "tool", "tool_call_id": "c1", "name": "compile",
//       "text": "...", "is_error": false}]}
// The reply (the command's stdout): one assistant message,
//   {"text": "...", "tool_calls": [{"id", "name", "arguments"}]}
// optionally with "tokens_in", "tokens_out" and "finish_reason".
// Plain data; no threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ks {

inline constexpr char kConversationProtocol[] = "ks-conversation-1";

struct ToolSpec {
  std::string name;
  std::string description;
  nlohmann::json parameters;  // JSON schema of the arguments object
};

struct ToolCall {
  std::string id;             // the backend's id; made up ("call_N") where it gives none
  std::string name;
  nlohmann::json arguments;   // an object when the model's arguments parsed
  // Why the arguments could not be read as a JSON object (the model wrote
  // malformed JSON): answered to the model as a tool error, never fatal.
  std::string arguments_error;
};

struct Message {
  std::string role;  // "user", "assistant" or "tool"
  std::string text;
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only: the call it answers
  std::string tool_name;             // tool only
  bool is_error = false;             // tool only: the call failed
};

struct ConversationRequest {
  std::string role = "implement";  // for records and per-role models
  std::string system;
  std::vector<ToolSpec> tools;
  std::vector<Message> messages;
  double temperature = 0.7;
  int max_tokens = 8192;
  const std::atomic<bool>* cancel = nullptr;  // as LlmRequest::cancel
};

// The assistant's turn: a message (role "assistant") and what it cost.
struct AssistantReply {
  Message message;
  std::string finish_reason;  // normalized as LlmCallRecord::finish_reason; "tool_calls" when it called tools
  int64_t tokens_in = 0;
  int64_t tokens_out = 0;
};

nlohmann::json ToolCallToJson(const ToolCall& c);
nlohmann::json MessageToJson(const Message& m);
StatusOr<Message> MessageFromJson(const nlohmann::json& j);

// The request as the protocol above (no temperature or cancel: not part of
// what the model is asked, so not part of a replay key either).
nlohmann::json ConversationToJson(const ConversationRequest& r);
StatusOr<ConversationRequest> ConversationFromJson(const nlohmann::json& j);

// A reply in the protocol: the message fields plus usage and finish reason.
nlohmann::json ReplyToJson(const AssistantReply& r);
// InvalidArgument naming what is wrong (not an object, a tool call without a name).
StatusOr<AssistantReply> ReplyFromJson(const nlohmann::json& j);

// Reads a tool call's arguments as the model sent them (a JSON string in the
// OpenAI dialect): an object, or arguments_error saying why not.
void SetArgumentsFromText(ToolCall* call, const std::string& text);

}  // namespace ks
