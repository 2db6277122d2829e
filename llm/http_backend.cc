#include "llm/http_backend.h"

#include "common/json_depth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>

#include <spdlog/spdlog.h>

namespace ks {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Back-off with "equal jitter": half fixed, half random, so that many threads
// hitting the same rate limit do not retry in lock-step.
double BackoffSeconds(const LlmConfig& c, int retry) {
  double cap = std::min(c.retry_max_s, c.retry_base_s * std::pow(2.0, retry));
  thread_local std::mt19937 rng(std::random_device{}());
  return cap / 2 + std::uniform_real_distribution<double>(0, cap / 2)(rng);
}

// The server's own explanation: {"error": {"message": ...}} (OpenAI, Anthropic),
// {"error": "..."} (llama.cpp, Ollama), {"detail": ...} or {"message": ...}
// (vLLM, proxies); otherwise the start of the body.
std::string ServerMessage(const std::string& body) {
  if (!CheckJsonNesting(body, kMaxModelJsonDepth, "the body").ok()) return BodyExcerpt(body, 200);
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    if (j.contains("error")) {
      const auto& e = j["error"];
      if (e.is_string()) return e.get<std::string>();
      if (e.is_object() && e.contains("message") && e["message"].is_string())
        return e["message"].get<std::string>();
    }
    for (const char* k : {"detail", "message"})
      if (j.contains(k)) return j[k].is_string() ? j[k].get<std::string>() : j[k].dump();
  }
  return BodyExcerpt(body);
}

bool Mentions(const std::string& text, const char* word) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return lower.find(word) != std::string::npos;
}

bool SaysUnknownModel(const std::string& msg) {
  return Mentions(msg, "model") &&
         (Mentions(msg, "not found") || Mentions(msg, "does not exist") || Mentions(msg, "not exist") ||
          Mentions(msg, "unknown") || Mentions(msg, "invalid model") || Mentions(msg, "no such"));
}

bool Retryable(long status) { return status == 408 || status == 429 || status >= 500; }

}  // namespace

StatusOr<std::string> LookUpKey(const LlmConfig& config, const std::string& default_env,
                                bool required_by_default, std::string* env_used) {
  bool explicit_env = !config.api_key_env.empty();
  *env_used = explicit_env ? config.api_key_env : default_env;
  const char* v = std::getenv(env_used->c_str());
  if (v && *v) return std::string(v);
  if (explicit_env || required_by_default)
    return FailedPrecondition("no API key: environment variable $" + *env_used + " is not set");
  return std::string();
}

HttpBackend::HttpBackend(std::string backend, std::string model, std::string base_url, std::string key_env,
                         std::string key, LlmConfig config)
    : backend_(std::move(backend)),
      model_(std::move(model)),
      base_url_(std::move(base_url)),
      key_env_(std::move(key_env)),
      key_(std::move(key)),
      config_(std::move(config)),
      limiter_(config_.concurrency) {}

std::string HttpBackend::Describe() const { return backend_ + ":" + model_ + " @ " + base_url_; }

std::string HttpBackend::Redact(std::string text) const {
  if (key_.empty()) return text;
  for (size_t p; (p = text.find(key_)) != std::string::npos;) text.replace(p, key_.size(), "[redacted]");
  return text;
}

void HttpBackend::StartRecord(const std::string& role, const std::string& system, const std::string& prompt,
                              LlmCallRecord* rec) const {
  *rec = LlmCallRecord{};
  rec->role = role;
  rec->backend = backend_;
  rec->model = model_;
  rec->system = system;
  rec->prompt = prompt;
}

StatusOr<std::string> HttpBackend::Complete(const LlmRequest& request, LlmCallRecord* record) {
  LlmCallRecord local;
  LlmCallRecord* rec = record ? record : &local;
  StartRecord(request.role, request.system, request.prompt, rec);
  double start = Now();
  StatusOr<std::string> result = CompleteInner(request, rec);
  rec->latency_s = Now() - start;
  rec->cost_usd = (rec->tokens_in * config_.price_in_per_mtok + rec->tokens_out * config_.price_out_per_mtok) / 1e6;
  if (!result.ok()) {
    Status s(result.status().code(), Redact(result.status().message()));
    rec->error = s.message();
    rec->response.clear();
    return s;
  }
  rec->response = *result;
  return result;
}

StatusOr<AssistantReply> HttpBackend::Converse(const ConversationRequest& request, LlmCallRecord* record) {
  LlmCallRecord local;
  LlmCallRecord* rec = record ? record : &local;
  StartRecord(request.role, request.system, ConversationToJson(request).dump(), rec);
  double start = Now();
  CancelFlags flags = {request.cancel, config_.cancel};
  StatusOr<Reply> reply = ConverseInner(request, flags, rec);
  rec->latency_s = Now() - start;
  rec->cost_usd = (rec->tokens_in * config_.price_in_per_mtok + rec->tokens_out * config_.price_out_per_mtok) / 1e6;
  if (!reply.ok()) {
    Status s(reply.status().code(), Redact(reply.status().message()));
    rec->error = s.message();
    return s;
  }
  AssistantReply out;
  out.message.role = "assistant";
  out.message.text = std::move(reply->text);
  out.message.tool_calls = std::move(reply->tool_calls);
  out.finish_reason = reply->finish_reason;
  out.tokens_in = reply->tokens_in;
  out.tokens_out = reply->tokens_out;
  rec->response = ReplyToJson(out).dump();
  return out;
}

StatusOr<HttpBackend::Reply> HttpBackend::ConverseInner(const ConversationRequest& request, const CancelFlags& flags,
                                                        LlmCallRecord* rec) {
  ConcurrencyLimiter::Slot slot(&limiter_, flags);
  if (!slot.acquired()) return Cancelled("cancelled while waiting for a free " + backend_ + " slot");
  ConversationRequest effective = request;
  if (config_.temperature) effective.temperature = *config_.temperature;
  if (config_.max_tokens) effective.max_tokens = *config_.max_tokens;
  return Exchange(BuildConverseCall(effective), flags, rec);
}

StatusOr<std::string> HttpBackend::CompleteInner(const LlmRequest& request, LlmCallRecord* rec) {
  CancelFlags flags = {request.cancel, config_.cancel};
  ConcurrencyLimiter::Slot slot(&limiter_, flags);
  if (!slot.acquired()) return Cancelled("cancelled while waiting for a free " + backend_ + " slot");

  LlmRequest effective = request;
  if (config_.temperature) effective.temperature = *config_.temperature;
  if (config_.max_tokens) effective.max_tokens = *config_.max_tokens;
  KS_ASSIGN_OR_RETURN(Reply reply, Exchange(BuildCall(effective), flags, rec));
  return std::move(reply.text);
}

StatusOr<HttpBackend::Reply> HttpBackend::Exchange(const Call& call, const CancelFlags& flags, LlmCallRecord* rec) {
  Status last;
  for (int attempt = 0;; ++attempt) {
    HttpRequest http{call.url, call.headers, call.body, config_.connect_timeout_s, config_.timeout_s, flags};
    ++rec->attempts;
    StatusOr<HttpResponse> resp = HttpPost(http);
    std::optional<double> retry_after;
    if (!resp.ok()) {
      last = resp.status();
      if (last.code() == Code::kCancelled || last.code() == Code::kInvalidArgument) return last;
    } else if (resp->status >= 200 && resp->status < 300) {
      nlohmann::json body;
      if (Status deep = CheckJsonNesting(resp->body, kMaxModelJsonDepth, "the reply"); !deep.ok())
        return Unavailable("malformed JSON from " + call.url + " (HTTP " + std::to_string(resp->status) +
                           "): " + deep.message());
      try {
        body = nlohmann::json::parse(resp->body);
      } catch (const nlohmann::json::exception& e) {
        return Unavailable("malformed JSON from " + call.url + " (HTTP " + std::to_string(resp->status) +
                           "): " + e.what() + "; body starts: " + BodyExcerpt(resp->body, 200));
      }
      StatusOr<Reply> reply = ParseReply(body);
      if (!reply.ok())
        return Status(reply.status().code(), "unexpected reply from " + call.url + ": " +
                                                 reply.status().message() + "; body starts: " +
                                                 BodyExcerpt(resp->body, 200));
      rec->tokens_in = reply->tokens_in;
      rec->tokens_out = reply->tokens_out;
      rec->finish_reason = reply->finish_reason;
      return reply;
    } else {
      last = ClassifyHttpError(*resp, call.url);
      if (!Retryable(resp->status)) return last;
      retry_after = resp->retry_after_s;
    }
    if (attempt >= config_.max_retries) {
      if (attempt == 0) return last;
      return last.WithContext("gave up after " + std::to_string(attempt + 1) + " attempts");
    }
    double delay = retry_after ? std::min(*retry_after, config_.retry_max_s) : BackoffSeconds(config_, attempt);
    spdlog::warn("{} {}: attempt {} failed ({}); retrying in {:.2f} s", backend_, model_, attempt + 1,
                 Redact(last.message()), delay);
    if (!SleepUnlessCancelled(delay, flags)) return Cancelled("cancelled while waiting to retry: " + last.message());
  }
}

Status HttpBackend::ClassifyHttpError(const HttpResponse& resp, const std::string& url) const {
  std::string msg = ServerMessage(resp.body);
  std::string http = "HTTP " + std::to_string(resp.status) + " from " + url + ": " + msg;
  if (resp.status == 401)
    return Unauthenticated("authentication failed (check $" + key_env_ + "): " + http);
  if (resp.status == 403)
    return PermissionDenied("request refused (check $" + key_env_ + " and access to model '" + model_ +
                            "'): " + http);
  if (resp.status == 404 || ((resp.status == 400 || resp.status == 422) && SaysUnknownModel(msg))) {
    if (resp.status != 404 || Mentions(msg, "model"))
      return NotFound("unknown model '" + model_ + "': " + http);
    return NotFound("not found (check the base URL '" + base_url_ + "'): " + http);
  }
  if (resp.status == 429) return ResourceExhausted("rate limited: " + http);
  if (resp.status >= 500 || resp.status == 408) return Unavailable("server error: " + http);
  return InvalidArgument("request rejected: " + http);
}

}  // namespace ks
