// Building language-model clients from a configuration: the backend spec, the
// knobs every backend shares, per-role routing and transcript recording.
//
// Specs:
//   openai:MODEL                 https://api.openai.com/v1, key from $OPENAI_API_KEY
//   openai:MODEL@BASE_URL        any OpenAI-compatible server (vLLM, llama.cpp,
//                                Ollama: http://localhost:11434/v1); the key is
//                                optional unless api_key_env is set
//   anthropic:MODEL[@BASE_URL]   Messages API, key from $ANTHROPIC_API_KEY
//   replay:FILE                  serves a transcript written by record_path
//   command:CMD                  /bin/sh -c CMD, prompt on stdin, completion on stdout
#pragma once

#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "llm/llm_client.h"
#include "llm/llm_config.h"

namespace ks {

// Builds the client the spec names, wrapped in a recorder when record_path is
// set. InvalidArgument for a malformed spec; FailedPrecondition naming the
// environment variable when a required key is missing; NotFound for a replay
// file that does not exist.
StatusOr<std::unique_ptr<LlmClient>> MakeLlmClient(const LlmConfig& config);

// One client per role: `role_specs` maps a role ("ideas", "implement",
// "repair") to a spec; each such role gets `base` with its spec replaced, and
// every other role goes to base.spec. One recorder (base.record_path) wraps
// the whole router, so all roles land in one transcript.
StatusOr<std::unique_ptr<LlmClient>> MakeRoutedLlmClient(
    const LlmConfig& base, const std::map<std::string, std::string>& role_specs);

// The spec forms of every backend, "openai:MODEL[@BASE_URL], ..., or
// command:CMD", for help texts and messages; the list lives in llm_factory.cc.
std::string BackendSpecForms();

// "ROLE=SPEC" → (role, spec), for command-line flags.
StatusOr<std::pair<std::string, std::string>> ParseRoleSpec(const std::string& text);

}  // namespace ks
