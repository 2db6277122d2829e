// Kept resident references (issue 33, `--keep-reference`; kept_reference.h)
// without a GPU: the caller's side against the real serving loop
// (ks_bridge/keeper.py, run by fixtures/fake_keeper.py with a manifest whose
// IPC handles are never opened): a lease, what it holds, status, release,
// a killed bridge's socket, a manifest the caller rejects, the bridge's
// arguments, and the CLI (`cache kept`, `cache release`, a bad
// --keep-reference). The GPU side (a real kept bridge leased by a second
// evaluation) is GpuEvalTest.AKeptReferenceIsLeasedByTheNextCommand.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/problem.h"
#include "evaluator/reference/bridge_internal.h"
#include "evaluator/reference/kept_reference.h"
#include "evaluator/signature.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// A resident manifest of tiny.py: x (float32 [4]) -> out (float32 [4]), one set.
json TinyManifest(bool with_ipc = true) {
  Signature sig;
  sig.file = "tiny.py";
  TensorSpec x, out;
  x.name = "x";
  x.shape = {4};
  out.name = "out";
  out.shape = {4};
  sig.inputs = {x};
  sig.outputs = {out};
  const std::string handle = Base64Encode(std::string(64, '\x07'));
  json set = {{"seed", 43}};
  if (with_ipc)
    set["ipc"] = {{"x", {{"handle", handle}, {"offset", 0}, {"bytes", 16}}},
                  {"out", {{"handle", handle}, {"offset", 256}, {"bytes", 16}}}};
  return {{"resident", true}, {"signature", SignatureToJson(sig)}, {"sets", json::array({set})},
          {"pci_bus_id", "0000:01:00.0"}, {"problem", "/somewhere/tiny.py"}, {"warnings", json::array()}};
}

// fake_keeper.py serving `manifest` at `socket` until stopped or idle for keep_s.
class FakeKeeper {
 public:
  FakeKeeper(const fs::path& dir, const json& manifest, const std::string& socket, double keep_s = 30) {
    const std::string manifest_path = (dir / "manifest.json").string();
    KS_CHECK(WriteFile(manifest_path, manifest.dump()).ok());
    auto python = FindOnPath("python3");
    KS_CHECK(python.has_value());
    auto child = ChildProcess::Start({*python, testing::SourcePath("tests/evaluator/fixtures/fake_keeper.py"),
                                      manifest_path, socket, std::to_string(keep_s)},
                                     {{"PYTHONDONTWRITEBYTECODE", "1"}}, "");
    KS_CHECK(child.ok());
    child_ = std::move(child).value();
    char c = 0;
    std::string line;
    while (ReadExact(child_.stdout_fd(), &c, 1, 20).ok() && c != '\n') line += c;
    ready_ = line == "ready";
  }
  bool ready() const { return ready_; }
  pid_t pid() const { return child_.pid(); }
  // Whether it exits within `seconds`.
  bool Exits(double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (child_.TryReap()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  ChildProcess child_;
  bool ready_ = false;
};

class KeptReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto path = KeptSocketPath(tmp_.path().string(), "tiny", "0123456789abcdef0123");
    ASSERT_TRUE(path.ok()) << path.status().message();
    socket_ = *path;
  }
  testing::TempDir tmp_{"ks-kept-"};
  std::string socket_;
};

TEST_F(KeptReferenceTest, ALeaseGetsTheKeptManifestAndHoldsTheBridgeUntilReleased) {
  EXPECT_EQ(fs::path(socket_).filename(), "tiny-0123456789abcdef.sock");
  struct stat st{};
  ASSERT_EQ(stat((tmp_.path() / "kept").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u) << "only this user reaches the sockets";
  auto none = bridge_internal::LeaseKeptReference(socket_, "tiny.py", 5);
  EXPECT_EQ(none.status().code(), Code::kNotFound);

  FakeKeeper keeper(tmp_.path(), TinyManifest(), socket_);
  ASSERT_TRUE(keeper.ready());
  {
    auto leased = bridge_internal::LeaseKeptReference(socket_, "tiny.py", 5);
    ASSERT_TRUE(leased.ok()) << leased.status().message();
    ReferenceData& d = leased->first;
    ASSERT_NE(d.resident, nullptr);
    ASSERT_TRUE(d.resident->kept().has_value());
    EXPECT_TRUE(d.resident->kept()->leased);
    EXPECT_EQ(d.resident->kept()->pid, keeper.pid());
    EXPECT_EQ(d.resident->pid(), keeper.pid());
    EXPECT_EQ(d.resident->kept()->gpu_bytes, 4096u);
    EXPECT_TRUE(d.resident->Alive());
    EXPECT_EQ(d.resident->pci_bus_id(), "0000:01:00.0");
    ASSERT_EQ(d.sets.size(), 1u);
    EXPECT_EQ(d.sets[0].seed, 43u);
    auto out = d.resident->At(0, "out");
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(out->offset, 256u);
    EXPECT_EQ(out->handle, std::string(64, '\x07'));
    EXPECT_NE(DescribeKept(*d.resident->kept()).find("leased from the one kept on the GPU"), std::string::npos);

    auto listed = ListKeptReferences(tmp_.path().string());
    ASSERT_TRUE(listed.ok()) << listed.status().message();
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ((*listed)[0].leases, 1);
    EXPECT_EQ((*listed)[0].pid, keeper.pid());
    EXPECT_EQ((*listed)[0].problem, "/somewhere/tiny.py");
    EXPECT_FALSE((*listed)[0].expires_in_s.has_value()) << "a lease is open";
  }
  // The lease ended with the reference data: the bridge waits for the next command.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto listed = ListKeptReferences(tmp_.path().string());
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].leases, 0);
  EXPECT_EQ((*listed)[0].leases_served, 1);
  ASSERT_TRUE((*listed)[0].expires_in_s.has_value());
  EXPECT_GT(*(*listed)[0].expires_in_s, 20);

  auto other = StopKeptReferences(tmp_.path().string(), "other.py");
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->empty()) << "only the named problem's";
  auto stopped = StopKeptReferences(tmp_.path().string(), "tiny.py");
  ASSERT_TRUE(stopped.ok());
  ASSERT_EQ(stopped->size(), 1u);
  EXPECT_TRUE((*stopped)[0].stopping);
  EXPECT_TRUE(keeper.Exits(5));
  EXPECT_FALSE(fs::exists(socket_));
  EXPECT_TRUE(ListKeptReferences(tmp_.path().string())->empty());
}

TEST_F(KeptReferenceTest, AKilledBridgesSocketIsRemovedAndTheReferenceComputedAgain) {
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, socket_.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(fd);  // the file stays and nobody listens: what a killed bridge leaves
  ASSERT_TRUE(fs::exists(socket_));
  auto leased = bridge_internal::LeaseKeptReference(socket_, "tiny.py", 5);
  EXPECT_EQ(leased.status().code(), Code::kUnavailable) << leased.status().message();
  EXPECT_FALSE(fs::exists(socket_)) << "removed, so the next bridge may claim it";
  EXPECT_TRUE(ListKeptReferences(tmp_.path().string())->empty());
  EXPECT_TRUE(bridge_internal::StopKeptReferenceAt(socket_).ok());
}

TEST_F(KeptReferenceTest, AKeptBridgeWithABadManifestIsNotUsed) {
  FakeKeeper keeper(tmp_.path(), TinyManifest(/*with_ipc=*/false), socket_);
  ASSERT_TRUE(keeper.ready());
  auto leased = bridge_internal::LeaseKeptReference(socket_, "tiny.py", 5);
  ASSERT_FALSE(leased.ok());
  EXPECT_EQ(leased.status().code(), Code::kInvalidArgument);
  EXPECT_NE(leased.status().message().find("a set has no 'ipc'"), std::string::npos) << leased.status().message();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto listed = ListKeptReferences(tmp_.path().string());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].leases, 0) << "the refused lease was given back";
  ASSERT_TRUE(bridge_internal::StopKeptReferenceAt(socket_).ok());
  EXPECT_TRUE(keeper.Exits(5));
}

TEST_F(KeptReferenceTest, AnIdleKeptBridgeExitsAfterItsKeepTime) {
  FakeKeeper keeper(tmp_.path(), TinyManifest(), socket_, /*keep_s=*/1.0);
  ASSERT_TRUE(keeper.ready());
  {
    auto leased = bridge_internal::LeaseKeptReference(socket_, "tiny.py", 5);
    ASSERT_TRUE(leased.ok()) << leased.status().message();
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    EXPECT_TRUE(leased->first.resident->Alive()) << "an open lease keeps it past its keep time";
  }
  EXPECT_TRUE(keeper.Exits(5));
  EXPECT_FALSE(fs::exists(socket_));
}

TEST_F(KeptReferenceTest, AnOutOfMemoryErrorNamesTheKeptReferences) {
  const std::string dir = tmp_.path().string();
  const Status oom = Internal("big.py: reference bridge failed: OutOfMemoryError: CUDA out of memory.");
  EXPECT_EQ(WithKeptMemoryHint(oom, dir).message(), oom.message()) << "none kept: as it is";
  FakeKeeper keeper(tmp_.path(), TinyManifest(), socket_);
  ASSERT_TRUE(keeper.ready());
  const Status hinted = WithKeptMemoryHint(oom, dir);
  EXPECT_EQ(hinted.code(), Code::kInternal);
  EXPECT_NE(hinted.message().find("1 reference(s) kept on a GPU by --keep-reference hold 0.0 GiB (pid " +
                                  std::to_string(keeper.pid()) + ": /somewhere/tiny.py); `kernelsearch cache release "
                                  "--cache-dir " + dir + "` frees them"),
            std::string::npos)
      << hinted.message();
  const Status short_sets = ResourceExhausted("p.py: 2 set(s) need 78.0 GiB of GPU memory");
  EXPECT_NE(WithKeptMemoryHint(short_sets, dir).message().find("kept on a GPU"), std::string::npos);
  const Status other = InvalidArgument("p.py: line 3: syntax error");
  EXPECT_EQ(WithKeptMemoryHint(other, dir).message(), other.message()) << "not about memory: as it is";
  ASSERT_TRUE(bridge_internal::StopKeptReferenceAt(socket_).ok());
  EXPECT_TRUE(keeper.Exits(5));
}

TEST(KeptReferenceArgs, TheBridgeIsToldToStayOnlyWhenItMayStayAndKeepIsAsked) {
  ReferenceOptions o;
  o.keep_s = 600;
  auto has = [](const std::vector<std::string>& args, const std::string& a) {
    return std::find(args.begin(), args.end(), a) != args.end();
  };
  auto kept = bridge_internal::ReferenceArgs("p.py", o, true, 1 << 30, /*may_stay=*/true, "", "/c/kept/p-1.sock");
  EXPECT_TRUE(has(kept, "--keep"));
  EXPECT_TRUE(has(kept, "/c/kept/p-1.sock"));
  EXPECT_FALSE(has(bridge_internal::ReferenceArgs("p.py", o, true, 1 << 30, false, "", "/c/kept/p-1.sock"), "--keep"));
  o.keep_s = 0;
  EXPECT_FALSE(has(bridge_internal::ReferenceArgs("p.py", o, true, 1 << 30, true, "", "/c/kept/p-1.sock"), "--keep"));
}

TEST(KeptReferenceArgs, DurationsAndSocketPaths) {
  EXPECT_DOUBLE_EQ(*ParseKeepDuration("600"), 600);
  EXPECT_DOUBLE_EQ(*ParseKeepDuration("90s"), 90);
  EXPECT_DOUBLE_EQ(*ParseKeepDuration("10m"), 600);
  EXPECT_DOUBLE_EQ(*ParseKeepDuration("1.5h"), 5400);
  EXPECT_DOUBLE_EQ(*ParseKeepDuration("0"), 0);
  for (const char* bad : {"", "ten", "10x", "-5", "25h", "nan"})
    EXPECT_EQ(ParseKeepDuration(bad).status().code(), Code::kInvalidArgument) << bad;
  testing::TempDir tmp("ks-kept-");
  const std::string deep = (tmp.path() / std::string(90, 'd')).string();
  auto path = KeptSocketPath(deep, "a_long_problem_name_of_forty_characters__", "0123456789abcdef");
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(path.status().message().find("shorter --cache-dir"), std::string::npos);
  KeptInfo k;
  k.pid = 42;
  k.socket = "/c/kept/p.sock";
  k.keep_s = 600;
  k.gpu_bytes = 3ull << 30;
  EXPECT_EQ(DescribeKept(k), "the reference stays on the GPU for the next command (bridge pid 42, 3.0 GiB, until 10 "
                             "min without a command); `kernelsearch cache release` frees it now");
  KeptInfo d;
  d.declined = "another kept reference of this problem is alive (/c/kept/p.sock)";
  EXPECT_EQ(DescribeKept(d), "the reference is not kept: " + d.declined);
}

// The CLI around it: `cache kept`, `cache release`, and a bad duration.
SubprocessResult Cli(const std::vector<std::string>& args) {
  SubprocessOptions o;
  o.argv = {KS_CLI_BINARY};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.timeout_s = 60;
  auto r = RunSubprocess(o);
  KS_CHECK(r.ok());
  return *r;
}

TEST_F(KeptReferenceTest, TheCliListsAndReleasesKeptReferences) {
  const std::string dir = tmp_.path().string();
  auto empty = Cli({"cache", "kept", "--cache-dir", dir});
  EXPECT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_NE(empty.out.find("no reference is kept on a GPU"), std::string::npos) << empty.out;
  FakeKeeper keeper(tmp_.path(), TinyManifest(), socket_);
  ASSERT_TRUE(keeper.ready());
  auto listed = Cli({"cache", "kept", "--cache-dir", dir});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("/somewhere/tiny.py"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find(std::to_string(keeper.pid())), std::string::npos) << listed.out;
  auto j = json::parse(Cli({"cache", "kept", "--cache-dir", dir, "--json"}).out);
  ASSERT_EQ(j["kept"].size(), 1u);
  EXPECT_EQ(j["kept"][0]["gpu_bytes"], 4096);
  auto released = Cli({"cache", "release", "tiny.py", "--cache-dir", dir});
  EXPECT_EQ(released.exit_code, 0) << released.err;
  EXPECT_NE(released.out.find("released /somewhere/tiny.py"), std::string::npos) << released.out;
  EXPECT_TRUE(keeper.Exits(5));
  auto bad = Cli({"eval", testing::SourcePath("tests/evaluator/fixtures/matmul.py"), dir, "--keep-reference",
                  "ten minutes", "--cache-dir", dir});
  EXPECT_EQ(bad.exit_code, 2) << bad.err;
  EXPECT_NE(bad.err.find("--keep-reference: 'ten minutes' is not a duration"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace ks
