// GPU workers end to end (issue 13): the real `kernelsearch serve --evaluator
// workers` runs a search whose candidates are evaluated by real
// `kernelsearch gpu-worker` processes (with the scripted evaluator, slowed
// down so that a worker can be killed in the middle of an evaluation).
// A worker killed with SIGKILL loses its lease and its candidate goes to the
// other worker; every candidate ends evaluated exactly once.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/subprocess.h"
#include "evaluator/profile/counters.h"
#include "evaluator/problem.h"
#include "store/lineage_store.h"
#include "server/client.h"
#include "tests/e2e/gpu_worker_checks.h"
#include "tests/e2e/server_harness.h"
#include "tests/testing/paths.h"
#include "tests/testing/skip.h"

namespace ks::e2e {
namespace {

namespace pb = ::kernelsearch::v1;
using namespace std::chrono_literals;

ChildProcess StartWorker(const ServerHarness& h, const std::string& name, double lease_s,
                         const std::string& token_file = "", const std::string& gpus = "0") {
  std::vector<std::string> argv = {ks::testing::CliBinary(),  "gpu-worker",
                                   "--server",     h.address(),
                                   "--token-file", token_file.empty() ? h.Path("token") : token_file,
                                   "--evaluator",  "fake:" + h.Path("evaluator.json"),
                                   "--gpus",       gpus,
                                   "--name",       name,
                                   "--lease-seconds", std::to_string(lease_s),
                                   "--poll",       "0.2"};
  auto child = ChildProcess::Start(argv, {}, h.Path(name + ".log"));
  EXPECT_TRUE(child.ok()) << child.status().ToString();
  return std::move(child).value();
}

// Waits for the child to exit; its wait status ("exit code 0"), or "" on timeout.
std::string WaitExit(ChildProcess& c, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto how = c.TryReap()) return *how;
    std::this_thread::sleep_for(50ms);
  }
  return "";
}

pb::SearchInfo WaitFinished(server::Client& c, const std::string& id, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  pb::GetSearchRequest req;
  req.set_search_id(id);
  pb::SearchInfo info;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = c.GetSearch(req);
    if (r.ok()) {
      info = *r;
      if (info.state() != pb::QUEUED && info.state() != pb::RUNNING) return info;
    }
    std::this_thread::sleep_for(100ms);
  }
  return info;
}

TEST(GpuWorkerE2E, OneOfTwoWorkersKilledMidEvaluationNothingLostNothingDoubled) {
  ServerHarness h({.eval_delay_ms = 1000, .evaluator = "workers"});
  StartedSearch s = StartSmallSearch(h);
  ASSERT_FALSE(s.search_id.empty());
  // The workers' "GPU" reports its facts; they reach the search's store rows.
  nlohmann::json ev = {{"delay_ms", 1000}, {"log", h.Path("evaluated.log")},
                       {"gpu", {{"name", "Fake H100"}, {"sm_count", 132}, {"memory_bandwidth_gbps", 3000}}}};
  ASSERT_TRUE(WriteFile(h.Path("evaluator.json"), ev.dump()).ok());

  ChildProcess doomed = StartWorker(h, "doomed", 3);
  ChildProcess survivor = StartWorker(h, "survivor", 3, "", "0,1");  // two (fake) GPUs, a thread each
  // The doomed worker's first lease; then SIGKILL while its 1 s evaluation runs.
  int64_t victim = 0;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!victim && std::chrono::steady_clock::now() < deadline) {
    auto leases = LeasesFromServerLog(h.Log());
    for (const auto& l : leases)
      if (l.worker.rfind("doomed/", 0) == 0) victim = l.candidate;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(victim, 0) << "the doomed worker never got a lease\n" << h.Log();
  std::this_thread::sleep_for(300ms);
  doomed.Kill();

  pb::SearchInfo fin = WaitFinished(*s.client, s.search_id, 120s);
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h.Log();
  ::kill(survivor.pid(), SIGTERM);
  EXPECT_EQ(WaitExit(survivor, 30s), "exit code 0");

  // The victim's lease expired and the survivor got it (a second attempt).
  bool retried = false;
  for (const auto& l : LeasesFromServerLog(h.Log()))
    if (l.candidate == victim && l.attempt >= 2 && l.worker.rfind("survivor/", 0) == 0) retried = true;
  EXPECT_TRUE(retried) << h.Log();
  std::set<std::string> survivor_gpus;
  for (const auto& l : LeasesFromServerLog(h.Log()))
    if (l.worker.rfind("survivor/", 0) == 0) survivor_gpus.insert(l.worker);
  EXPECT_EQ(survivor_gpus.size(), 2u) << "both of the survivor's GPUs took work\n" << h.Log();

  auto store = store::LineageStore::Open(h.db());
  ASSERT_TRUE(store.ok());
  ExpectEachEvaluatedOnce(store->get(), std::stoll(s.search_id), h.Evaluated());
  auto v = (*store)->GetCandidate(victim);
  ASSERT_TRUE(v.ok());
  EXPECT_TRUE(v->evaluation.has_value());
  auto facts = (*store)->LatestGpuFactsForSearch(std::stoll(s.search_id));
  ASSERT_TRUE(facts.ok() && facts->has_value());
  EXPECT_NE((*facts)->find("Fake H100"), std::string::npos) << **facts;
}

TEST(GpuWorkerE2E, SigtermGivesTheLeaseBackAtOnce) {
  ServerHarness h({.eval_delay_ms = 2000, .evaluator = "workers"});
  StartedSearch s = StartSmallSearch(h);
  ASSERT_FALSE(s.search_id.empty());
  // A 10-minute lease: only giving it back lets another worker take it soon.
  ChildProcess first = StartWorker(h, "first", 600);
  int64_t held = 0;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (!held && std::chrono::steady_clock::now() < deadline) {
    for (const auto& l : LeasesFromServerLog(h.Log())) held = l.candidate;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(held, 0) << h.Log();
  std::this_thread::sleep_for(200ms);
  ::kill(first.pid(), SIGTERM);
  EXPECT_EQ(WaitExit(first, 20s), "exit code 0");
  auto first_log = ReadFile(h.Path("first.log"));
  EXPECT_NE(first_log->find("gave 1 lease(s) back"), std::string::npos) << *first_log;

  ChildProcess second = StartWorker(h, "second", 600);
  pb::SearchInfo fin = WaitFinished(*s.client, s.search_id, 120s);
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h.Log();
  ::kill(second.pid(), SIGTERM);
  EXPECT_EQ(WaitExit(second, 30s), "exit code 0");
  auto store = store::LineageStore::Open(h.db());
  ASSERT_TRUE(store.ok());
  ExpectEachEvaluatedOnce(store->get(), std::stoll(s.search_id), h.Evaluated(), {held});
}

TEST(GpuWorkerE2E, ADegenerateReferenceOnTheWorkersGpuFailsTheSearchWithTheCliMessage) {
  KS_REQUIRE_TORCH();
  // The workers' scripted evaluator checks the reference with the real bridge,
  // as the GPU evaluator does while preparing it.
  ServerHarness h({.evaluator = "workers", .check_reference = true});
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
  req.mutable_config()->set_branches(1);
  auto started = c->StartSearch(req);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  ChildProcess worker = StartWorker(h, "w", 60);
  pb::SearchInfo fin = WaitFinished(*c, started->search_id(), 120s);
  EXPECT_EQ(fin.state(), pb::FAILED) << fin.DebugString() << h.Log();
  const std::string why = fin.stop_reason() + " " + fin.error();
  EXPECT_NE(why.find("the reference cannot judge kernels: "), std::string::npos) << fin.DebugString();
  EXPECT_NE(why.find("has a degenerate reference"), std::string::npos) << fin.DebugString();
  EXPECT_NE(why.find("--allow-degenerate"), std::string::npos) << fin.DebugString();
  ::kill(worker.pid(), SIGTERM);
  EXPECT_EQ(WaitExit(worker, 30s), "exit code 0");
  // Nothing was judged against it: the candidates stay pending, for a resume that allows it.
  EXPECT_EQ(h.Evaluated().size(), 0u);
  auto store = store::LineageStore::Open(h.db());
  ASSERT_TRUE(store.ok());
  auto pending = (*store)->PendingCandidates(std::stoll(started->search_id()));
  ASSERT_TRUE(pending.ok());
  EXPECT_FALSE(pending->empty());
}

TEST(GpuWorkerE2E, EachRoundsFastestKernelGetsItsCountersFromTheWorker) {
  ServerHarness h({.evaluator = "workers"});
  StartedSearch s = StartSmallSearch(h);  // --profile-top: the server's default, 1
  ASSERT_FALSE(s.search_id.empty());
  LaunchCounters l;
  l.kernel = "copy";
  l.dram_pct = 61;
  l.stalls = {{"long_scoreboard", 0.48}};
  nlohmann::json ev = {{"log", h.Path("evaluated.log")},
                       {"counters", CounterReportToJson(CounterReport{{l}, "", 0.5})}};
  ASSERT_TRUE(WriteFile(h.Path("evaluator.json"), ev.dump()).ok());
  ChildProcess worker = StartWorker(h, "w", 60);
  pb::SearchInfo fin = WaitFinished(*s.client, s.search_id, 120s);
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h.Log();
  ::kill(worker.pid(), SIGTERM);
  EXPECT_EQ(WaitExit(worker, 30s), "exit code 0");
  auto store = store::LineageStore::Open(h.db());
  ASSERT_TRUE(store.ok());
  auto cands = (*store)->ListCandidates(std::stoll(s.search_id));
  ASSERT_TRUE(cands.ok());
  // Per round: its fastest correct kernel has counters (the next round's prompts show them).
  std::map<int, const store::CandidateRow*> fastest;
  int with_counters = 0, correct = 0;
  for (const auto& c : *cands) {
    if (!c.evaluation || c.evaluation->status != EvalStatus::kCorrect || !c.evaluation->median_ms) continue;
    ++correct;
    if (c.evaluation->evaluation_json.find("long_scoreboard") != std::string::npos) ++with_counters;
    auto& f = fastest[c.round];
    if (!f || *c.evaluation->median_ms < *f->evaluation->median_ms) f = &c;
  }
  ASSERT_FALSE(fastest.empty()) << h.Log();
  for (const auto& [round, c] : fastest)
    EXPECT_NE(c->evaluation->evaluation_json.find("\"counters\""), std::string::npos) << "round " << round;
  EXPECT_LE(with_counters, correct);
  // Only a kernel that was the fastest of its round so far is profiled: none
  // with counters is slower than a correct one of its round judged before it
  // (by the store's time; the lease order decides which come first, so how
  // many are profiled varies from run to run).
  for (const auto& c : *cands) {
    if (!c.evaluation || !c.evaluation->median_ms ||
        c.evaluation->evaluation_json.find("long_scoreboard") == std::string::npos)
      continue;
    for (const auto& e : *cands)
      if (e.round == c.round && e.evaluation && e.evaluation->status == EvalStatus::kCorrect &&
          e.evaluation->median_ms && e.evaluation->created < c.evaluation->created)
        EXPECT_GE(*e.evaluation->median_ms, *c.evaluation->median_ms)
            << "candidate " << c.id << " was profiled although " << e.id << ", judged before it, was faster";
  }
}

TEST(GpuWorkerE2E, WrongTokenEndsTheWorker) {
  ServerHarness h({.evaluator = "workers"});
  h.Start();
  ASSERT_TRUE(WriteFile(h.Path("wrong-token"), std::string(40, 'x') + "\n").ok());
  ChildProcess w = StartWorker(h, "intruder", 10, h.Path("wrong-token"));
  EXPECT_EQ(WaitExit(w, 30s), "exit code 3");
  auto log = ReadFile(h.Path("intruder.log"));
  EXPECT_NE(log->find("leasing from"), std::string::npos) << *log;
}

TEST(GpuWorkerE2E, EvaluateKernelSaysTheServerHasNoGpu) {
  ServerHarness h({.evaluator = "workers"});
  h.Start();
  const int64_t problem = h.SeedProblem();
  auto c = h.Connect();
  pb::EvaluateKernelRequest req;
  req.set_problem_id(std::to_string(problem));
  req.set_source("extern \"C\" __global__ void k() {}");
  req.set_plan_json(R"({"launches": []})");
  EXPECT_EQ(c->EvaluateKernel(req).status().code(), Code::kFailedPrecondition);
}

// `--gpus` on the CLI (search, evaluate-pending): a pool of scripted
// evaluators, one per listed GPU, behind the search as one evaluator.
TEST(GpusFlag, SearchAndEvaluatePendingRunOnAPool) {
  ServerHarness h({.eval_delay_ms = 20});  // its directory, model script and evaluator config; no server
  auto seeded = store::LineageStore::Open(h.db());
  ASSERT_TRUE(seeded.ok());
  auto problem = (*seeded)->GetProblem(h.SeedProblem());
  ASSERT_TRUE(problem.ok());
  ASSERT_TRUE(WriteFile(h.Path("copy.py"), problem->source).ok());
  ASSERT_TRUE(WriteFile(h.Path("signature.json"), problem->signature_json).ok());
  auto run = [&](std::vector<std::string> args) {
    SubprocessOptions o;
    o.argv = {ks::testing::CliBinary()};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.timeout_s = 120;
    auto r = RunSubprocess(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  };
  auto search = [&](const std::string& db, std::vector<std::string> extra) {
    std::vector<std::string> args = {"search", h.Path("copy.py"), "--db", db, "--signature", h.Path("signature.json"),
                                     "--model", "command:" + h.Path("model.sh"), "--rounds", "1", "--ideas", "2",
                                     "--branches", "2", "--beam", "1", "--repair", "0", "--quiet"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  };
  const std::string evaluator = "fake:" + h.Path("evaluator.json");

  // A whole search on three GPUs.
  auto whole = search(h.Path("whole.db"), {"--evaluator", evaluator, "--gpus", "0,1,2"});
  ASSERT_TRUE(whole.Succeeded()) << whole.Describe() << whole.err;
  {
    auto store = store::LineageStore::Open(h.Path("whole.db"));
    ASSERT_TRUE(store.ok());
    ExpectEachEvaluatedOnce(store->get(), 1, h.Evaluated());
  }

  // A split search: generated here, evaluated by evaluate-pending on two GPUs.
  std::filesystem::remove(h.Path("evaluated.log"));
  auto generated = search(h.Path("split.db"), {"--generate-only"});
  ASSERT_TRUE(generated.Succeeded()) << generated.Describe() << generated.err;
  auto pending = run({"evaluate-pending", "--db", h.Path("split.db"), "--evaluator", evaluator, "--gpus", "0,1",
                      "--quiet"});
  ASSERT_TRUE(pending.Succeeded()) << pending.Describe() << pending.err;
  {
    auto store = store::LineageStore::Open(h.Path("split.db"));
    ASSERT_TRUE(store.ok());
    ExpectEachEvaluatedOnce(store->get(), 1, h.Evaluated());
  }

  auto twice = search(h.Path("bad.db"), {"--evaluator", evaluator, "--gpus", "0,0"});
  EXPECT_EQ(twice.exit_code, 2) << twice.err;
  EXPECT_NE(twice.err.find("GPU 0 named twice"), std::string::npos) << twice.err;
}

}  // namespace
}  // namespace ks::e2e
