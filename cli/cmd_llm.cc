// kernelsearch llm check: one tiny request to the configured model, and a clear
// sentence about what is wrong when it fails.
#include <cstdio>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/llm_flags.h"

namespace ks::cli {
namespace {

// What to try next, by kind of failure; the message itself already says what happened.
std::string Hint(const Status& s) {
  switch (s.code()) {
    case Code::kUnavailable: return " (is the server running, and is the base URL right?)";
    case Code::kDeadlineExceeded: return " (the server did not answer in time; raise --timeout or check the URL)";
    default: return "";
  }
}

int RunCheck(const LlmFlags& flags) {
  auto summary = CheckModel(flags);
  if (!summary.ok()) return ReportError(summary.status());
  std::printf("ok: %s\n", summary->c_str());
  return kExitOk;
}

}  // namespace

void AddLlmOptions(CLI::App* sub, LlmFlags* f, bool require_model) {
  auto* model = sub->add_option("--model", f->config.spec, BackendSpecForms());
  if (require_model) model->required();
  sub->add_option("--role-model", f->role_models, "ROLE=SPEC: another model for one role (ideas, implement, repair)");
  sub->add_option("--key-env", f->config.api_key_env,
                  "environment variable holding the API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY)");
  sub->add_option("--temperature", f->temperature, "sampling temperature (default: per prompt)");
  sub->add_option("--max-tokens", f->max_tokens, "completion token limit (default: per prompt)");
  sub->add_option("--reasoning-effort", f->config.reasoning_effort, "openai reasoning models: low, medium, high");
  sub->add_option("--timeout", f->config.timeout_s, "seconds per request attempt")->capture_default_str();
  sub->add_option("--connect-timeout", f->config.connect_timeout_s, "seconds to connect")->capture_default_str();
  sub->add_option("--retries", f->config.max_retries, "retries on 429, 5xx and network errors")->capture_default_str();
  sub->add_option("--concurrency", f->config.concurrency, "requests in flight at once")->capture_default_str();
  sub->add_option("--price-in", f->config.price_in_per_mtok, "USD per 1M prompt tokens");
  sub->add_option("--price-out", f->config.price_out_per_mtok, "USD per 1M completion tokens");
  sub->add_option("--record", f->config.record_path, "append every call to this transcript (for replay:FILE)");
  sub->add_flag("--replay-loose{false}", f->config.replay_strict,
                "replay: serve an unknown prompt the next recording of its role");
}

StatusOr<std::unique_ptr<LlmClient>> MakeLlmClientFromFlags(const LlmFlags& flags) {
  LlmConfig c = flags.config;
  if (flags.temperature >= 0) c.temperature = flags.temperature;
  if (flags.max_tokens > 0) c.max_tokens = flags.max_tokens;
  if (flags.role_models.empty()) return MakeLlmClient(c);
  std::map<std::string, std::string> roles;
  for (const auto& r : flags.role_models) {
    KS_ASSIGN_OR_RETURN(auto role_spec, ParseRoleSpec(r));
    roles[role_spec.first] = role_spec.second;
  }
  return MakeRoutedLlmClient(c, roles);
}

StatusOr<std::string> CheckModel(const LlmFlags& flags) {
  StatusOr<std::unique_ptr<LlmClient>> client = MakeLlmClientFromFlags(flags);
  if (!client.ok()) return client.status().WithContext("llm check " + flags.config.spec);
  LlmRequest req;
  req.role = "check";
  req.system = "You are a connectivity check. Answer briefly.";
  req.prompt = "Reply with the single word: ok";
  req.temperature = 0;
  // Reasoning models spend tokens before they answer; 16 would cut them off.
  req.max_tokens = flags.config.reasoning_effort.empty() ? 16 : 1024;
  LlmCallRecord rec;
  StatusOr<std::string> reply = (*client)->Complete(req, &rec);
  if (!reply.ok()) {
    Status s = reply.status();
    return Status(s.code(), "llm check failed for " + (*client)->Describe() + ": " + s.message() + Hint(s));
  }
  std::string text = *reply;
  for (char& c : text)
    if (c == '\n' || c == '\r') c = ' ';
  if (text.size() > 80) text = text.substr(0, 80) + "...";
  return fmt::format("{} answered in {:.2f} s ({} tokens in, {} out, ${:.6f}, finish_reason {}): {}",
                     (*client)->Describe(), rec.latency_s, rec.tokens_in, rec.tokens_out, rec.cost_usd,
                     rec.finish_reason.empty() ? "?" : rec.finish_reason, text);
}

void RegisterLlmCommands(CLI::App& app) {
  CLI::App* llm = app.add_subcommand("llm", "language-model backends");
  llm->require_subcommand(1);
  CLI::App* check = llm->add_subcommand("check", "send one small request and say what is wrong, if anything");
  auto flags = std::make_shared<LlmFlags>();
  flags->config.timeout_s = 60;
  flags->config.max_retries = 1;
  AddLlmOptions(check, flags.get(), /*require_model=*/true);
  SetAction(check, [flags] { return RunCheck(*flags); });
}

}  // namespace ks::cli
