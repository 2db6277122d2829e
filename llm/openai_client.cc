// OpenAI-compatible chat completions: POST {base}/chat/completions. The same
// wire format is served by vLLM, llama.cpp's server and Ollama (base .../v1).
#include "llm/http_backend.h"

namespace ks {
namespace {

constexpr char kDefaultBase[] = "https://api.openai.com/v1";

class OpenAiClient final : public HttpBackend {
 public:
  using HttpBackend::HttpBackend;

 protected:
  Call BuildCall(const LlmRequest& r) const override {
    nlohmann::json messages = nlohmann::json::array();
    if (!r.system.empty()) messages.push_back({{"role", "system"}, {"content", r.system}});
    messages.push_back({{"role", "user"}, {"content", r.prompt}});
    nlohmann::json body = {{"model", model()}, {"messages", messages}};
    return MakeCall(std::move(body), r.temperature, r.max_tokens);
  }

  // Tools as functions; an assistant turn's calls as `tool_calls` with their
  // arguments as a JSON string; each result as a `tool` message.
  Call BuildConverseCall(const ConversationRequest& r) const override {
    nlohmann::json messages = nlohmann::json::array();
    if (!r.system.empty()) messages.push_back({{"role", "system"}, {"content", r.system}});
    for (const auto& m : r.messages) messages.push_back(ToWire(m));
    nlohmann::json tools = nlohmann::json::array();
    for (const auto& t : r.tools)
      tools.push_back({{"type", "function"},
                       {"function", {{"name", t.name}, {"description", t.description}, {"parameters", t.parameters}}}});
    nlohmann::json body = {{"model", model()}, {"messages", messages}};
    if (!tools.empty()) body["tools"] = std::move(tools);
    return MakeCall(std::move(body), r.temperature, r.max_tokens);
  }

  Call MakeCall(nlohmann::json body, double temperature, int max_tokens) const {
    if (!config().reasoning_effort.empty()) {
      // Reasoning models take max_completion_tokens and reject temperature.
      body["reasoning_effort"] = config().reasoning_effort;
      body["max_completion_tokens"] = max_tokens;
    } else {
      body["temperature"] = temperature;
      body["max_tokens"] = max_tokens;
    }
    Call call{base_url() + "/chat/completions", {"Content-Type: application/json"}, body.dump()};
    if (!key().empty()) call.headers.push_back("Authorization: Bearer " + key());
    return call;
  }

  static nlohmann::json ToWire(const Message& m) {
    if (m.role == "tool") return {{"role", "tool"}, {"tool_call_id", m.tool_call_id}, {"content", m.text}};
    if (m.role != "assistant" || m.tool_calls.empty()) return {{"role", m.role}, {"content", m.text}};
    nlohmann::json calls = nlohmann::json::array();
    for (const auto& c : m.tool_calls) {
      // Arguments that did not parse go back as the model wrote them.
      std::string args = c.arguments.is_string() && !c.arguments_error.empty() ? c.arguments.get<std::string>()
                                                                                : c.arguments.dump();
      calls.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", args}}}});
    }
    nlohmann::json out = {{"role", "assistant"}, {"tool_calls", std::move(calls)}};
    out["content"] = m.text.empty() ? nlohmann::json(nullptr) : nlohmann::json(m.text);
    return out;
  }

  static void ReadToolCalls(const nlohmann::json& msg, Reply* reply) {
    if (!msg.contains("tool_calls") || !msg["tool_calls"].is_array()) return;
    for (const auto& tc : msg["tool_calls"]) {
      if (!tc.is_object()) continue;
      ToolCall call;
      call.id = tc.value("id", "");
      if (call.id.empty()) call.id = "call_" + std::to_string(reply->tool_calls.size());
      const nlohmann::json fn = tc.contains("function") && tc["function"].is_object() ? tc["function"] : nlohmann::json::object();
      call.name = fn.contains("name") && fn["name"].is_string() ? fn["name"].get<std::string>() : "";
      if (fn.contains("arguments") && fn["arguments"].is_string())
        SetArgumentsFromText(&call, fn["arguments"].get<std::string>());
      else if (fn.contains("arguments") && fn["arguments"].is_object())
        call.arguments = fn["arguments"];  // some local servers send an object
      else
        call.arguments = nlohmann::json::object();
      reply->tool_calls.push_back(std::move(call));
    }
  }

  StatusOr<Reply> ParseReply(const nlohmann::json& j) const override {
    if (!j.is_object() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].empty())
      return Unavailable("no \"choices\" in the reply");
    const auto& choice = j["choices"][0];
    if (!choice.is_object() || !choice.contains("message") || !choice["message"].is_object())
      return Unavailable("no \"choices[0].message\" in the reply");
    const auto& msg = choice["message"];
    Reply reply;
    if (msg.contains("content") && msg["content"].is_string()) {
      reply.text = msg["content"].get<std::string>();
    } else if (msg.contains("content") && msg["content"].is_array()) {
      for (const auto& part : msg["content"])  // content parts, as some servers send
        if (part.is_object() && part.value("type", "") == "text" && part.contains("text") && part["text"].is_string())
          reply.text += part["text"].get<std::string>();
    } else if (msg.contains("refusal") && msg["refusal"].is_string()) {
      return PermissionDenied("the model refused: " + msg["refusal"].get<std::string>());
    }
    ReadToolCalls(msg, &reply);
    if (choice.contains("finish_reason") && choice["finish_reason"].is_string())
      reply.finish_reason = choice["finish_reason"].get<std::string>();
    if (j.contains("usage") && j["usage"].is_object()) {
      const auto& u = j["usage"];
      if (u.contains("prompt_tokens") && u["prompt_tokens"].is_number_integer())
        reply.tokens_in = u["prompt_tokens"].get<int64_t>();
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
        reply.tokens_out = u["completion_tokens"].get<int64_t>();
    }
    return reply;
  }
};

}  // namespace

StatusOr<std::unique_ptr<LlmClient>> MakeOpenAiClient(const std::string& rest, const LlmConfig& config) {
  size_t at = rest.find('@');
  std::string model = rest.substr(0, at);
  std::string base = at == std::string::npos ? kDefaultBase : rest.substr(at + 1);
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (model.empty()) return InvalidArgument("openai spec '" + rest + "' names no model (openai:MODEL[@BASE_URL])");
  if (base.empty()) return InvalidArgument("openai spec '" + rest + "' has an empty base URL");
  std::string env;
  // Local servers usually run without a key; the hosted API never does.
  KS_ASSIGN_OR_RETURN(std::string key, LookUpKey(config, "OPENAI_API_KEY", base == kDefaultBase, &env));
  return std::unique_ptr<LlmClient>(new OpenAiClient("openai", model, base, env, key, config));
}

}  // namespace ks
