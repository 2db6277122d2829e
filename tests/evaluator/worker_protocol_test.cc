// The evaluator <-> worker protocol (evaluator/worker/worker_protocol.h): every
// message survives its encoding, the framing carries it through a pipe, and
// malformed messages are refused with the field named, never thrown.
#include "evaluator/worker/worker_protocol.h"

#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ks::wire {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

template <typename T>
void ExpectRoundTrip(const T& m) {
  json j = ToJson(m);
  // Through text, as on the wire.
  auto back = FromJson<T>(json::parse(j.dump()));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_TRUE(*back == m) << j.dump();
}

TensorMapSpec AMap() {
  TensorMapSpec s;
  s.name = "tmA";
  s.tensor = "A";
  s.target_bytes = 8192 * 8192 * 2;
  s.dtype = TmaDataType::kBFloat16;
  s.rank = 2;
  s.dims = {8192, 8192, 0, 0, 0};
  s.byte_strides = {16384, 0, 0, 0};
  s.box = {64, 128, 0, 0, 0};
  s.element_strides = {1, 1, 0, 0, 0};
  s.swizzle = TmaSwizzle::k128B;
  s.l2_promotion = TmaL2Promotion::k256B;
  return s;
}

TEST(WorkerProtocolTest, InitRoundTrips) {
  InitRequest m;
  m.device = 1;
  m.ipc_handle = std::string("\x00\x01\xff binary", 10);
  m.outputs = {{4096, 1024, {4, 0x7FA5A5A5u}}, {8192, 64, {2, 0x7FA5u}}};
  m.l2_flush_bytes = 100 << 20;
  m.helper_cubin = std::string("\x7f" "ELF\x00\x01", 6);
  m.pad_ns = 100000;
  m.scrub_shared_bytes = 232448;
  m.sms = 132;
  ExpectRoundTrip(m);
  ExpectRoundTrip(InitReply{"NVIDIA H100 80GB HBM3", 4242, 4096});
}

TEST(WorkerProtocolTest, LoadRoundTripsWithEveryArgumentKindAndATensorMap) {
  LoadRequest m;
  m.cubin = std::string("\x7f" "ELF", 4);
  Launch l;
  l.kernel = "gemm";
  l.shape.grid = {64, 32, 1};
  l.shape.block = {384, 1, 1};
  l.shape.shared_bytes = 200 * 1024;
  l.shape.cluster = std::array<uint32_t, 3>{2, 1, 1};
  Arg t{Arg::Kind::kTensor, {256, 65792}, 0, 0, 0};
  Arg s{Arg::Kind::kScratch, {}, 1, 0, 0};
  Arg tm{Arg::Kind::kTensorMap, {}, 0, 0, 0};
  Arg i32{Arg::Kind::kI32, {}, 0, -7, 0};
  Arg i64{Arg::Kind::kI64, {}, 0, int64_t{1} << 40, 0};
  Arg f32{Arg::Kind::kF32, {}, 0, 0, 0.5};
  Arg f64{Arg::Kind::kF64, {}, 0, 0, 1e-300};
  l.args = {t, s, tm, i32, i64, f32, f64};
  m.launches = {l};
  Launch plain = l;
  plain.shape.cluster.reset();
  m.launches.push_back(plain);
  m.scratch_bytes = {16, 1 << 20};
  m.tensor_maps = {TensorMap{AMap(), {256, 65792}, -1}};
  TensorMap scratch_map{AMap(), {}, 1};
  scratch_map.spec.scratch = true;
  m.tensor_maps.push_back(scratch_map);
  m.globals = {{"counter", 4}};
  ExpectRoundTrip(m);
  LoadReply r;
  r.globals = 1;
  r.occupancy = {Occupancy{1, 384, 168, 0, 200 * 1024, 2, 66}, Occupancy{}};
  ExpectRoundTrip(r);
}

TEST(WorkerProtocolTest, RunsAndTheRest) {
  ExpectRoundTrip(RunRequest{3, true});
  ExpectRoundTrip(RunReply{1.25, 1.5, {"counter"}, {0.5, 0.75}});
  ExpectRoundTrip(WarmRequest{40, 3, 2});
  ExpectRoundTrip(WarmReply{40, {}});
  ExpectRoundTrip(UnloadRequest{});
  ExpectRoundTrip(QuitRequest{});
  ExpectRoundTrip(ErrorReply{"invalid_plan", "tensor_maps[0] (tmA): the driver refuses the map", false});
  ExpectRoundTrip(CompileRequest{"extern \"C\" __global__ void k() {}", "sm_90a", "/usr/local/cuda"});
  ExpectRoundTrip(CompileReply{true, "", "ptxas info: ...", 0.25, std::string("\x7f" "ELF\x00", 5), ".entry k"});
  ExpectRoundTrip(CompileReply{false, "error: expected ';'", "log", 0.1, "", ""});
}

TEST(WorkerProtocolTest, CommandsAndErrorsAreRecognized) {
  EXPECT_EQ(CommandOf(ToJson(LoadRequest{})), "load");
  EXPECT_EQ(CommandOf(ToJson(RunRequest{})), "run");
  EXPECT_EQ(CommandOf(json{{"x", 1}}), "");
  EXPECT_FALSE(ErrorOf(ToJson(RunReply{})).has_value());
  auto e = ErrorOf(ToJson(ErrorReply{"launch_error", "boom", true}));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, "launch_error");
  EXPECT_TRUE(e->fatal);
  // A reply that is not even an object is an error too, not a crash.
  auto junk = ErrorOf(json::array());
  ASSERT_TRUE(junk.has_value());
  EXPECT_EQ(junk->status, "internal");
}

TEST(WorkerProtocolTest, MalformedMessagesNameTheField) {
  json j = ToJson(RunRequest{1, false});
  j["set"] = "one";
  auto r = FromJson<RunRequest>(j);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("\"set\""));
  json l = ToJson(LoadRequest{});
  l["launches"] = {{{"kernel", "k"}, {"args", {{{"k", "pointer"}}}}}};
  auto lr = FromJson<LoadRequest>(l);
  ASSERT_FALSE(lr.ok());
  EXPECT_THAT(lr.status().message(), HasSubstr("bad argument kind 'pointer'"));
  json c = ToJson(LoadRequest{});
  c["cubin"] = "!!not base64!!";
  EXPECT_FALSE(FromJson<LoadRequest>(c).ok());
}

TEST(WorkerProtocolTest, FramingCarriesAMessageThroughAPipe) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  RunReply m{2.5, 2.75, {}, {1.0, 1.5}};
  ASSERT_TRUE(SendMessage(fds[1], ToJson(m)).ok());
  auto got = ReceiveMessage(fds[0], 5);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  auto back = FromJson<RunReply>(*got);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, m);
  close(fds[1]);
  EXPECT_FALSE(ReceiveMessage(fds[0], 5).ok());  // EOF
  close(fds[0]);
}

}  // namespace
}  // namespace ks::wire
