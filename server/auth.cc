#include "server/auth.h"

#include <cstdlib>

#include "common/files.h"

namespace ks::server {
namespace {

Status ValidateToken(const std::string& token, const std::string& where) {
  if (token.empty()) return InvalidArgument(where + ": the token is empty");
  if (token.size() < kMinTokenBytes)
    return InvalidArgument(where + ": the token is shorter than " + std::to_string(kMinTokenBytes) +
                           " bytes; use a random one (openssl rand -hex 32)");
  if (token.size() > kMaxTokenBytes)
    return InvalidArgument(where + ": the token is longer than " + std::to_string(kMaxTokenBytes) + " bytes");
  for (unsigned char c : token) {
    // gRPC metadata values must be printable ASCII; anything else could never match.
    if (c < 0x21 || c > 0x7e) return InvalidArgument(where + ": the token holds spaces or control characters");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> LoadToken(const std::string& token_file) {
  std::string token;
  std::string where;
  if (!token_file.empty()) {
    KS_ASSIGN_OR_RETURN(token, ReadFile(token_file, kMaxTokenBytes + 64));
    where = token_file;
  } else if (const char* env = std::getenv(kTokenEnv); env != nullptr) {
    token = env;
    where = std::string("$") + kTokenEnv;
  } else {
    return FailedPrecondition(std::string("no token: pass --token-file FILE or set $") + kTokenEnv);
  }
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                            token.back() == '\t'))
    token.pop_back();
  KS_RETURN_IF_ERROR(ValidateToken(token, where));
  return token;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Hash first so that the loop length never depends on the secret's length.
  std::string da = Sha256Hex(std::string(a));
  std::string db = Sha256Hex(std::string(b));
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < da.size() && i < db.size(); ++i) diff = diff | (da[i] ^ db[i]);
  return diff == 0 && da.size() == db.size();
}

TokenAuth::TokenAuth(const std::string& token) : token_digest_(Sha256Hex(token)) {}

Status TokenAuth::Check(const std::vector<std::string_view>& values) const {
  if (values.empty()) return Unauthenticated("missing authorization metadata (Bearer token)");
  if (values.size() > 1) return Unauthenticated("more than one authorization header");
  std::string_view v = values.front();
  constexpr std::string_view kScheme = "bearer ";
  if (v.size() <= kScheme.size()) return Unauthenticated("authorization is not 'Bearer <token>'");
  for (size_t i = 0; i < kScheme.size(); ++i) {
    char c = v[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kScheme[i]) return Unauthenticated("authorization is not 'Bearer <token>'");
  }
  std::string given_digest = Sha256Hex(std::string(v.substr(kScheme.size())));
  volatile unsigned char diff = 0;
  for (size_t i = 0; i < token_digest_.size(); ++i) diff = diff | (token_digest_[i] ^ given_digest[i]);
  if (diff != 0) return Unauthenticated("invalid token");
  return Status::Ok();
}

}  // namespace ks::server
