#include "llm/role_router.h"

namespace ks {

RoleRouter::RoleRouter(std::unique_ptr<LlmClient> fallback, std::map<std::string, std::unique_ptr<LlmClient>> by_role)
    : fallback_(std::move(fallback)), by_role_(std::move(by_role)) {
  KS_CHECK(fallback_ != nullptr);
  for (const auto& [role, client] : by_role_) KS_CHECK(client != nullptr);
}

LlmClient* RoleRouter::ClientFor(const std::string& role) const {
  auto it = by_role_.find(role);
  return it == by_role_.end() ? fallback_.get() : it->second.get();
}

StatusOr<std::string> RoleRouter::Complete(const LlmRequest& request, LlmCallRecord* record) {
  return ClientFor(request.role)->Complete(request, record);
}

StatusOr<AssistantReply> RoleRouter::Converse(const ConversationRequest& request, LlmCallRecord* record) {
  return ClientFor(request.role)->Converse(request, record);
}

std::string RoleRouter::Describe() const {
  std::string out = "default=" + fallback_->Describe();
  for (const auto& [role, client] : by_role_) out += "; " + role + "=" + client->Describe();
  return out;
}

}  // namespace ks
