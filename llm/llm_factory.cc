#include "llm/llm_factory.h"

#include <iterator>

#include "llm/command_client.h"
#include "llm/http_backend.h"
#include "llm/role_router.h"
#include "llm/transcript.h"

namespace ks {
namespace {

using BackendMaker = StatusOr<std::unique_ptr<LlmClient>> (*)(const std::string& rest, const LlmConfig& config);

// Every model backend, in the one place they are listed: its spec prefix, the
// form a user types (help texts and error messages) and its maker.
struct Backend {
  const char* name;
  const char* spec_form;
  BackendMaker make;
};
constexpr Backend kBackends[] = {
    {"openai", "openai:MODEL[@BASE_URL]", MakeOpenAiClient},
    {"anthropic", "anthropic:MODEL[@BASE_URL]", MakeAnthropicClient},
    {"replay", "replay:FILE", MakeReplayClient},
    {"command", "command:CMD", MakeCommandClient},
};

// "a, b, c or d" over each backend's `field`.
std::string ListBackends(const char* Backend::*field) {
  std::string out;
  constexpr size_t n = std::size(kBackends);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += kBackends[i].*field;
  }
  return out;
}

// The backend alone, without a recorder.
StatusOr<std::unique_ptr<LlmClient>> MakeBackend(const LlmConfig& config) {
  const std::string& spec = config.spec;
  size_t colon = spec.find(':');
  if (colon == std::string::npos)
    return InvalidArgument("model spec '" + spec + "' has no backend; use " + BackendSpecForms());
  std::string kind = spec.substr(0, colon);
  std::string rest = spec.substr(colon + 1);
  if (config.concurrency < 1) return InvalidArgument("concurrency must be at least 1");
  if (config.max_retries < 0) return InvalidArgument("max_retries must not be negative");
  if (config.timeout_s <= 0 || config.connect_timeout_s <= 0) return InvalidArgument("time limits must be positive");
  for (const Backend& b : kBackends)
    if (kind == b.name) return b.make(rest, config);
  return InvalidArgument("unknown backend '" + kind + "' in model spec '" + spec + "'; use " +
                         ListBackends(&Backend::name));
}

StatusOr<std::unique_ptr<LlmClient>> MaybeRecord(std::unique_ptr<LlmClient> client, const std::string& path) {
  if (path.empty()) return client;
  KS_ASSIGN_OR_RETURN(std::shared_ptr<TranscriptWriter> writer, TranscriptWriter::Open(path));
  return std::unique_ptr<LlmClient>(new RecordingClient(std::move(client), std::move(writer)));
}

}  // namespace

std::string BackendSpecForms() { return ListBackends(&Backend::spec_form); }

StatusOr<std::unique_ptr<LlmClient>> MakeLlmClient(const LlmConfig& config) {
  KS_ASSIGN_OR_RETURN(std::unique_ptr<LlmClient> client, MakeBackend(config));
  return MaybeRecord(std::move(client), config.record_path);
}

StatusOr<std::unique_ptr<LlmClient>> MakeRoutedLlmClient(const LlmConfig& base,
                                                         const std::map<std::string, std::string>& role_specs) {
  KS_ASSIGN_OR_RETURN(std::unique_ptr<LlmClient> fallback, MakeBackend(base));
  std::map<std::string, std::unique_ptr<LlmClient>> by_role;
  for (const auto& [role, spec] : role_specs) {
    LlmConfig c = base;
    c.spec = spec;
    StatusOr<std::unique_ptr<LlmClient>> client = MakeBackend(c);
    if (!client.ok()) return client.status().WithContext("model for role '" + role + "'");
    by_role[role] = std::move(client).value();
  }
  std::unique_ptr<LlmClient> router(new RoleRouter(std::move(fallback), std::move(by_role)));
  return MaybeRecord(std::move(router), base.record_path);
}

StatusOr<std::pair<std::string, std::string>> ParseRoleSpec(const std::string& text) {
  size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == text.size())
    return InvalidArgument("'" + text + "' is not ROLE=SPEC (e.g. ideas=anthropic:claude-sonnet-4-5)");
  return std::make_pair(text.substr(0, eq), text.substr(eq + 1));
}

}  // namespace ks
