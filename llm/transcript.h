// Transcripts: every call of a search as JSON lines, written by RecordingClient
// and served back by the replay backend, so that a search can be reproduced
// exactly and tests need no network. One line per call:
//   {"hash": PromptHash, "role", "backend", "model", "system", "prompt",
//    "response", "finish_reason", "tokens_in", "tokens_out", "latency_s",
//    "cost_usd", "attempts", "error", "code"}
// Failed calls are recorded too (with "error" and the Status code name) and
// replay as the same failure.
#pragma once

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "llm/llm_client.h"
#include "llm/llm_config.h"

namespace ks {

// sha256 over role, system and prompt (NUL-separated, so fields cannot run into
// each other): the key replay matches on.
std::string PromptHash(const std::string& role, const std::string& system, const std::string& prompt);

nlohmann::json CallRecordToJson(const LlmCallRecord& r, const Status& status);

// Appends records to a transcript file, one flushed line each, so that a killed
// search leaves every finished call on disk. Thread-safe; owns the FILE.
class TranscriptWriter {
 public:
  static StatusOr<std::shared_ptr<TranscriptWriter>> Open(const std::string& path);
  TranscriptWriter(const TranscriptWriter&) = delete;
  TranscriptWriter& operator=(const TranscriptWriter&) = delete;
  Status Append(const LlmCallRecord& record, const Status& status);
  const std::string& path() const { return path_; }

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  TranscriptWriter(std::string path, std::FILE* f) : path_(std::move(path)), file_(f) {}
  const std::string path_;
  std::mutex mu_;
  std::unique_ptr<std::FILE, FileCloser> file_;
};

// A decorator: forwards every call to `inner` and appends it, success or
// failure, to the transcript. A record that cannot be written fails the call
// (a transcript with holes would not reproduce the search). Thread-safe when
// `inner` is; owns `inner`, shares the writer.
class RecordingClient final : public LlmClient {
 public:
  RecordingClient(std::unique_ptr<LlmClient> inner, std::shared_ptr<TranscriptWriter> writer)
      : inner_(std::move(inner)), writer_(std::move(writer)) {}
  StatusOr<std::string> Complete(const LlmRequest& request, LlmCallRecord* record) override;
  StatusOr<AssistantReply> Converse(const ConversationRequest& request, LlmCallRecord* record) override;
  std::string Describe() const override;

 private:
  std::unique_ptr<LlmClient> inner_;
  std::shared_ptr<TranscriptWriter> writer_;
};

// replay:FILE. Identical prompts recorded several times (B implementations of
// one idea) are served in recorded order. Strict (default): a prompt whose hash
// is not in the file, or whose recordings are used up, is a NotFound error
// naming the hash. Not strict: such a prompt gets the next unserved recording
// of the same role. Tokens and cost are replayed as recorded, so budgets stop
// a replayed search where they stopped the original. Thread-safe.
StatusOr<std::unique_ptr<LlmClient>> MakeReplayClient(const std::string& path, const LlmConfig& config);

}  // namespace ks
