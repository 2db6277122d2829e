// Bearer-token authentication for the gRPC service. The server holds one shared
// token (from --token-file or $KS_SERVER_TOKEN); every call must carry
// `authorization: Bearer <token>` metadata. Compared in constant time over
// SHA-256 digests, so neither the token's bytes nor its length leak through
// timing. Immutable after construction; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace ks::server {

inline constexpr char kTokenEnv[] = "KS_SERVER_TOKEN";
inline constexpr size_t kMinTokenBytes = 16;  // a shorter secret is guessable
inline constexpr size_t kMaxTokenBytes = 4096;

// The token from `token_file` (trailing newline and spaces dropped) when given,
// else from $KS_SERVER_TOKEN. InvalidArgument when the file is unreadable or
// the token is empty, too short, too long or holds control characters;
// FailedPrecondition when neither source is set.
StatusOr<std::string> LoadToken(const std::string& token_file);

// Equal in time that depends only on the digest size, not on where a and b differ.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

class TokenAuth {
 public:
  explicit TokenAuth(const std::string& token);

  // `values` are the request's authorization metadata values (normally one).
  // Unauthenticated when none, several, not "Bearer <t>", or the wrong token;
  // the message never echoes what was sent.
  Status Check(const std::vector<std::string_view>& values) const;

 private:
  std::string token_digest_;  // hex SHA-256 of the token
};

}  // namespace ks::server
