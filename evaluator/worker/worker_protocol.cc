#include "evaluator/worker/worker_protocol.h"

#include <cstdint>

#include "common/base64.h"
#include "common/subprocess.h"

namespace ks {

Status SendMessage(int fd, const nlohmann::json& msg) {
  std::string body = msg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (body.size() > kMaxMessageBytes) return ResourceExhausted("worker message of " + std::to_string(body.size()) + " bytes");
  uint32_t n = static_cast<uint32_t>(body.size());
  unsigned char hdr[4] = {static_cast<unsigned char>(n), static_cast<unsigned char>(n >> 8),
                          static_cast<unsigned char>(n >> 16), static_cast<unsigned char>(n >> 24)};
  KS_RETURN_IF_ERROR(WriteAll(fd, hdr, 4));
  return WriteAll(fd, body.data(), body.size());
}

StatusOr<nlohmann::json> ReceiveMessage(int fd, double timeout_s) {
  unsigned char hdr[4];
  KS_RETURN_IF_ERROR(ReadExact(fd, hdr, 4, timeout_s));
  uint32_t n = hdr[0] | (hdr[1] << 8) | (hdr[2] << 16) | (uint32_t(hdr[3]) << 24);
  if (n > kMaxMessageBytes) return Internal("worker message too large: " + std::to_string(n));
  std::string body(n, '\0');
  KS_RETURN_IF_ERROR(ReadExact(fd, body.data(), n, timeout_s));
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded()) return Internal("unreadable worker message");
  return j;
}

}  // namespace ks

namespace ks::wire {
namespace {

using json = nlohmann::json;

// Reads j[key] into *out when present (absent keys keep the default, so an
// older peer's message still reads); a present key of the wrong type fails.
template <typename V>
Status Get(const json& j, const char* key, V* out) {
  if (!j.is_object()) return InvalidArgument("worker message is not an object");
  auto it = j.find(key);
  if (it == j.end()) return Status::Ok();
  try {
    *out = it->template get<V>();
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("worker message field \"") + key + "\": " + e.what());
  }
  return Status::Ok();
}

StatusOr<std::string> GetBytes(const json& j, const char* key) {
  std::string b64;
  KS_RETURN_IF_ERROR(Get(j, key, &b64));
  auto raw = Base64Decode(b64);
  if (!raw.ok()) return InvalidArgument(std::string("worker message field \"") + key + "\": bad base64");
  return *raw;
}

template <typename T, typename F>
StatusOr<std::vector<T>> GetList(const json& j, const char* key, F&& read) {
  std::vector<T> out;
  auto it = j.find(key);
  if (it == j.end()) return out;
  if (!it->is_array()) return InvalidArgument(std::string("worker message field \"") + key + "\" is not a list");
  for (const auto& e : *it) {
    auto v = read(e);
    if (!v.ok()) return v.status().WithContext(key);
    out.push_back(std::move(*v));
  }
  return out;
}

constexpr const char* kArgKinds[] = {"tensor", "scratch", "i32", "i64", "f32", "f64", "tensor_map"};

json ArgToJson(const Arg& a) {
  json j{{"k", kArgKinds[static_cast<int>(a.kind)]}};
  switch (a.kind) {
    case Arg::Kind::kTensor: j["offsets"] = a.offsets; break;
    case Arg::Kind::kScratch: case Arg::Kind::kTensorMap: j["i"] = a.index; break;
    case Arg::Kind::kI32: case Arg::Kind::kI64: j["v"] = a.i; break;
    case Arg::Kind::kF32: case Arg::Kind::kF64: j["v"] = a.f; break;
  }
  return j;
}

StatusOr<Arg> ArgFromJson(const json& j) {
  std::string k;
  KS_RETURN_IF_ERROR(Get(j, "k", &k));
  Arg a;
  int kind = -1;
  for (int i = 0; i < 7; ++i)
    if (k == kArgKinds[i]) kind = i;
  if (kind < 0) return InvalidArgument("bad argument kind '" + k + "'");
  a.kind = static_cast<Arg::Kind>(kind);
  switch (a.kind) {
    case Arg::Kind::kTensor: KS_RETURN_IF_ERROR(Get(j, "offsets", &a.offsets)); break;
    case Arg::Kind::kScratch: case Arg::Kind::kTensorMap: KS_RETURN_IF_ERROR(Get(j, "i", &a.index)); break;
    case Arg::Kind::kI32: case Arg::Kind::kI64: KS_RETURN_IF_ERROR(Get(j, "v", &a.i)); break;
    case Arg::Kind::kF32: case Arg::Kind::kF64: KS_RETURN_IF_ERROR(Get(j, "v", &a.f)); break;
  }
  return a;
}

json LaunchToJson(const Launch& l) {
  json args = json::array();
  for (const auto& a : l.args) args.push_back(ArgToJson(a));
  json j{{"kernel", l.kernel}, {"grid", l.shape.grid}, {"block", l.shape.block},
         {"shared", l.shape.shared_bytes}, {"args", args}};
  if (l.shape.cluster) j["cluster"] = *l.shape.cluster;
  return j;
}

StatusOr<Launch> LaunchFromJson(const json& j) {
  Launch l;
  KS_RETURN_IF_ERROR(Get(j, "kernel", &l.kernel));
  KS_RETURN_IF_ERROR(Get(j, "grid", &l.shape.grid));
  KS_RETURN_IF_ERROR(Get(j, "block", &l.shape.block));
  KS_RETURN_IF_ERROR(Get(j, "shared", &l.shape.shared_bytes));
  if (j.contains("cluster")) {
    std::array<uint32_t, 3> c{};
    KS_RETURN_IF_ERROR(Get(j, "cluster", &c));
    l.shape.cluster = c;
  }
  KS_ASSIGN_OR_RETURN(l.args, GetList<Arg>(j, "args", ArgFromJson));
  return l;
}

json OccupancyToJson(const Occupancy& o) {
  json j{{"blocks_per_sm", o.blocks_per_sm}, {"threads", o.threads}, {"registers", o.registers},
         {"static_shared", o.static_shared}, {"dynamic_shared", o.dynamic_shared}};
  if (o.cluster_size) j["cluster_size"] = o.cluster_size, j["max_active_clusters"] = o.max_active_clusters;
  return j;
}

StatusOr<Occupancy> OccupancyFromJson(const json& j) {
  Occupancy o;
  KS_RETURN_IF_ERROR(Get(j, "blocks_per_sm", &o.blocks_per_sm));
  KS_RETURN_IF_ERROR(Get(j, "threads", &o.threads));
  KS_RETURN_IF_ERROR(Get(j, "registers", &o.registers));
  KS_RETURN_IF_ERROR(Get(j, "static_shared", &o.static_shared));
  KS_RETURN_IF_ERROR(Get(j, "dynamic_shared", &o.dynamic_shared));
  KS_RETURN_IF_ERROR(Get(j, "cluster_size", &o.cluster_size));
  KS_RETURN_IF_ERROR(Get(j, "max_active_clusters", &o.max_active_clusters));
  return o;
}

json Ok(json j = json::object()) {
  j["ok"] = true;
  return j;
}

}  // namespace

json ToJson(const InitRequest& m) {
  json outs = json::array();
  for (const auto& o : m.outputs)
    outs.push_back({{"offset", o.offset}, {"bytes", o.bytes}, {"width", o.poison.width}, {"pattern", o.poison.pattern}});
  return {{"cmd", InitRequest::kCmd},
          {"device", m.device},
          {"ipc", Base64Encode(m.ipc_handle)},
          {"outputs", outs},
          {"l2_flush_bytes", m.l2_flush_bytes},
          {"pad_cubin", Base64Encode(m.helper_cubin)},
          {"pad_ns", m.pad_ns},
          {"scrub_shared_bytes", m.scrub_shared_bytes},
          {"sms", m.sms},
          {"printf_fifo_bytes", m.printf_fifo_bytes}};
}

template <>
StatusOr<InitRequest> FromJson<InitRequest>(const json& j) {
  InitRequest m;
  KS_RETURN_IF_ERROR(Get(j, "device", &m.device));
  KS_ASSIGN_OR_RETURN(m.ipc_handle, GetBytes(j, "ipc"));
  KS_ASSIGN_OR_RETURN(m.outputs, GetList<OutputRegion>(j, "outputs", [](const json& o) -> StatusOr<OutputRegion> {
                        OutputRegion r;
                        KS_RETURN_IF_ERROR(Get(o, "offset", &r.offset));
                        KS_RETURN_IF_ERROR(Get(o, "bytes", &r.bytes));
                        KS_RETURN_IF_ERROR(Get(o, "width", &r.poison.width));
                        KS_RETURN_IF_ERROR(Get(o, "pattern", &r.poison.pattern));
                        return r;
                      }));
  KS_RETURN_IF_ERROR(Get(j, "l2_flush_bytes", &m.l2_flush_bytes));
  KS_ASSIGN_OR_RETURN(m.helper_cubin, GetBytes(j, "pad_cubin"));
  KS_RETURN_IF_ERROR(Get(j, "pad_ns", &m.pad_ns));
  KS_RETURN_IF_ERROR(Get(j, "scrub_shared_bytes", &m.scrub_shared_bytes));
  KS_RETURN_IF_ERROR(Get(j, "sms", &m.sms));
  KS_RETURN_IF_ERROR(Get(j, "printf_fifo_bytes", &m.printf_fifo_bytes));
  return m;
}

json ToJson(const InitReply& m) { return Ok({{"device", m.device}, {"pid", m.pid}, {"heap_bytes", m.heap_bytes}}); }

template <>
StatusOr<InitReply> FromJson<InitReply>(const json& j) {
  InitReply m;
  KS_RETURN_IF_ERROR(Get(j, "device", &m.device));
  KS_RETURN_IF_ERROR(Get(j, "pid", &m.pid));
  KS_RETURN_IF_ERROR(Get(j, "heap_bytes", &m.heap_bytes));
  return m;
}

json ToJson(const LoadRequest& m) {
  json launches = json::array(), maps = json::array(), globals = json::array();
  for (const auto& l : m.launches) launches.push_back(LaunchToJson(l));
  for (const auto& t : m.tensor_maps)
    maps.push_back({{"spec", TensorMapToJson(t.spec)}, {"offsets", t.offsets}, {"scratch", t.scratch}});
  for (const auto& g : m.globals) globals.push_back({{"name", g.name}, {"size", g.size}});
  return {{"cmd", LoadRequest::kCmd}, {"cubin", Base64Encode(m.cubin)}, {"launches", launches},
          {"scratch", m.scratch_bytes}, {"tensor_maps", maps},           {"globals", globals}};
}

template <>
StatusOr<LoadRequest> FromJson<LoadRequest>(const json& j) {
  LoadRequest m;
  KS_ASSIGN_OR_RETURN(m.cubin, GetBytes(j, "cubin"));
  KS_ASSIGN_OR_RETURN(m.launches, GetList<Launch>(j, "launches", LaunchFromJson));
  KS_RETURN_IF_ERROR(Get(j, "scratch", &m.scratch_bytes));
  KS_ASSIGN_OR_RETURN(m.tensor_maps, GetList<TensorMap>(j, "tensor_maps", [](const json& t) -> StatusOr<TensorMap> {
                        TensorMap r;
                        if (!t.is_object() || !t.contains("spec")) return InvalidArgument("tensor map without spec");
                        KS_ASSIGN_OR_RETURN(r.spec, TensorMapFromJson(t["spec"]));
                        KS_RETURN_IF_ERROR(Get(t, "offsets", &r.offsets));
                        KS_RETURN_IF_ERROR(Get(t, "scratch", &r.scratch));
                        return r;
                      }));
  KS_ASSIGN_OR_RETURN(m.globals, GetList<Global>(j, "globals", [](const json& g) -> StatusOr<Global> {
                        Global r;
                        KS_RETURN_IF_ERROR(Get(g, "name", &r.name));
                        KS_RETURN_IF_ERROR(Get(g, "size", &r.size));
                        return r;
                      }));
  return m;
}

json ToJson(const LoadReply& m) {
  json occ = json::array();
  for (const auto& o : m.occupancy) occ.push_back(OccupancyToJson(o));
  return Ok({{"globals", m.globals}, {"occupancy", occ}});
}

template <>
StatusOr<LoadReply> FromJson<LoadReply>(const json& j) {
  LoadReply m;
  KS_RETURN_IF_ERROR(Get(j, "globals", &m.globals));
  KS_ASSIGN_OR_RETURN(m.occupancy, GetList<Occupancy>(j, "occupancy", OccupancyFromJson));
  return m;
}

json ToJson(const RunRequest& m) { return {{"cmd", RunRequest::kCmd}, {"set", m.set}, {"split", m.split}}; }

template <>
StatusOr<RunRequest> FromJson<RunRequest>(const json& j) {
  RunRequest m;
  KS_RETURN_IF_ERROR(Get(j, "set", &m.set));
  KS_RETURN_IF_ERROR(Get(j, "split", &m.split));
  return m;
}

json ToJson(const RunReply& m) {
  json j = Ok({{"ms", m.ms}, {"ms_device", m.ms_device}, {"state_changed", m.state_changed}});
  if (!m.launch_ms.empty()) j["launch_ms"] = m.launch_ms;
  return j;
}

template <>
StatusOr<RunReply> FromJson<RunReply>(const json& j) {
  RunReply m;
  KS_RETURN_IF_ERROR(Get(j, "ms", &m.ms));
  m.ms_device = m.ms;
  KS_RETURN_IF_ERROR(Get(j, "ms_device", &m.ms_device));
  KS_RETURN_IF_ERROR(Get(j, "state_changed", &m.state_changed));
  KS_RETURN_IF_ERROR(Get(j, "launch_ms", &m.launch_ms));
  return m;
}

json ToJson(const WarmRequest& m) {
  return {{"cmd", WarmRequest::kCmd}, {"runs", m.runs}, {"sets", m.sets}, {"first_set", m.first_set}};
}

template <>
StatusOr<WarmRequest> FromJson<WarmRequest>(const json& j) {
  WarmRequest m;
  KS_RETURN_IF_ERROR(Get(j, "runs", &m.runs));
  KS_RETURN_IF_ERROR(Get(j, "sets", &m.sets));
  KS_RETURN_IF_ERROR(Get(j, "first_set", &m.first_set));
  return m;
}

json ToJson(const WarmReply& m) { return Ok({{"runs", m.runs}, {"state_changed", m.state_changed}}); }

template <>
StatusOr<WarmReply> FromJson<WarmReply>(const json& j) {
  WarmReply m;
  KS_RETURN_IF_ERROR(Get(j, "runs", &m.runs));
  KS_RETURN_IF_ERROR(Get(j, "state_changed", &m.state_changed));
  return m;
}

json ToJson(const UnloadRequest&) { return {{"cmd", UnloadRequest::kCmd}}; }
json ToJson(const QuitRequest&) { return {{"cmd", QuitRequest::kCmd}}; }
json ToJson(const EmptyReply&) { return Ok(); }
template <>
StatusOr<UnloadRequest> FromJson<UnloadRequest>(const json&) { return UnloadRequest{}; }
template <>
StatusOr<QuitRequest> FromJson<QuitRequest>(const json&) { return QuitRequest{}; }
template <>
StatusOr<EmptyReply> FromJson<EmptyReply>(const json&) { return EmptyReply{}; }

json ToJson(const ErrorReply& m) {
  return {{"ok", false}, {"status", m.status}, {"message", m.message}, {"fatal", m.fatal}};
}

template <>
StatusOr<ErrorReply> FromJson<ErrorReply>(const json& j) {
  ErrorReply m;
  KS_RETURN_IF_ERROR(Get(j, "status", &m.status));
  KS_RETURN_IF_ERROR(Get(j, "message", &m.message));
  KS_RETURN_IF_ERROR(Get(j, "fatal", &m.fatal));
  return m;
}

json ToJson(const CompileRequest& m) {
  return {{"cmd", CompileRequest::kCmd}, {"source", m.source}, {"arch", m.arch}, {"cuda_home", m.cuda_home}};
}

template <>
StatusOr<CompileRequest> FromJson<CompileRequest>(const json& j) {
  CompileRequest m;
  KS_RETURN_IF_ERROR(Get(j, "source", &m.source));
  KS_RETURN_IF_ERROR(Get(j, "arch", &m.arch));
  KS_RETURN_IF_ERROR(Get(j, "cuda_home", &m.cuda_home));
  return m;
}

json ToJson(const CompileReply& m) {
  json j{{"ok", m.ok}, {"message", m.message}, {"log", m.log}, {"seconds", m.seconds}};
  if (m.ok) {
    j["cubin_b64"] = Base64Encode(m.cubin);
    j["ptx"] = m.ptx;
  }
  return j;
}

template <>
StatusOr<CompileReply> FromJson<CompileReply>(const json& j) {
  CompileReply m;
  KS_RETURN_IF_ERROR(Get(j, "ok", &m.ok));
  KS_RETURN_IF_ERROR(Get(j, "message", &m.message));
  KS_RETURN_IF_ERROR(Get(j, "log", &m.log));
  KS_RETURN_IF_ERROR(Get(j, "seconds", &m.seconds));
  KS_ASSIGN_OR_RETURN(m.cubin, GetBytes(j, "cubin_b64"));
  KS_RETURN_IF_ERROR(Get(j, "ptx", &m.ptx));
  return m;
}

std::string CommandOf(const json& request) {
  return request.is_object() && request.contains("cmd") && request["cmd"].is_string() ? request["cmd"].get<std::string>()
                                                                                       : "";
}

std::optional<ErrorReply> ErrorOf(const json& reply) {
  if (reply.is_object() && reply.value("ok", false)) return std::nullopt;
  auto e = FromJson<ErrorReply>(reply);
  if (!e.ok()) return ErrorReply{"internal", "unreadable worker reply: " + e.status().message(), false};
  return *e;
}

}  // namespace ks::wire
