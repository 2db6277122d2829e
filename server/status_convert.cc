#include "server/status_convert.h"

#include <cstdio>

namespace ks::server {

grpc::Status ToGrpcStatus(const Status& s) {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  switch (s.code()) {
    case Code::kOk: return grpc::Status::OK;
    case Code::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case Code::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case Code::kFailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case Code::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case Code::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case Code::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case Code::kInternal: code = grpc::StatusCode::INTERNAL; break;
    case Code::kCancelled: code = grpc::StatusCode::CANCELLED; break;
    case Code::kAlreadyExists: code = grpc::StatusCode::ALREADY_EXISTS; break;
    case Code::kUnauthenticated: code = grpc::StatusCode::UNAUTHENTICATED; break;
    case Code::kPermissionDenied: code = grpc::StatusCode::PERMISSION_DENIED; break;
  }
  return grpc::Status(code, s.message());
}

Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return Status::Ok();
  Code code = Code::kInternal;
  switch (s.error_code()) {
    case grpc::StatusCode::OK: return Status::Ok();
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE: code = Code::kInvalidArgument; break;
    case grpc::StatusCode::NOT_FOUND: code = Code::kNotFound; break;
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::UNIMPLEMENTED: code = Code::kFailedPrecondition; break;
    case grpc::StatusCode::UNAVAILABLE: code = Code::kUnavailable; break;
    case grpc::StatusCode::DEADLINE_EXCEEDED: code = Code::kDeadlineExceeded; break;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: code = Code::kResourceExhausted; break;
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED: code = Code::kCancelled; break;
    case grpc::StatusCode::ALREADY_EXISTS: code = Code::kAlreadyExists; break;
    case grpc::StatusCode::UNAUTHENTICATED: code = Code::kUnauthenticated; break;
    case grpc::StatusCode::PERMISSION_DENIED: code = Code::kPermissionDenied; break;
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DATA_LOSS:
    default: code = Code::kInternal; break;
  }
  // UNAVAILABLE comes from the transport (no server there, TLS mismatch);
  // everything else is the server's own answer.
  const char* who = s.error_code() == grpc::StatusCode::UNAVAILABLE ? "server unreachable" : "server";
  return Status(code, std::string(who) + ": " + s.error_message());
}

grpc::Status GuardedCall(const char* method, const std::function<Status()>& body) {
  try {
    return ToGrpcStatus(body());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kernelsearch serve: %s: out of memory\n", method);
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, std::string(method) + ": out of memory");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kernelsearch serve: %s: internal error: %s\n", method, e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(method) + ": internal error: " + e.what());
  } catch (...) {
    std::fprintf(stderr, "kernelsearch serve: %s: internal error: unknown exception\n", method);
    return grpc::Status(grpc::StatusCode::INTERNAL, std::string(method) + ": internal error");
  }
}

}  // namespace ks::server
