#include "llm/command_client.h"

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "common/files.h"
#include "common/subprocess.h"
#include "common/unique_fd.h"
#include "llm/concurrency_limiter.h"
#include "llm/http_client.h"

namespace ks {
namespace {

int64_t EstimateTokens(const std::string& text) { return static_cast<int64_t>((text.size() + 3) / 4); }

class CommandClient final : public LlmClient {
 public:
  CommandClient(std::string command, LlmConfig config)
      : command_(std::move(command)), config_(std::move(config)), limiter_(config_.concurrency) {}

  StatusOr<std::string> Complete(const LlmRequest& request, LlmCallRecord* record) override {
    auto start = std::chrono::steady_clock::now();
    LlmCallRecord local;
    LlmCallRecord* rec = record ? record : &local;
    *rec = LlmCallRecord{};
    rec->role = request.role;
    rec->backend = "command";
    rec->model = command_;
    rec->system = request.system;
    rec->prompt = request.prompt;
    StatusOr<std::string> result = Run(request, rec);
    rec->latency_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!result.ok()) {
      rec->error = result.status().message();
      return result.status();
    }
    rec->response = *result;
    rec->finish_reason = "stop";
    // A command that does not say what it used is estimated from the text
    // (about 4 characters a token for English and code): a search's token
    // budget and its cost (--price-*) must not read 0 whatever it answered.
    if (rec->tokens_in == 0 && rec->tokens_out == 0) {
      rec->tokens_in = EstimateTokens(request.system) + EstimateTokens(request.prompt);
      rec->tokens_out = EstimateTokens(*result);
    }
    rec->cost_usd = (rec->tokens_in * config_.price_in_per_mtok + rec->tokens_out * config_.price_out_per_mtok) / 1e6;
    return result;
  }

  // The conversation protocol (llm/conversation.h): the request as JSON on
  // stdin, one assistant turn as JSON on stdout; $KS_LLM_PROTOCOL names the
  // protocol so that one script can serve both kinds of call.
  StatusOr<AssistantReply> Converse(const ConversationRequest& request, LlmCallRecord* record) override {
    auto start = std::chrono::steady_clock::now();
    LlmCallRecord local;
    LlmCallRecord* rec = record ? record : &local;
    *rec = LlmCallRecord{};
    rec->role = request.role;
    rec->backend = "command";
    rec->model = command_;
    rec->system = request.system;
    rec->prompt = ConversationToJson(request).dump();
    LlmRequest as_prompt{.role = request.role, .system = request.system, .prompt = rec->prompt,
                         .temperature = request.temperature, .max_tokens = request.max_tokens,
                         .cancel = request.cancel};
    StatusOr<std::string> out = Run(as_prompt, rec, kConversationProtocol);
    rec->latency_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!out.ok()) {
      rec->error = out.status().message();
      return out.status();
    }
    StatusOr<AssistantReply> reply =
        CheckJsonNesting(*out, kMaxModelJsonDepth, "the reply").ok()
            ? ReplyFromJson(nlohmann::json::parse(*out, nullptr, /*allow_exceptions=*/false))
            : StatusOr<AssistantReply>(InvalidArgument("the reply nests deeper than " +
                                                       std::to_string(kMaxModelJsonDepth) + " levels"));
    if (!reply.ok()) {
      Status bad = Unavailable("command '" + command_ + "' did not answer in " + kConversationProtocol + ": " +
                               reply.status().message() + "; stdout starts: " + BodyExcerpt(*out, 200));
      rec->error = bad.message();
      return bad;
    }
    // Usage: the reply's own figures, else the usage file's, else estimated.
    if (reply->tokens_in || reply->tokens_out) rec->tokens_in = reply->tokens_in, rec->tokens_out = reply->tokens_out;
    if (rec->tokens_in == 0 && rec->tokens_out == 0) {
      rec->tokens_in = EstimateTokens(request.system) + EstimateTokens(rec->prompt);
      rec->tokens_out = EstimateTokens(*out);
    }
    reply->tokens_in = rec->tokens_in;
    reply->tokens_out = rec->tokens_out;
    rec->finish_reason = reply->finish_reason;
    rec->response = ReplyToJson(*reply).dump();
    rec->cost_usd = (rec->tokens_in * config_.price_in_per_mtok + rec->tokens_out * config_.price_out_per_mtok) / 1e6;
    return reply;
  }

  std::string Describe() const override { return "command:" + command_; }

 private:
  StatusOr<std::string> Run(const LlmRequest& request, LlmCallRecord* rec, const std::string& protocol = "text") {
    CancelFlags flags = {request.cancel, config_.cancel};
    ConcurrencyLimiter::Slot slot(&limiter_, flags);
    if (!slot.acquired()) return Cancelled("cancelled while waiting for a free command slot");
    SubprocessOptions opts;
    opts.argv = {"/bin/sh", "-c", command_};
    opts.stdin_data = request.prompt;
    opts.timeout_s = config_.timeout_s;
    opts.env = {
        {"KS_LLM_ROLE", request.role},
        {"KS_LLM_SYSTEM", request.system},
        {"KS_LLM_MAX_TOKENS", std::to_string(config_.max_tokens.value_or(request.max_tokens))},
        {"KS_LLM_TEMPERATURE", std::to_string(config_.temperature.value_or(request.temperature))},
        {"KS_LLM_PROTOCOL", protocol},
    };
    // The command may report its usage: {"tokens_in": N, "tokens_out": M} in
    // the file $KS_LLM_USAGE_FILE names (a private temporary file).
    char usage_path[] = "/tmp/ks-llm-usage-XXXXXX";
    UniqueFd usage_fd(mkstemp(usage_path));
    if (!usage_fd.valid()) return Internal(std::string("mkstemp for the usage file: ") + std::strerror(errno));
    struct Unlink {
      const char* path;
      ~Unlink() { ::unlink(path); }
    } unlink_usage{usage_path};
    opts.env["KS_LLM_USAGE_FILE"] = usage_path;
    ++rec->attempts;
    KS_ASSIGN_OR_RETURN(SubprocessResult res, RunSubprocess(opts));
    if (auto usage = ReadFile(usage_path); usage.ok() && !usage->empty()) {
      auto j = nlohmann::json::parse(*usage, nullptr, /*allow_exceptions=*/false);
      if (j.is_object()) {
        rec->tokens_in = j.value("tokens_in", int64_t{0});
        rec->tokens_out = j.value("tokens_out", int64_t{0});
      }
    }
    std::string what = "command '" + command_ + "'";
    if (res.timed_out)
      return DeadlineExceeded(what + " " + res.Describe() + " (limit " + std::to_string(config_.timeout_s) + " s)");
    if (!res.Succeeded())
      return Unavailable(what + " failed: " + res.Describe() + "; stderr: " + BodyExcerpt(res.err));
    if (res.out.find_first_not_of(" \t\r\n") == std::string::npos)
      return Unavailable(what + " wrote nothing on stdout; stderr: " + BodyExcerpt(res.err));
    return std::move(res.out);
  }

  const std::string command_;
  const LlmConfig config_;
  ConcurrencyLimiter limiter_;
};

}  // namespace

StatusOr<std::unique_ptr<LlmClient>> MakeCommandClient(const std::string& command, const LlmConfig& config) {
  if (command.empty()) return InvalidArgument("command spec names no command (command:CMD)");
  return std::unique_ptr<LlmClient>(new CommandClient(command, config));
}

}  // namespace ks
