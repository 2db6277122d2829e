// The one translator between ks::Status and grpc::Status, and the guard that
// turns exceptions into statuses.
#include "server/status_convert.h"

#include <stdexcept>

#include <gtest/gtest.h>

namespace ks::server {
namespace {

TEST(StatusConvert, EveryCodeMapsToItsGrpcTwinAndBack) {
  const std::pair<Code, grpc::StatusCode> pairs[] = {
      {Code::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {Code::kNotFound, grpc::StatusCode::NOT_FOUND},
      {Code::kFailedPrecondition, grpc::StatusCode::FAILED_PRECONDITION},
      {Code::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {Code::kDeadlineExceeded, grpc::StatusCode::DEADLINE_EXCEEDED},
      {Code::kResourceExhausted, grpc::StatusCode::RESOURCE_EXHAUSTED},
      {Code::kInternal, grpc::StatusCode::INTERNAL},
      {Code::kCancelled, grpc::StatusCode::CANCELLED},
      {Code::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {Code::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
      {Code::kPermissionDenied, grpc::StatusCode::PERMISSION_DENIED},
  };
  for (const auto& [code, grpc_code] : pairs) {
    grpc::Status g = ToGrpcStatus(Status(code, "why"));
    EXPECT_EQ(g.error_code(), grpc_code) << CodeName(code);
    EXPECT_EQ(g.error_message(), "why");
    Status back = FromGrpcStatus(g);
    EXPECT_EQ(back.code(), code) << CodeName(code);
    EXPECT_NE(back.message().find("why"), std::string::npos);
  }
  EXPECT_TRUE(ToGrpcStatus(Status::Ok()).ok());
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK).ok());
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNKNOWN, "x")).code(), Code::kInternal);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "x")).code(), Code::kFailedPrecondition);
}

TEST(StatusConvert, UnreachableServerIsSaidSo) {
  Status s = FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"));
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_NE(s.message().find("unreachable"), std::string::npos) << s.message();
}

TEST(GuardedCall, PassesStatusesThrough) {
  EXPECT_TRUE(GuardedCall("M", [] { return Status::Ok(); }).ok());
  grpc::Status g = GuardedCall("M", [] { return NotFound("no search 7"); });
  EXPECT_EQ(g.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(g.error_message(), "no search 7");
}

TEST(GuardedCall, ExceptionsBecomeStatusesNamingTheMethod) {
  grpc::Status g = GuardedCall("GetSearch", []() -> Status { throw std::runtime_error("json boom"); });
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_NE(g.error_message().find("GetSearch"), std::string::npos);
  EXPECT_NE(g.error_message().find("json boom"), std::string::npos);
  g = GuardedCall("M", []() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(g.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  g = GuardedCall("M", []() -> Status { throw 42; });
  EXPECT_EQ(g.error_code(), grpc::StatusCode::INTERNAL);
}

}  // namespace
}  // namespace ks::server
