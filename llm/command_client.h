// command:CMD: runs `/bin/sh -c CMD` once per call with the prompt on stdin and
// takes stdout as the completion. The child also sees KS_LLM_ROLE,
// KS_LLM_SYSTEM, KS_LLM_MAX_TOKENS and KS_LLM_TEMPERATURE in its environment.
// Usage: a command may write {"tokens_in": N, "tokens_out": M} to the file
// $KS_LLM_USAGE_FILE names; otherwise tokens are estimated from the text (4
// characters a token). Cost is tokens at config's --price-* rates.
// A non-zero exit, a signal, empty output or overrunning config.timeout_s is
// an error naming the command and the start of its stderr. Not retried: a
// command that fails usually fails the same way again.
// Conversations with tools (Converse) use the JSON protocol of
// llm/conversation.h on stdin and stdout, with KS_LLM_PROTOCOL set to
// "ks-conversation-1" ("text" for a plain completion). Thread-safe; at most
// config.concurrency commands run at once.
#pragma once

#include <memory>
#include <string>

#include "llm/llm_client.h"
#include "llm/llm_config.h"

namespace ks {

StatusOr<std::unique_ptr<LlmClient>> MakeCommandClient(const std::string& command, const LlmConfig& config);

}  // namespace ks
