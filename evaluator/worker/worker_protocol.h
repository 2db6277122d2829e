// The one definition of what the trusted evaluator (gpu_evaluator*.cc) and
// ks-worker (worker/worker_serve.cc) say to each other. Framing: a 4-byte
// little-endian length, then that many bytes of JSON; binary (cubin, IPC
// handle) travels base64-encoded inside it. Each request below has its reply;
// any request may instead be answered by an ErrorReply. Both sides build and
// read messages only through these structs, so a field exists in one place:
// adding a plan key means a field here, its line in ToJson/FromJson, and its
// use in the worker (ARCHITECTURE.md, "a launch-plan key").
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evaluator/plan/tensor_map.h"

namespace ks {

constexpr size_t kMaxMessageBytes = 64u << 20;

Status SendMessage(int fd, const nlohmann::json& msg);
// timeout_s < 0 waits forever. DeadlineExceeded on timeout, Unavailable on EOF.
StatusOr<nlohmann::json> ReceiveMessage(int fd, double timeout_s);

// Poison patterns written into outputs before every run; an element still
// holding its pattern afterwards was never written. Each is a NaN of its type
// (fp16 0x7DA5, bf16 0x7FA5, fp32 0x7FA5A5A5, fp64 0x7FF4A5A5 twice), so an
// unwritten element can never pass as a plausible value; integer types get 0xA5 bytes.
struct PoisonPattern {
  int width = 4;          // 1, 2 or 4: the memset width
  uint32_t pattern = 0;
  bool operator==(const PoisonPattern&) const = default;
};

namespace wire {

// ---- init: map the arena, set up timing and the shared-memory scrub ----
struct OutputRegion {
  uint64_t offset = 0;  // in the arena
  uint64_t bytes = 0;
  PoisonPattern poison;
  bool operator==(const OutputRegion&) const = default;
};

struct InitRequest {
  static constexpr const char* kCmd = "init";
  int device = 0;
  std::string ipc_handle;       // raw CUipcMemHandle bytes of the arena
  std::vector<OutputRegion> outputs;
  uint64_t l2_flush_bytes = 0;
  std::string helper_cubin;     // the timing pad and the shared-memory scrub
  uint64_t pad_ns = 0;
  uint32_t scrub_shared_bytes = 0;
  uint32_t sms = 0;
  uint64_t printf_fifo_bytes = 1 << 20;
  bool operator==(const InitRequest&) const = default;
};

struct InitReply {
  std::string device;
  int64_t pid = 0;
  uint64_t heap_bytes = 0;
  bool operator==(const InitReply&) const = default;
};

// ---- load: a candidate's module and its resolved plan ----
// A kernel argument as the worker fills it.
struct Arg {
  enum class Kind { kTensor, kScratch, kI32, kI64, kF32, kF64, kTensorMap };
  Kind kind = Kind::kI32;
  std::vector<uint64_t> offsets;  // kTensor: arena offset per input set
  int index = 0;                  // kScratch, kTensorMap: index into the request's list
  int64_t i = 0;
  double f = 0;
  bool operator==(const Arg&) const = default;
};

// One launch's shape: what the launch-config helper (launch_config.h) takes.
struct LaunchShape {
  std::array<uint32_t, 3> grid{1, 1, 1};
  std::array<uint32_t, 3> block{1, 1, 1};
  uint32_t shared_bytes = 0;
  std::optional<std::array<uint32_t, 3>> cluster;
  bool operator==(const LaunchShape&) const = default;
};

struct Launch {
  std::string kernel;
  LaunchShape shape;
  std::vector<Arg> args;
  bool operator==(const Launch&) const = default;
};

// A tensor map the worker encodes for each input set (the address differs
// from set to set for an input, not for outputs or parameters) or once for
// a scratch buffer: where its tensor is, and the checked spec.
struct TensorMap {
  TensorMapSpec spec;
  std::vector<uint64_t> offsets;  // arena offset per input set, when not scratch
  int scratch = -1;               // else: the scratch buffer's index
  bool operator==(const TensorMap&) const = default;
};

struct Global {
  std::string name;
  int64_t size = 0;
  bool operator==(const Global&) const = default;
};

struct LoadRequest {
  static constexpr const char* kCmd = "load";
  std::string cubin;
  std::vector<Launch> launches;
  std::vector<uint64_t> scratch_bytes;
  std::vector<TensorMap> tensor_maps;
  std::vector<Global> globals;
  bool operator==(const LoadRequest&) const = default;
};

// What the driver says of one launch's kernel (cuOccupancy*, cuFuncGetAttribute);
// -1 where it would not say.
struct Occupancy {
  int blocks_per_sm = -1;
  int threads = 0;
  int registers = -1;
  int static_shared = -1;
  int64_t dynamic_shared = 0;
  int cluster_size = 0;
  int max_active_clusters = -1;
  bool operator==(const Occupancy&) const = default;
};

struct LoadReply {
  size_t globals = 0;  // how many module globals are restored before each run
  std::vector<Occupancy> occupancy;
  bool operator==(const LoadReply&) const = default;
};

// ---- run: one prepared, timed run of the plan on an input set ----
struct RunRequest {
  static constexpr const char* kCmd = "run";
  uint64_t set = 0;
  bool split = false;  // an event after each launch as well
  bool operator==(const RunRequest&) const = default;
};

struct RunReply {
  double ms = 0;         // start to end event on the stream
  double ms_device = 0;  // start to an event after a device-wide sync
  std::vector<std::string> state_changed;  // globals that did not come back to their load-time value
  std::vector<double> launch_ms;           // split runs
  bool operator==(const RunReply&) const = default;
};

// ---- warm: back-to-back runs, one sync at the end ----
struct WarmRequest {
  static constexpr const char* kCmd = "warm";
  int runs = 0;
  uint64_t sets = 1;
  uint64_t first_set = 0;
  bool operator==(const WarmRequest&) const = default;
};

struct WarmReply {
  int runs = 0;
  std::vector<std::string> state_changed;
  bool operator==(const WarmReply&) const = default;
};

struct UnloadRequest {
  static constexpr const char* kCmd = "unload";
  bool operator==(const UnloadRequest&) const = default;
};
struct QuitRequest {
  static constexpr const char* kCmd = "quit";
  bool operator==(const QuitRequest&) const = default;
};
struct EmptyReply {
  bool operator==(const EmptyReply&) const = default;
};

// ---- compile: `ks-worker compile` / `compile-server` (NVRTC, out of process) ----
struct CompileRequest {
  static constexpr const char* kCmd = "compile";
  std::string source;
  std::string arch;       // the NVRTC target: sm_90 or sm_90a
  std::string cuda_home;  // whose include/ NVRTC sees
  bool operator==(const CompileRequest&) const = default;
};

// A source that does not compile is ok = false with the reason and the log
// (a result, not an ErrorReply).
struct CompileReply {
  bool ok = false;
  std::string message;
  std::string log;
  double seconds = 0;
  std::string cubin;  // when ok
  std::string ptx;    // when ok
  bool operator==(const CompileReply&) const = default;
};

// Any request may be refused: status is an evaluation status the evaluator
// takes over ("launch_error", "invalid_plan", "runtime_error") or "internal";
// fatal means the worker's context is broken and it exits after replying.
struct ErrorReply {
  std::string status = "internal";
  std::string message;
  bool fatal = false;
  bool operator==(const ErrorReply&) const = default;
};

// Encoding. Requests carry "cmd"; replies carry "ok". Decoding fails with
// InvalidArgument naming the field, never throws.
nlohmann::json ToJson(const InitRequest& m);
nlohmann::json ToJson(const InitReply& m);
nlohmann::json ToJson(const LoadRequest& m);
nlohmann::json ToJson(const LoadReply& m);
nlohmann::json ToJson(const RunRequest& m);
nlohmann::json ToJson(const RunReply& m);
nlohmann::json ToJson(const WarmRequest& m);
nlohmann::json ToJson(const WarmReply& m);
nlohmann::json ToJson(const UnloadRequest& m);
nlohmann::json ToJson(const QuitRequest& m);
nlohmann::json ToJson(const EmptyReply& m);
nlohmann::json ToJson(const ErrorReply& m);
nlohmann::json ToJson(const CompileRequest& m);
nlohmann::json ToJson(const CompileReply& m);

template <typename T>
StatusOr<T> FromJson(const nlohmann::json& j);
template <>
StatusOr<InitRequest> FromJson<InitRequest>(const nlohmann::json& j);
template <>
StatusOr<InitReply> FromJson<InitReply>(const nlohmann::json& j);
template <>
StatusOr<LoadRequest> FromJson<LoadRequest>(const nlohmann::json& j);
template <>
StatusOr<LoadReply> FromJson<LoadReply>(const nlohmann::json& j);
template <>
StatusOr<RunRequest> FromJson<RunRequest>(const nlohmann::json& j);
template <>
StatusOr<RunReply> FromJson<RunReply>(const nlohmann::json& j);
template <>
StatusOr<WarmRequest> FromJson<WarmRequest>(const nlohmann::json& j);
template <>
StatusOr<WarmReply> FromJson<WarmReply>(const nlohmann::json& j);
template <>
StatusOr<UnloadRequest> FromJson<UnloadRequest>(const nlohmann::json& j);
template <>
StatusOr<QuitRequest> FromJson<QuitRequest>(const nlohmann::json& j);
template <>
StatusOr<EmptyReply> FromJson<EmptyReply>(const nlohmann::json& j);
template <>
StatusOr<ErrorReply> FromJson<ErrorReply>(const nlohmann::json& j);
template <>
StatusOr<CompileRequest> FromJson<CompileRequest>(const nlohmann::json& j);
template <>
StatusOr<CompileReply> FromJson<CompileReply>(const nlohmann::json& j);

// The request's command ("" when absent), for the worker's dispatch.
std::string CommandOf(const nlohmann::json& request);
// A reply that says ok:false, read as an ErrorReply; nullopt for ok:true.
std::optional<ErrorReply> ErrorOf(const nlohmann::json& reply);

}  // namespace wire
}  // namespace ks
