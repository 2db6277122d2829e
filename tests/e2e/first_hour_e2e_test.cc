// Issue 22: a user's first hour, as a user meets it, with the real binaries.
//  - the model side of a split search never runs a problem on real data (a
//    problem whose inputs would take 25 GB gets its search and first round);
//  - a search whose every model call failed, or whose model answers prose, is
//    `failed` with the reason and exits non-zero; the first resumes with
//    another --model and finishes;
//  - the server: a second `serve` on a used port fails naming the address;
//    `cancel` answers once the search stopped, says so, and no model call
//    starts after it; a degenerate problem submitted to it is stopped by the
//    GPU side's check with the CLI's message;
//  - browsing a store that does not exist says so instead of creating it.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/problem.h"
#include "server/client.h"
#include "store/lineage_store.h"
#include "tests/e2e/server_harness.h"
#include "tests/testing/copy_problem.h"
#include "tests/testing/fake_model.h"
#include "tests/testing/paths.h"
#include "tests/testing/skip.h"
#include "tests/testing/temp_dir.h"

namespace ks::e2e {
namespace {

namespace pb = ::kernelsearch::v1;
namespace fs = std::filesystem;
using store::LineageStore;
using store::SearchStatus;

const std::string kBinary = ks::testing::CliBinary();
const std::string kModel = ks::testing::FakeModelCommand();

class FirstHourTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string Write(const std::string& name, const std::string& text) {
    EXPECT_TRUE(WriteFile(Path(name), text).ok());
    return Path(name);
  }
  SubprocessResult Run(std::vector<std::string> argv, double timeout_s = 300) {
    SubprocessOptions o;
    o.argv = std::move(argv);
    o.timeout_s = timeout_s;
    auto r = RunSubprocess(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }
  // The copy problem with a --signature file (no torch needed).
  std::vector<std::string> CopyProblem() { return ks::testing::WriteCopyProblem(dir_.path()).Args(); }
  std::string FakeEvaluator() { return "fake:" + Write("eval.json", R"({"eager_ms": 2.0})"); }

  ks::testing::TempDir dir_{"ks_first_hour_", ks::testing::TempDir::OnFailure::kKeep};
};

TEST_F(FirstHourTest, GenerateOnlyNeverRunsTheProblemOnData) {
  KS_REQUIRE_TORCH();
  // 80000 x 80000 float32 inputs: 25.6 GB, more than this machine's memory.
  std::string py = Write("huge.py", "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                                    "        return torch.relu(x)\n\ndef get_inputs():\n"
                                    "    return [torch.randn(80000, 80000)]\n\ndef get_init_inputs():\n    return []\n");
  auto t0 = std::chrono::steady_clock::now();
  SubprocessResult r = Run({kBinary, "search", py, "--generate-only", "--db", Path("split.db"), "--model", kModel,
                            "--rounds", "0", "--branches", "1", "--repair", "0", "--gpu", "NVIDIA H100 80GB HBM3"},
                           240);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(r.Succeeded()) << r.Describe() << "\nstderr: " << r.err;
  EXPECT_LT(seconds, 120) << "the model side ran the problem?";
  // The id comes first, and the slow phase said what it was doing.
  EXPECT_NE(r.err.find("search 1 (resume with --resume 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("meta device"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("candidates pending"), std::string::npos) << r.out;
  auto store = LineageStore::Open(Path("split.db"));
  ASSERT_TRUE(store.ok());
  auto pending = (*store)->PendingCandidates(1);
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(pending->size(), 1u);
  // The first round's prompt already states an H100's datasheet figures.
  auto calls = (*store)->ListLlmCalls(1, false);
  ASSERT_TRUE(calls.ok() && !calls->empty());
  const std::string& prompt = calls->front().record.prompt;
  EXPECT_NE(prompt.find("132 SMs (datasheet figures"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("Memory bandwidth (datasheet peak): 3350 GB/s"), std::string::npos) << prompt;
  EXPECT_EQ(prompt.find("unknown SMs"), std::string::npos) << prompt;
}

TEST_F(FirstHourTest, EveryCallFailedIsAFailedSearchThatResumesWithAnotherModel) {
  const std::string db = Path("fail.db");
  const std::string broken = "command:/bin/sh " + Write("broken.sh", "echo 'HTTP 401 invalid api key' >&2\nexit 1\n");
  std::vector<std::string> args = {kBinary, "search"};
  for (const auto& a : CopyProblem()) args.push_back(a);
  for (const char* a : {"--rounds", "1", "--ideas", "1", "--branches", "2", "--beam", "1", "--repair", "0", "--db"})
    args.push_back(a);
  args.insert(args.end(), {db, "--model", broken, "--evaluator", FakeEvaluator()});
  SubprocessResult r = Run(args);
  EXPECT_EQ(r.exit_code, 3) << r.Describe() << "\nstderr: " << r.err;
  EXPECT_NE(r.out.find("search 1: failed (no kernel in round 0: every model call failed (2)"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("no correct kernel: the search failed; resume it"), std::string::npos) << r.out;
  {
    auto store = LineageStore::Open(db);
    ASSERT_TRUE(store.ok());
    EXPECT_EQ((*store)->GetSearch(1)->status, SearchStatus::kFailed);
    // It stopped at the failed round, not after spending every round.
    EXPECT_EQ((*store)->ListLlmCalls(1, false)->size(), 2u);
  }
  SubprocessResult h = Run({kBinary, "history", "--db", db});
  EXPECT_NE(h.out.find("failed: no kernel in round 0"), std::string::npos) << h.out;

  // Another model: the search goes on from a new round; the failed round does
  // not count toward --rounds (1 improvement round after the first kernel).
  // (The stand-in model with its scripted-incorrect kernels made correct: which
  // of its kernels fail follows a hash of the prompt's text, and the search
  // keeps --repair 0.)
  const std::string always_correct =
      "command:/bin/sh " + Write("correct_model.sh", "KS_FAKE_MODEL_CORRECT=1 exec /bin/sh '" +
                                                         ks::testing::SourcePath("tests/testing/fake_model.sh") + "'\n");
  SubprocessResult resumed = Run({kBinary, "search", "--resume", "1", "--db", db, "--model", always_correct,
                                  "--evaluator", FakeEvaluator(), "--quiet"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.Describe() << "\nstderr: " << resumed.err;
  EXPECT_NE(resumed.out.find("search 1: finished (rounds)"), std::string::npos) << resumed.out;
  EXPECT_NE(resumed.out.find("best: candidate"), std::string::npos) << resumed.out;
  auto store = LineageStore::Open(db);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->GetSearch(1)->status, SearchStatus::kFinished);
  EXPECT_EQ((*store)->LastRound(1)->value().round, 2);  // the failed round 0, then rounds 1 and 2
  SubprocessResult h2 = Run({kBinary, "history", "--db", db, "--json"});
  auto arr = nlohmann::json::parse(h2.out, nullptr, false);
  ASSERT_TRUE(arr.is_array() && !arr.empty()) << h2.out;
  EXPECT_EQ(arr[0].value("rounds", -1), 2);
  EXPECT_EQ(arr[0].value("rounds_asked", -1), 1);
}

TEST_F(FirstHourTest, AModelThatAnswersProseFailsSayingNoKernel) {
  const std::string db = Path("prose.db");
  const std::string prose = "command:/bin/sh " + Write("prose.sh", "cat >/dev/null\necho 'I would rather not.'\n");
  std::vector<std::string> args = {kBinary, "search"};
  for (const auto& a : CopyProblem()) args.push_back(a);
  args.insert(args.end(), {"--rounds", "2", "--branches", "2", "--repair", "0", "--db", db, "--model", prose,
                           "--evaluator", FakeEvaluator(), "--quiet"});
  SubprocessResult r = Run(args);
  EXPECT_EQ(r.exit_code, 1) << r.Describe() << "\nstderr: " << r.err;
  EXPECT_NE(r.out.find("held no parsable candidate"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no correct kernel"), std::string::npos) << r.out;
  auto store = LineageStore::Open(db);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->GetSearch(1)->status, SearchStatus::kFailed);
  EXPECT_EQ((*store)->ListLlmCalls(1, false)->size(), 2u);  // round 0 only
}

// torch.rand inside forward: no single reference. The GPU side (the fake
// evaluator checking with the real bridge) stops the search before any model
// call, recorded failed with the bridge's reason.
TEST_F(FirstHourTest, ANondeterministicForwardIsStoppedOnTheGpuSide) {
  KS_REQUIRE_TORCH();
  std::string py = Write("noisy.py", "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                                     "        return x + torch.rand_like(x)\n\ndef get_inputs():\n"
                                     "    return [torch.randn(256)]\n\ndef get_init_inputs():\n    return []\n");
  std::string fake = "fake:" + Write("check.json", R"({"check_reference": true})");
  const std::string calls = Path("calls.log");
  const std::string model = "command:/bin/sh " + Write("count.sh", "cat >/dev/null; echo x >> " + calls + "; echo hi\n");
  SubprocessResult r = Run({kBinary, "search", py, "--db", Path("noisy.db"), "--model", model, "--evaluator", fake});
  EXPECT_EQ(r.exit_code, 2) << r.Describe() << "\nstderr: " << r.err;
  EXPECT_NE(r.err.find("not deterministic"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(calls)) << "a model call was made";
  auto store = LineageStore::Open(Path("noisy.db"));
  ASSERT_TRUE(store.ok());
  auto search = (*store)->GetSearch(1);
  ASSERT_TRUE(search.ok());
  EXPECT_EQ(search->status, SearchStatus::kFailed);
  EXPECT_NE(search->stop_reason.find("the reference cannot judge kernels: "), std::string::npos) << search->stop_reason;
}

TEST_F(FirstHourTest, BrowsingAStoreThatDoesNotExistSaysSo) {
  const std::string db = Path("typo.db");
  for (const char* cmd : {"history", "best"}) {
    std::vector<std::string> argv = {kBinary, cmd, "--db", db};
    if (std::string(cmd) == "best") argv.push_back("copy");
    SubprocessResult r = Run(argv);
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_NE(r.err.find("no lineage store at " + db), std::string::npos) << cmd << ": " << r.err;
  }
  EXPECT_FALSE(fs::exists(db));
}

TEST(FirstHourServer, ASecondServeOnAUsedPortFailsNamingTheAddress) {
  ServerHarness h;
  h.Start();
  SubprocessOptions o;
  o.argv = {kBinary, "serve", "--listen", h.address(), "--token-file", h.Path("token"), "--db", h.Path("other.db"),
            "--model", "command:cat", "--evaluator", "fake"};
  o.timeout_s = 60;  // a server that wrongly starts is killed, and the test fails below
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->timed_out) << "a second server listened on " << h.address() << ": " << r->out;
  EXPECT_NE(r->exit_code, 0) << r->Describe();
  EXPECT_NE(r->err.find("cannot listen on " + h.address() + ": the address is in use"), std::string::npos) << r->err;
  EXPECT_EQ(r->out.find("listening on"), std::string::npos) << r->out;
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

TEST(FirstHourServer, CancelAnswersOnceStoppedAndNoModelCallStartsAfterIt) {
  ServerHarness h({.llm_sleep_s = 0.4});
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  pb::StartSearchRequest req;
  req.set_problem_id(std::to_string(problem));
  req.mutable_config()->set_rounds(20);
  req.mutable_config()->set_ideas_per_round(2);
  req.mutable_config()->set_branches(2);
  req.mutable_config()->set_beam(2);
  auto started = c->StartSearch(req);
  ASSERT_TRUE(started.ok()) << started.status().ToString() << h.Log();
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (h.LlmCallsStarted() < 6 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_GE(h.LlmCallsStarted(), 6u) << h.Log();

  SubprocessOptions o;
  o.argv = {kBinary, "cancel", started->search_id(), "--server", h.address(), "--token-file", h.Path("token")};
  o.timeout_s = 120;
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code, 0) << r->Describe() << r->err;
  EXPECT_NE(r->out.find("search " + started->search_id() + " cancelled: no model call was made after the cancel"),
            std::string::npos)
      << r->out;
  const size_t at_cancel = h.LlmCallsStarted();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(h.LlmCallsStarted(), at_cancel) << "model calls started after cancel returned";
  pb::GetSearchRequest get;
  get.set_search_id(started->search_id());
  auto info = c->GetSearch(get);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->state(), pb::CANCELLED) << info->DebugString();
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

TEST(FirstHourServer, ADegenerateProblemSubmittedIsStoppedWithTheCliMessage) {
  KS_REQUIRE_TORCH();
  // The fake evaluator stands for the server's GPU: it checks the reference
  // with the real bridge, as the GPU evaluator does while preparing it.
  ServerHarness h({.check_reference = true});
  h.Start();
  auto c = h.Connect();
  pb::SubmitProblemRequest submit;
  submit.set_name("zeros");
  submit.set_source(kZerosProblem);
  auto problem = c->SubmitProblem(submit);
  ASSERT_TRUE(problem.ok()) << problem.status().ToString() << h.Log();
  pb::StartSearchRequest req;
  req.set_problem_id(problem->problem_id());
  req.mutable_config()->set_rounds(1);
  auto started = c->StartSearch(req);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  pb::SearchInfo last;
  Status w = c->Watch(started->search_id(), [&](const pb::SearchEvent& e) {
    if (e.has_finished()) last = e.finished();
  });
  ASSERT_TRUE(w.ok()) << w.ToString();
  EXPECT_EQ(last.state(), pb::FAILED) << last.DebugString();
  const std::string why = last.stop_reason() + " " + last.error();
  EXPECT_NE(why.find("has a degenerate reference; its outputs cannot tell a correct kernel from a wrong one"),
            std::string::npos)
      << last.DebugString();
  EXPECT_NE(why.find("all zeros"), std::string::npos) << last.DebugString();
  EXPECT_NE(why.find("--allow-degenerate"), std::string::npos) << last.DebugString();
  EXPECT_EQ(h.LlmCallsStarted(), 0u) << "model calls were made for a problem that cannot be judged";
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

}  // namespace
}  // namespace ks::e2e

namespace ks::e2e {
namespace {

// `kernelsearch doctor`: one line per check; on a machine without a GPU it
// names that and says what to do, and still checks the rest.
TEST(FirstHourDoctor, OneLinePerCheckWithWhatToDo) {
  ks::testing::TempDir dir("ks_doctor_");
  SubprocessOptions o;
  o.argv = {ks::testing::CliBinary(), "doctor", "--model", "command:cat", "--db",
            (dir / "none.db").string()};
  o.timeout_s = 120;
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const char* check : {"GPU", "NVRTC", "python + torch", "reference cache", "lineage store", "Nsight Compute",
                            "model"})
    EXPECT_NE(r->out.find(std::string("  ") + check), std::string::npos) << check << " missing in:\n" << r->out;
  EXPECT_NE(r->out.find("ok    model            command:cat answered"), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("NVRTC            13."), std::string::npos) << r->out;
  EXPECT_NE(r->out.find("not created yet"), std::string::npos) << r->out;
  std::string why;
  if (!GpuAvailable(&why)) {
    EXPECT_EQ(r->exit_code, 1) << r->out;
    EXPECT_NE(r->out.find("FAIL  GPU              none usable here"), std::string::npos) << r->out;
    EXPECT_NE(r->out.find("-> this machine can still be the model side"), std::string::npos) << r->out;
  } else {
    EXPECT_NE(r->out.find("ok    GPU"), std::string::npos) << r->out;
  }
}

}  // namespace
}  // namespace ks::e2e
