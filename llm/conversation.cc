#include "llm/conversation.h"

#include "common/json_depth.h"

namespace ks {
namespace {

using json = nlohmann::json;

std::string StringField(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

StatusOr<ToolCall> ToolCallFromJson(const json& j, size_t index) {
  if (!j.is_object()) return InvalidArgument("tool call " + std::to_string(index) + " is not an object");
  ToolCall c;
  c.id = StringField(j, "id");
  c.name = StringField(j, "name");
  if (c.name.empty()) return InvalidArgument("tool call " + std::to_string(index) + " has no \"name\"");
  if (c.id.empty()) c.id = "call_" + std::to_string(index);
  if (!j.contains("arguments")) {
    c.arguments = json::object();
  } else if (j["arguments"].is_string()) {
    SetArgumentsFromText(&c, j["arguments"].get<std::string>());
  } else {
    c.arguments = j["arguments"];
    if (!c.arguments.is_object()) c.arguments_error = "the arguments are not a JSON object";
  }
  c.arguments_error = c.arguments_error.empty() ? StringField(j, "arguments_error") : c.arguments_error;
  return c;
}

}  // namespace

void SetArgumentsFromText(ToolCall* call, const std::string& text) {
  if (text.find_first_not_of(" \t\r\n") == std::string::npos) {
    call->arguments = json::object();
    return;
  }
  // A model's arguments nested deeper than any real call are refused before
  // they are built: copying such a value would overflow the stack.
  json j = CheckJsonNesting(text, kMaxModelJsonDepth, "the arguments").ok()
               ? json::parse(text, nullptr, /*allow_exceptions=*/false)
               : json(json::value_t::discarded);
  if (j.is_discarded()) {
    call->arguments = text;  // kept as sent, so the record shows what the model wrote
    call->arguments_error = "the arguments are not valid JSON";
  } else if (!j.is_object()) {
    call->arguments = j;
    call->arguments_error = "the arguments are not a JSON object";
  } else {
    call->arguments = std::move(j);
  }
}

json ToolCallToJson(const ToolCall& c) {
  json j = {{"id", c.id}, {"name", c.name}, {"arguments", c.arguments.is_null() ? json::object() : c.arguments}};
  if (!c.arguments_error.empty()) j["arguments_error"] = c.arguments_error;
  return j;
}

json MessageToJson(const Message& m) {
  json j = {{"role", m.role}, {"text", m.text}};
  if (m.role == "assistant" && !m.tool_calls.empty()) {
    json calls = json::array();
    for (const auto& c : m.tool_calls) calls.push_back(ToolCallToJson(c));
    j["tool_calls"] = std::move(calls);
  }
  if (m.role == "tool") {
    j["tool_call_id"] = m.tool_call_id;
    j["name"] = m.tool_name;
    j["is_error"] = m.is_error;
  }
  return j;
}

StatusOr<Message> MessageFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("a message is not an object");
  Message m;
  m.role = StringField(j, "role");
  if (m.role != "user" && m.role != "assistant" && m.role != "tool")
    return InvalidArgument("a message's role is '" + m.role + "' (user, assistant or tool)");
  m.text = StringField(j, "text");
  if (j.contains("tool_calls")) {
    if (!j["tool_calls"].is_array()) return InvalidArgument("\"tool_calls\" is not a list");
    for (size_t i = 0; i < j["tool_calls"].size(); ++i) {
      KS_ASSIGN_OR_RETURN(ToolCall c, ToolCallFromJson(j["tool_calls"][i], i));
      m.tool_calls.push_back(std::move(c));
    }
  }
  m.tool_call_id = StringField(j, "tool_call_id");
  m.tool_name = StringField(j, "name");
  m.is_error = j.value("is_error", false);
  return m;
}

json ConversationToJson(const ConversationRequest& r) {
  json tools = json::array();
  for (const auto& t : r.tools)
    tools.push_back({{"name", t.name}, {"description", t.description}, {"parameters", t.parameters}});
  json messages = json::array();
  for (const auto& m : r.messages) messages.push_back(MessageToJson(m));
  return {{"protocol", kConversationProtocol}, {"role", r.role}, {"system", r.system},
          {"tools", std::move(tools)}, {"messages", std::move(messages)}};
}

StatusOr<ConversationRequest> ConversationFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("a conversation is not an object");
  ConversationRequest r;
  r.role = StringField(j, "role");
  r.system = StringField(j, "system");
  if (j.contains("tools") && j["tools"].is_array())
    for (const auto& t : j["tools"])
      if (t.is_object())
        r.tools.push_back({StringField(t, "name"), StringField(t, "description"), t.value("parameters", json::object())});
  if (!j.contains("messages") || !j["messages"].is_array()) return InvalidArgument("a conversation has no \"messages\"");
  for (const auto& m : j["messages"]) {
    KS_ASSIGN_OR_RETURN(Message msg, MessageFromJson(m));
    r.messages.push_back(std::move(msg));
  }
  return r;
}

json ReplyToJson(const AssistantReply& r) {
  json j = MessageToJson(r.message);
  j.erase("role");
  if (!r.finish_reason.empty()) j["finish_reason"] = r.finish_reason;
  j["tokens_in"] = r.tokens_in;
  j["tokens_out"] = r.tokens_out;
  return j;
}

StatusOr<AssistantReply> ReplyFromJson(const json& j) {
  if (!j.is_object()) return InvalidArgument("the reply is not a JSON object");
  json m = j;
  m["role"] = "assistant";
  AssistantReply r;
  KS_ASSIGN_OR_RETURN(r.message, MessageFromJson(m));
  r.finish_reason = StringField(j, "finish_reason");
  if (r.finish_reason.empty()) r.finish_reason = r.message.tool_calls.empty() ? "stop" : "tool_calls";
  if (j.contains("tokens_in") && j["tokens_in"].is_number_integer()) r.tokens_in = j["tokens_in"].get<int64_t>();
  if (j.contains("tokens_out") && j["tokens_out"].is_number_integer()) r.tokens_out = j["tokens_out"].get<int64_t>();
  return r;
}

}  // namespace ks
