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
    for (const auto& block : j["content"])  // thinking and tool blocks are skipped
      if (block.is_object() && block.value("type", "") == "text" && block.contains("text") && block["text"].is_string())
        reply.text += block["text"].get<std::string>();
    std::string stop = j.contains("stop_reason") && j["stop_reason"].is_string() ? j["stop_reason"].get<std::string>() : "";
    // Normalized so the search sees one word for a cut-off reply (llm_client.h).
    if (stop == "max_tokens") reply.finish_reason = "length";
    else if (stop == "end_turn" || stop == "stop_sequence") reply.finish_reason = "stop";
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
