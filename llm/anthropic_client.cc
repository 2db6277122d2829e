// Anthropic Messages API: POST {base}/v1/messages with x-api-key and
// anthropic-version headers.
#include "llm/http_backend.h"

namespace ks {
namespace {

constexpr char kDefaultBase[] = "https://api.anthropic.com";

class AnthropicClient final : public HttpBackend {
 public:
  using HttpBackend::HttpBackend;

 protected:
  Call BuildCall(const LlmRequest& r) const override {
    nlohmann::json body = {
        {"model", model()},
        {"max_tokens", r.max_tokens},
        {"temperature", r.temperature},
        {"messages", nlohmann::json::array({{{"role", "user"}, {"content", r.prompt}}})},
    };
    if (!r.system.empty()) body["system"] = r.system;
    return MakeCall(body);
  }

  // Tool results go back as `tool_result` blocks of a user turn; consecutive
  // user-side messages (results, then a note) merge into one turn, as the API
  // wants turns to alternate.
  Call BuildConverseCall(const ConversationRequest& r) const override {
    nlohmann::json messages = nlohmann::json::array();
    for (const auto& m : r.messages) {
      std::string role = m.role == "assistant" ? "assistant" : "user";
      nlohmann::json blocks = ToBlocks(m);
      if (!messages.empty() && messages.back()["role"] == role) {
        for (auto& b : blocks) messages.back()["content"].push_back(std::move(b));
      } else {
        messages.push_back({{"role", role}, {"content", std::move(blocks)}});
      }
    }
    nlohmann::json body = {
        {"model", model()}, {"max_tokens", r.max_tokens}, {"temperature", r.temperature}, {"messages", messages}};
    if (!r.system.empty()) body["system"] = r.system;
    nlohmann::json tools = nlohmann::json::array();
    for (const auto& t : r.tools)
      tools.push_back({{"name", t.name}, {"description", t.description}, {"input_schema", t.parameters}});
    if (!tools.empty()) body["tools"] = std::move(tools);
    return MakeCall(body);
  }

  static nlohmann::json ToBlocks(const Message& m) {
    nlohmann::json blocks = nlohmann::json::array();
    if (m.role == "tool") {
      blocks.push_back({{"type", "tool_result"}, {"tool_use_id", m.tool_call_id}, {"content", m.text},
                        {"is_error", m.is_error}});
      return blocks;
    }
    if (!m.text.empty()) blocks.push_back({{"type", "text"}, {"text", m.text}});
    for (const auto& c : m.tool_calls)
      blocks.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name},
                        {"input", c.arguments.is_object() ? c.arguments : nlohmann::json::object()}});
    return blocks;
  }

  Call MakeCall(const nlohmann::json& body) const {
    Call call{base_url() + "/v1/messages",
              {"Content-Type: application/json", "anthropic-version: " + config().anthropic_version},
              body.dump()};
    if (!key().empty()) call.headers.push_back("x-api-key: " + key());
    return call;
  }

  StatusOr<Reply> ParseReply(const nlohmann::json& j) const override {
    if (!j.is_object() || !j.contains("content") || !j["content"].is_array())
      return Unavailable("no \"content\" list in the reply");
    Reply reply;
    for (const auto& block : j["content"]) {  // thinking blocks are skipped
      if (!block.is_object()) continue;
      std::string type = block.value("type", "");
      if (type == "text" && block.contains("text") && block["text"].is_string())
        reply.text += block["text"].get<std::string>();
      if (type == "tool_use") {
        ToolCall call;
        call.id = block.contains("id") && block["id"].is_string() ? block["id"].get<std::string>() : "";
        if (call.id.empty()) call.id = "call_" + std::to_string(reply.tool_calls.size());
        call.name = block.contains("name") && block["name"].is_string() ? block["name"].get<std::string>() : "";
        call.arguments = block.contains("input") ? block["input"] : nlohmann::json::object();
        if (!call.arguments.is_object()) call.arguments_error = "the arguments are not a JSON object";
        reply.tool_calls.push_back(std::move(call));
      }
    }
    std::string stop = j.contains("stop_reason") && j["stop_reason"].is_string() ? j["stop_reason"].get<std::string>() : "";
    // Normalized so the search sees one word for a cut-off reply (llm_client.h).
    if (stop == "max_tokens") reply.finish_reason = "length";
    else if (stop == "end_turn" || stop == "stop_sequence") reply.finish_reason = "stop";
    else if (stop == "tool_use") reply.finish_reason = "tool_calls";
    else reply.finish_reason = stop;
    if (j.contains("usage") && j["usage"].is_object()) {
      const auto& u = j["usage"];
      if (u.contains("input_tokens") && u["input_tokens"].is_number_integer())
        reply.tokens_in = u["input_tokens"].get<int64_t>();
      if (u.contains("output_tokens") && u["output_tokens"].is_number_integer())
        reply.tokens_out = u["output_tokens"].get<int64_t>();
    }
    return reply;
  }
};

}  // namespace

StatusOr<std::unique_ptr<LlmClient>> MakeAnthropicClient(const std::string& rest, const LlmConfig& config) {
  size_t at = rest.find('@');
  std::string model = rest.substr(0, at);
  std::string base = at == std::string::npos ? kDefaultBase : rest.substr(at + 1);
  while (!base.empty() && base.back() == '/') base.pop_back();
  if (model.empty()) return InvalidArgument("anthropic spec '" + rest + "' names no model (anthropic:MODEL[@BASE_URL])");
  if (base.empty()) return InvalidArgument("anthropic spec '" + rest + "' has an empty base URL");
  std::string env;
  KS_ASSIGN_OR_RETURN(std::string key, LookUpKey(config, "ANTHROPIC_API_KEY", base == kDefaultBase, &env));
  return std::unique_ptr<LlmClient>(new AnthropicClient("anthropic", model, base, env, key, config));
}

}  // namespace ks
