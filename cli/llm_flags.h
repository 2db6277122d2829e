// The model flags shared by every command that talks to a language model
// (`llm check`, `search`): --model, per-role models, key variable, limits,
// prices and --record. Defined in cmd_llm.cc.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "llm/llm_factory.h"

namespace ks::cli {

struct LlmFlags {
  LlmConfig config;
  std::vector<std::string> role_models;  // "ROLE=SPEC"
  double temperature = -1;               // < 0: the request's own
  int max_tokens = 0;                    // 0: the request's own
};

// Adds the flags to `sub`; `flags` must outlive parsing. --model is required
// when `require_model`.
void AddLlmOptions(CLI::App* sub, LlmFlags* flags, bool require_model);

// The client the flags describe (routed per role when --role-model was given).
StatusOr<std::unique_ptr<LlmClient>> MakeLlmClientFromFlags(const LlmFlags& flags);

// Sends one small request (`llm check`, `doctor`): a one-line summary of the
// answer, or the error with what to try next.
StatusOr<std::string> CheckModel(const LlmFlags& flags);

}  // namespace ks::cli
