// The one place where ks::Status becomes grpc::Status (and back, for the
// client), and where anything thrown inside an RPC handler is caught. Every
// handler body runs through GuardedCall so that a third-party exception
// (protobuf, nlohmann::json, std::bad_alloc) becomes INTERNAL or
// RESOURCE_EXHAUSTED instead of ending the server. Stateless; thread-safe.
#pragma once

#include <exception>
#include <functional>
#include <new>
#include <string>

#include <grpcpp/support/status.h>

#include "common/status.h"

namespace ks::server {

// Same code, same message; OK maps to OK. Codes without a grpc twin do not
// exist (ks::Code mirrors a subset of grpc::StatusCode).
grpc::Status ToGrpcStatus(const Status& s);

// The client direction: a failed call becomes a ks::Status with the code kept
// and "server: " context when the server answered, or "ADDR: " context when it
// could not be reached.
Status FromGrpcStatus(const grpc::Status& s);

// Runs `body`; a thrown exception becomes INTERNAL ("METHOD: internal error:
// what()") or RESOURCE_EXHAUSTED for std::bad_alloc, and is logged to stderr,
// because an exception here is our bug or a library's and must be visible.
grpc::Status GuardedCall(const char* method, const std::function<Status()>& body);

}  // namespace ks::server
