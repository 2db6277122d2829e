#include "llm/transcript.h"

#include <cerrno>
#include <chrono>
#include <map>
#include <sstream>

#include "common/files.h"

namespace ks {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Code CodeFromName(const std::string& name) {
  for (int c = static_cast<int>(Code::kInvalidArgument); c <= static_cast<int>(Code::kPermissionDenied); ++c)
    if (name == CodeName(static_cast<Code>(c))) return static_cast<Code>(c);
  return Code::kUnavailable;
}

struct Entry {
  LlmCallRecord record;
  std::string hash;
  Code code = Code::kOk;
  bool served = false;
};

class ReplayClient final : public LlmClient {
 public:
  ReplayClient(std::string path, std::vector<Entry> entries, bool strict)
      : path_(std::move(path)), entries_(std::move(entries)), strict_(strict) {}

  StatusOr<std::string> Complete(const LlmRequest& request, LlmCallRecord* record) override {
    double start = Now();
    LlmCallRecord local;
    LlmCallRecord* rec = record ? record : &local;
    *rec = LlmCallRecord{};
    rec->role = request.role;
    rec->backend = "replay";
    rec->system = request.system;
    rec->prompt = request.prompt;
    std::string hash = PromptHash(request.role, request.system, request.prompt);
    Status status;
    const Entry* hit = nullptr;
    if (request.cancel && request.cancel->load()) {
      status = Cancelled("cancelled");
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      hit = Take(hash, request.role, &status);
    }
    if (hit) {
      rec->model = hit->record.model;
      rec->response = hit->record.response;
      rec->finish_reason = hit->record.finish_reason;
      rec->tokens_in = hit->record.tokens_in;
      rec->tokens_out = hit->record.tokens_out;
      rec->cost_usd = hit->record.cost_usd;
      rec->attempts = hit->record.attempts;
      if (hit->code != Code::kOk) status = Status(hit->code, "replayed failure: " + hit->record.error);
    }
    rec->latency_s = Now() - start;
    if (!status.ok()) {
      rec->response.clear();
      rec->error = status.message();
      return status;
    }
    return rec->response;
  }

  // A conversation is recorded as a completion whose prompt is the request in
  // the protocol (llm/conversation.h), so it replays through the same lookup:
  // the same conversation gets the recorded assistant turn.
  StatusOr<AssistantReply> Converse(const ConversationRequest& request, LlmCallRecord* record) override {
    LlmCallRecord local;
    LlmCallRecord* rec = record ? record : &local;
    LlmRequest as_prompt{.role = request.role, .system = request.system,
                         .prompt = ConversationToJson(request).dump(), .cancel = request.cancel};
    KS_ASSIGN_OR_RETURN(std::string text, Complete(as_prompt, rec));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    StatusOr<AssistantReply> reply = ReplyFromJson(j);
    if (!reply.ok()) {
      rec->error = "replay " + path_ + ": the recorded reply is not an assistant turn: " + reply.status().message();
      return InvalidArgument(rec->error);
    }
    return reply;
  }

  std::string Describe() const override { return std::string("replay:") + path_ + (strict_ ? "" : " (loose)"); }

 private:
  // Needs mu_.
  const Entry* Take(const std::string& hash, const std::string& role, Status* status) {
    int recorded = 0;
    for (Entry& e : entries_) {
      if (e.hash != hash) continue;
      ++recorded;
      if (!e.served) return e.served = true, &e;
    }
    if (!strict_) {
      for (Entry& e : entries_)
        if (!e.served && e.record.role == role) return e.served = true, &e;
    }
    if (recorded == 0)
      *status = NotFound("replay " + path_ + ": no recorded response for prompt " + hash + " (role '" + role + "')");
    else
      *status = NotFound("replay " + path_ + ": prompt " + hash + " (role '" + role + "') was recorded " +
                         std::to_string(recorded) + " times and all have been served");
    return nullptr;
  }

  const std::string path_;
  std::mutex mu_;
  std::vector<Entry> entries_;
  const bool strict_;
};

}  // namespace

std::string PromptHash(const std::string& role, const std::string& system, const std::string& prompt) {
  std::string data = role;
  data += '\0';
  data += system;
  data += '\0';
  data += prompt;
  return Sha256Hex(data);
}

nlohmann::json CallRecordToJson(const LlmCallRecord& r, const Status& status) {
  return {
      {"hash", PromptHash(r.role, r.system, r.prompt)},
      {"role", r.role},
      {"backend", r.backend},
      {"model", r.model},
      {"system", r.system},
      {"prompt", r.prompt},
      {"response", r.response},
      {"finish_reason", r.finish_reason},
      {"tokens_in", r.tokens_in},
      {"tokens_out", r.tokens_out},
      {"latency_s", r.latency_s},
      {"cost_usd", r.cost_usd},
      {"attempts", r.attempts},
      {"error", r.error},
      {"code", status.ok() ? "" : CodeName(status.code())},
  };
}

StatusOr<std::shared_ptr<TranscriptWriter>> TranscriptWriter::Open(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "ae");  // append; close-on-exec
  if (!f) return PosixError("cannot open transcript " + path, errno);
  return std::shared_ptr<TranscriptWriter>(new TranscriptWriter(path, f));
}

Status TranscriptWriter::Append(const LlmCallRecord& record, const Status& status) {
  // Invalid UTF-8 from a model must not make the dump throw.
  std::string line = CallRecordToJson(record, status).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  line += '\n';
  std::lock_guard<std::mutex> lock(mu_);
  if (std::fwrite(line.data(), 1, line.size(), file_.get()) != line.size() || std::fflush(file_.get()) != 0)
    return PosixError("cannot append to transcript " + path_, errno);
  return Status::Ok();
}

StatusOr<std::string> RecordingClient::Complete(const LlmRequest& request, LlmCallRecord* record) {
  LlmCallRecord local;
  LlmCallRecord* rec = record ? record : &local;
  StatusOr<std::string> result = inner_->Complete(request, rec);
  Status written = writer_->Append(*rec, result.status());
  if (!written.ok()) {
    rec->error = written.message();
    return written;
  }
  return result;
}

StatusOr<AssistantReply> RecordingClient::Converse(const ConversationRequest& request, LlmCallRecord* record) {
  LlmCallRecord local;
  LlmCallRecord* rec = record ? record : &local;
  StatusOr<AssistantReply> result = inner_->Converse(request, rec);
  Status written = writer_->Append(*rec, result.status());
  if (!written.ok()) {
    rec->error = written.message();
    return written;
  }
  return result;
}

std::string RecordingClient::Describe() const { return inner_->Describe() + " (recording to " + writer_->path() + ")"; }

StatusOr<std::unique_ptr<LlmClient>> MakeReplayClient(const std::string& path, const LlmConfig& config) {
  if (path.empty()) return InvalidArgument("replay spec names no file (replay:FILE)");
  KS_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  std::vector<Entry> entries;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("prompt") || !j["prompt"].is_string())
      return InvalidArgument(path + ":" + std::to_string(n) + ": not a transcript record (JSON object with \"prompt\")");
    Entry e;
    LlmCallRecord& r = e.record;
    r.role = j.value("role", "");
    r.model = j.value("model", "");
    r.system = j.value("system", "");
    r.prompt = j["prompt"].get<std::string>();
    r.response = j.value("response", "");
    r.finish_reason = j.value("finish_reason", "");
    r.tokens_in = j.value("tokens_in", int64_t{0});
    r.tokens_out = j.value("tokens_out", int64_t{0});
    r.cost_usd = j.value("cost_usd", 0.0);
    r.attempts = j.value("attempts", 1);
    r.error = j.value("error", "");
    std::string code = j.value("code", "");
    e.code = code.empty() ? (r.error.empty() ? Code::kOk : Code::kUnavailable) : CodeFromName(code);
    // The hash is recomputed, so a hand-edited transcript stays consistent.
    e.hash = PromptHash(r.role, r.system, r.prompt);
    entries.push_back(std::move(e));
  }
  return std::unique_ptr<LlmClient>(new ReplayClient(path, std::move(entries), config.replay_strict));
}

}  // namespace ks
