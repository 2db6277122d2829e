// Sends each request to the client configured for its role (LlmRequest::role),
// so that ideas and implementations can come from different models. Owns the
// clients; thread-safe when they are (the map is fixed at construction).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "llm/llm_client.h"

namespace ks {

class RoleRouter final : public LlmClient {
 public:
  // `fallback` serves every role without an entry in `by_role`; must not be null.
  RoleRouter(std::unique_ptr<LlmClient> fallback, std::map<std::string, std::unique_ptr<LlmClient>> by_role);
  StatusOr<std::string> Complete(const LlmRequest& request, LlmCallRecord* record) override;
  StatusOr<AssistantReply> Converse(const ConversationRequest& request, LlmCallRecord* record) override;
  // "default=<describe>; ideas=<describe>; ..."
  std::string Describe() const override;
  // The client a role goes to (never null).
  LlmClient* ClientFor(const std::string& role) const;

 private:
  std::unique_ptr<LlmClient> fallback_;
  std::map<std::string, std::unique_ptr<LlmClient>> by_role_;
};

}  // namespace ks
