// Errors as values. Status carries a code and a message with context; StatusOr<T>
// holds either a value or a non-OK Status. Every library in this tree returns
// these; the CLI and the gRPC server are the only places that translate them.
#pragma once

#include <cassert>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <utility>
#include <variant>

namespace ks {

enum class Code {
  kOk = 0,
  kInvalidArgument,     // bad user input: file, plan, flag
  kNotFound,
  kFailedPrecondition,  // environment not ready: no GPU, no torch
  kUnavailable,         // a remote side (LLM, worker) could not be reached
  kDeadlineExceeded,
  kResourceExhausted,   // budgets and size limits
  kInternal,            // a bug or a C library failing unexpectedly
  kCancelled,
  kAlreadyExists,
  kUnauthenticated,
  kPermissionDenied,
};

const char* CodeName(Code c);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Returns a copy with `context: ` put before the message.
  Status WithContext(const std::string& context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status FailedPrecondition(std::string m) { return {Code::kFailedPrecondition, std::move(m)}; }
inline Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
inline Status DeadlineExceeded(std::string m) { return {Code::kDeadlineExceeded, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {Code::kResourceExhausted, std::move(m)}; }
inline Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
inline Status Cancelled(std::string m) { return {Code::kCancelled, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
inline Status Unauthenticated(std::string m) { return {Code::kUnauthenticated, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).ok()) {
      std::fprintf(stderr, "StatusOr constructed from an OK Status\n");
      std::abort();
    }
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { Check(); return std::get<T>(v_); }
  const T& value() const& { Check(); return std::get<T>(v_); }
  T&& value() && { Check(); return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void Check() const {
    if (!ok()) {
      std::fprintf(stderr, "StatusOr::value() on error: %s\n", std::get<Status>(v_).ToString().c_str());
      std::abort();
    }
  }
  std::variant<T, Status> v_;
};

// Aborts loudly when an invariant of our own code is broken (not for user input).
#define KS_CHECK(cond)                                                              \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: KS_CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#define KS_RETURN_IF_ERROR(expr)        \
  do {                                  \
    ::ks::Status ks_status_ = (expr);   \
    if (!ks_status_.ok()) return ks_status_; \
  } while (0)

#define KS_CONCAT_INNER(a, b) a##b
#define KS_CONCAT(a, b) KS_CONCAT_INNER(a, b)
#define KS_ASSIGN_OR_RETURN(lhs, expr) KS_ASSIGN_OR_RETURN_IMPL(KS_CONCAT(ks_sor_, __LINE__), lhs, expr)
#define KS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

}  // namespace ks
