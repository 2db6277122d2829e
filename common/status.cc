#include "common/status.h"

namespace ks {

const char* CodeName(Code c) {
  switch (c) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case Code::kInternal: return "INTERNAL";
    case Code::kCancelled: return "CANCELLED";
    case Code::kAlreadyExists: return "ALREADY_EXISTS";
    case Code::kUnauthenticated: return "UNAUTHENTICATED";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace ks
