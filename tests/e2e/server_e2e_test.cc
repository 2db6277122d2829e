// End-to-end tests of `kernelsearch serve`: the real binary on an ephemeral
// loopback port, driven through the gRPC client as a user would. The model is a
// shell script (command: backend) and the evaluator the scripted one, so no
// GPU, torch or network is needed. Deadlines are generous for 2-core machines.
#include <atomic>
#include <set>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "evaluator/problem.h"
#include "store/lineage_store.h"
#include "server/client.h"
#include "tests/e2e/server_harness.h"
#include "tests/testing/paths.h"
#include "tests/testing/skip.h"

namespace ks::e2e {
namespace {

namespace pb = ::kernelsearch::v1;

pb::StartSearchRequest SmallSearch(int64_t problem_id, int rounds = 1) {
  pb::StartSearchRequest req;
  req.set_problem_id(std::to_string(problem_id));
  req.mutable_config()->set_rounds(rounds);
  req.mutable_config()->set_ideas_per_round(2);
  req.mutable_config()->set_branches(2);
  req.mutable_config()->set_beam(1);
  req.mutable_config()->set_repair_attempts(0);
  return req;
}

struct Watched {
  Status status;
  std::vector<pb::SearchEvent> events;
};

Watched WatchAll(server::Client& c, const std::string& id) {
  Watched w;
  w.status = c.Watch(id, [&](const pb::SearchEvent& e) { w.events.push_back(e); });
  return w;
}

// The stream's own contract: a snapshot first, sequence numbers rising by one
// after it, and a finished event last.
void ExpectWellFormed(const Watched& w) {
  ASSERT_TRUE(w.status.ok()) << w.status.ToString();
  ASSERT_GE(w.events.size(), 2u);
  EXPECT_TRUE(w.events.front().has_snapshot());
  EXPECT_TRUE(w.events.back().has_finished());
  for (size_t i = 1; i < w.events.size(); ++i)
    EXPECT_EQ(w.events[i].sequence(), w.events[i - 1].sequence() + 1) << "event " << i;
}

TEST(ServerE2E, MissingOrWrongTokenIsUnauthenticated) {
  ServerHarness h;
  h.Start();
  pb::GetSearchRequest req;
  req.set_search_id("1");
  for (const std::string& token : {std::string(), std::string("wrong-token-wrong-token-wrong"), h.token() + "x"}) {
    auto c = h.Connect(token);
    auto r = c->GetSearch(req);
    EXPECT_EQ(r.status().code(), Code::kUnauthenticated) << token << ": " << r.status().ToString();
    Status w = c->Watch("1", [](const pb::SearchEvent&) { ADD_FAILURE() << "event without a token"; });
    EXPECT_EQ(w.code(), Code::kUnauthenticated) << w.ToString();
    pb::SubmitProblemRequest s;
    s.set_source("x = 1\n");
    EXPECT_EQ(c->SubmitProblem(s).status().code(), Code::kUnauthenticated);
  }
  // The right token gets past auth: an unknown search is NOT_FOUND.
  auto ok = h.Connect()->GetSearch(req);
  EXPECT_EQ(ok.status().code(), Code::kNotFound) << ok.status().ToString();
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

TEST(ServerE2E, MalformedAndOversizedRequests) {
  ServerHarness h({.extra_args = {"--max-message-bytes", "2000000", "--max-source-bytes", "100000"}});
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();

  pb::StartSearchRequest bad_id = SmallSearch(problem);
  bad_id.set_problem_id("abc");
  EXPECT_EQ(c->StartSearch(bad_id).status().code(), Code::kInvalidArgument);
  pb::StartSearchRequest unknown = SmallSearch(problem);
  unknown.set_problem_id("999999");
  EXPECT_EQ(c->StartSearch(unknown).status().code(), Code::kNotFound);
  pb::StartSearchRequest too_many = SmallSearch(problem);
  too_many.mutable_config()->set_rounds(100000);
  auto r = c->StartSearch(too_many);
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("rounds"), std::string::npos) << r.status().message();
  pb::StartSearchRequest negative = SmallSearch(problem);
  negative.mutable_config()->set_budget_usd(-1);
  EXPECT_EQ(c->StartSearch(negative).status().code(), Code::kInvalidArgument);

  pb::GetSearchRequest empty;
  EXPECT_EQ(c->GetSearch(empty).status().code(), Code::kInvalidArgument);
  pb::ListCandidatesRequest bad_status;
  bad_status.set_search_id("1");
  bad_status.set_status("fastest");
  EXPECT_EQ(c->ListCandidates(bad_status).status().code(), Code::kInvalidArgument);
  pb::GetBestKernelRequest both;
  both.set_search_id("1");
  both.set_problem_id("1");
  EXPECT_EQ(c->GetBestKernel(both).status().code(), Code::kInvalidArgument);

  pb::SubmitProblemRequest submit;
  submit.set_name("../etc/passwd");
  submit.set_source("x = 1\n");
  EXPECT_EQ(c->SubmitProblem(submit).status().code(), Code::kInvalidArgument);
  submit.set_name("ok");
  submit.set_source("");
  EXPECT_EQ(c->SubmitProblem(submit).status().code(), Code::kInvalidArgument);
  // Over the source limit, under the message limit: the server's own check.
  submit.set_source(std::string(150000, '#'));
  EXPECT_EQ(c->SubmitProblem(submit).status().code(), Code::kResourceExhausted);
  // Over the message limit: gRPC refuses it before any handler runs.
  submit.set_source(std::string(3000000, '#'));
  EXPECT_EQ(c->SubmitProblem(submit).status().code(), Code::kResourceExhausted);
  pb::EvaluateKernelRequest ek;
  ek.set_problem_id(std::to_string(problem));
  ek.set_source(std::string(150000, '/'));
  ek.set_plan_json("{}");
  EXPECT_EQ(c->EvaluateKernel(ek).status().code(), Code::kResourceExhausted);

  // The server is still healthy after all of that.
  auto ok = c->StartSearch(SmallSearch(problem));
  EXPECT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

TEST(ServerE2E, SearchRunsWatchedToTheEndThenBrowsed) {
  ServerHarness h;
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem));
  ASSERT_TRUE(started.ok()) << started.status().ToString() << h.Log();
  const std::string id = started->search_id();

  Watched w = WatchAll(*c, id);
  ExpectWellFormed(w);
  const pb::SearchInfo& fin = w.events.back().finished();
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h.Log();
  EXPECT_EQ(fin.search_id(), id);

  // The events tell the same story as the store.
  std::set<std::string> evaluated, best;
  int rounds = 0, ideas = 0;
  for (const auto& e : w.events) {
    if (e.has_round_started()) ++rounds;
    if (e.has_idea_proposed()) ++ideas;
    if (e.has_candidate_evaluated()) evaluated.insert(e.candidate_evaluated().candidate_id());
    if (e.has_new_best()) best.insert(e.new_best().candidate_id());
  }
  const pb::SearchInfo& snap = w.events.front().snapshot();
  EXPECT_EQ(rounds + snap.rounds_done(), fin.rounds_done());
  EXPECT_EQ(static_cast<int>(evaluated.size()) + snap.candidates_evaluated(), fin.candidates_evaluated());
  EXPECT_GE(fin.rounds_done(), 2);  // round 0 and one improvement round
  EXPECT_GT(fin.candidates_correct(), 0);
  EXPECT_FALSE(fin.best_candidate_id().empty());
  if (snap.best_candidate_id() != fin.best_candidate_id()) EXPECT_TRUE(best.count(fin.best_candidate_id()));
  EXPECT_GT(fin.best_speedup(), 0);

  // Browse: best, candidates in pages, one candidate with its lineage.
  pb::GetBestKernelRequest breq;
  breq.set_search_id(id);
  auto b = c->GetBestKernel(breq);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->summary().status(), "correct");
  EXPECT_NE(b->source().find("__global__"), std::string::npos);
  EXPECT_NE(b->plan_json().find("launches"), std::string::npos);
  EXPECT_NE(b->evaluation_json().find("correct"), std::string::npos);
  pb::GetBestKernelRequest bp;
  bp.set_problem_id(std::to_string(problem));
  auto bpr = c->GetBestKernel(bp);
  ASSERT_TRUE(bpr.ok());
  EXPECT_EQ(bpr->summary().candidate_id(), b->summary().candidate_id());

  std::set<std::string> listed;
  pb::ListCandidatesRequest lreq;
  lreq.set_search_id(id);
  lreq.set_page_size(3);
  int pages = 0;
  for (;;) {
    auto page = c->ListCandidates(lreq);
    ASSERT_TRUE(page.ok()) << page.status().ToString();
    EXPECT_LE(page->candidates_size(), 3);
    for (const auto& cand : page->candidates()) EXPECT_TRUE(listed.insert(cand.candidate_id()).second);
    ++pages;
    if (page->next_page_token().empty()) break;
    lreq.set_page_token(page->next_page_token());
  }
  EXPECT_GT(pages, 1);
  for (const auto& e : evaluated) EXPECT_TRUE(listed.count(e)) << e;
  pb::ListCandidatesRequest correct_only;
  correct_only.set_search_id(id);
  correct_only.set_correct_only(true);
  auto cor = c->ListCandidates(correct_only);
  ASSERT_TRUE(cor.ok());
  EXPECT_EQ(cor->candidates_size(), fin.candidates_correct());
  for (const auto& cand : cor->candidates()) EXPECT_EQ(cand.status(), "correct");

  // A round-1 candidate descends from a round-0 one.
  std::string child;
  for (const auto& cand : cor->candidates())
    if (cand.round() >= 1 && !cand.parent_id().empty()) child = cand.candidate_id();
  ASSERT_FALSE(child.empty());
  pb::GetCandidateRequest greq;
  greq.set_candidate_id(child);
  auto detail = c->GetCandidate(greq);
  ASSERT_TRUE(detail.ok());
  ASSERT_GE(detail->lineage_size(), 1);
  EXPECT_EQ(detail->lineage(0).candidate_id(), detail->summary().parent_id());
  EXPECT_FALSE(detail->idea_text().empty());

  pb::ListSearchesRequest hreq;
  auto hist = c->ListSearches(hreq);
  ASSERT_TRUE(hist.ok());
  ASSERT_EQ(hist->searches_size(), 1);
  EXPECT_EQ(hist->searches(0).config().rounds(), 1);
  EXPECT_EQ(hist->searches(0).config().ideas_per_round(), 2);

  // Cancelling an ended search is refused; watching it gives snapshot + finished.
  pb::CancelSearchRequest creq;
  creq.set_search_id(id);
  EXPECT_EQ(c->CancelSearch(creq).status().code(), Code::kFailedPrecondition);
  Watched again = WatchAll(*c, id);
  ExpectWellFormed(again);
  EXPECT_EQ(again.events.size(), 2u);

  // The same flow through the CLI client.
  SubprocessOptions cli;
  cli.argv = {ks::testing::CliBinary(), "remote", "history", "--server", h.address(), "--token-file", h.Path("token")};
  cli.unset_env = {"KS_SERVER_TOKEN"};
  auto out = RunSubprocess(cli);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->Succeeded()) << out->err;
  EXPECT_NE(out->out.find("search " + id), std::string::npos) << out->out;
  cli.argv = {ks::testing::CliBinary(), "watch", id, "--server", h.address(), "--token-file", h.Path("token")};
  out = RunSubprocess(cli);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->Succeeded()) << out->err;
  EXPECT_NE(out->out.find("finished"), std::string::npos) << out->out;
  cli.argv = {ks::testing::CliBinary(), "remote", "best", id, "--server", h.address()};
  cli.env = {{"KS_SERVER_TOKEN", "not-the-token-not-the-token"}};
  out = RunSubprocess(cli);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->exit_code, 3) << out->err;  // kExitEnv: unauthenticated
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

// Issue 15: the report over the API (authenticated like every call), and the
// CLI's `remote report`.
TEST(ServerE2E, ReportOverTheApi) {
  ServerHarness h;
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem));
  ASSERT_TRUE(started.ok()) << started.status().ToString() << h.Log();
  const std::string id = started->search_id();
  ExpectWellFormed(WatchAll(*c, id));

  pb::GetReportRequest req;
  req.set_search_id(id);
  auto r = c->GetReport(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString() << h.Log();
  EXPECT_NE(r->html().find("id=\"ks-data\""), std::string::npos);
  EXPECT_NE(r->html().find("Licensed to the Apache Software Foundation"), std::string::npos);  // ECharts, inlined
  EXPECT_NE(r->html().find("\"id\":" + id + ","), std::string::npos);
  pb::GetReportRequest missing;
  missing.set_search_id("999999");
  EXPECT_EQ(c->GetReport(missing).status().code(), Code::kNotFound);
  EXPECT_EQ(h.Connect("not-the-token-not-the-token")->GetReport(req).status().code(), Code::kUnauthenticated);

  SubprocessOptions cli;
  cli.argv = {ks::testing::CliBinary(), "remote", "report", id, "--out", h.Path("remote.html"), "--server", h.address(),
              "--token-file", h.Path("token")};
  cli.unset_env = {"KS_SERVER_TOKEN"};
  auto out = RunSubprocess(cli);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->Succeeded()) << out->err;
  auto written = ReadFile(h.Path("remote.html"), 64 << 20);
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(*written, r->html());
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

// Issue 15: a server's searches tell the model what the server's GPU measured
// (here the scripted evaluator stands for one), and the store keeps the facts
// for split searches that name that GPU.
TEST(ServerE2E, ServerSearchPromptsStateTheMeasuredGpuFacts) {
  ServerHarness h;
  auto config = ReadFile(h.Path("evaluator.json"));
  ASSERT_TRUE(config.ok());
  nlohmann::json j = nlohmann::json::parse(*config);
  j["gpu"] = {{"name", "Fake H100"}, {"compute_capability", "9.0"}, {"sm_count", 132},
              {"shared_bytes_per_block", 232448}, {"l2_bytes", 52428800}, {"memory_bandwidth_gbps", 2951.0}};
  ASSERT_TRUE(WriteFile(h.Path("evaluator.json"), j.dump()).ok());
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem));
  ASSERT_TRUE(started.ok()) << started.status().ToString() << h.Log();
  ExpectWellFormed(WatchAll(*c, started->search_id()));
  EXPECT_EQ(h.Terminate(), "exit code 0");
  auto store = store::LineageStore::Open(h.db());
  ASSERT_TRUE(store.ok());
  auto calls = (*store)->ListLlmCalls(std::stoll(started->search_id()), false);
  ASSERT_TRUE(calls.ok());
  ASSERT_FALSE(calls->empty());
  for (const auto& call : *calls) {
    EXPECT_NE(call.record.prompt.find("Fake H100 (compute capability 9.0), 132 SMs"), std::string::npos)
        << call.record.prompt;
    EXPECT_NE(call.record.prompt.find("Memory bandwidth (measured): 2951 GB/s"), std::string::npos);
  }
  auto facts = (*store)->LatestGpuFacts("Fake H100");
  ASSERT_TRUE(facts.ok());
  EXPECT_TRUE(facts->has_value());
}

// Issue 15: failed model calls are in the watch stream's search info (count
// and first error), and `watch` prints them.
TEST(ServerE2E, FailedModelCallsReachTheWatchStream) {
  ServerHarness h;
  ASSERT_TRUE(WriteFile(h.Path("model.sh"), "#!/bin/sh\necho 'HTTP 401 invalid api key' >&2\nexit 1\n").ok());
  std::filesystem::permissions(h.Path("model.sh"), std::filesystem::perms::owner_all);
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem, 0));
  ASSERT_TRUE(started.ok()) << started.status().ToString() << h.Log();
  const std::string id = started->search_id();
  Watched w = WatchAll(*c, id);
  ExpectWellFormed(w);
  const pb::SearchInfo& fin = w.events.back().finished();
  EXPECT_GE(fin.failed_llm_calls(), 2) << fin.DebugString();  // at least both branches of round 0
  EXPECT_NE(fin.first_llm_error().find("HTTP 401 invalid api key"), std::string::npos) << fin.DebugString();
  SubprocessOptions cli;
  cli.argv = {ks::testing::CliBinary(), "watch", id, "--server", h.address(), "--token-file", h.Path("token")};
  cli.unset_env = {"KS_SERVER_TOKEN"};
  auto out = RunSubprocess(cli);
  ASSERT_TRUE(out.ok());
  EXPECT_NE(out->out.find(std::to_string(fin.failed_llm_calls()) + " failed model calls; first:"), std::string::npos)
      << out->out;
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

TEST(ServerE2E, CancelARunningSearch) {
  ServerHarness h({.llm_sleep_s = 0.3});
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem, 5));
  ASSERT_TRUE(started.ok());
  pb::CancelSearchRequest creq;
  creq.set_search_id(started->search_id());
  auto cancelled = c->CancelSearch(creq);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status().ToString();
  Watched w = WatchAll(*c, started->search_id());
  ExpectWellFormed(w);
  EXPECT_EQ(w.events.back().finished().state(), pb::CANCELLED);
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

TEST(ServerE2E, FiftyConcurrentWatchers) {
  ServerHarness h({.llm_sleep_s = 0.2, .eval_delay_ms = 20});
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem, 2));
  ASSERT_TRUE(started.ok());
  constexpr int kWatchers = 50;
  std::vector<Watched> results(kWatchers);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWatchers; ++i) {
    threads.emplace_back([&, i] {
      auto own = h.Connect();  // a channel each: 50 separate clients
      results[i] = WatchAll(*own, started->search_id());
    });
  }
  for (auto& t : threads) t.join();
  const pb::SearchInfo* first = nullptr;
  for (int i = 0; i < kWatchers; ++i) {
    SCOPED_TRACE("watcher " + std::to_string(i));
    ExpectWellFormed(results[i]);
    if (results[i].events.empty()) continue;
    const pb::SearchInfo& fin = results[i].events.back().finished();
    EXPECT_EQ(fin.state(), pb::SUCCEEDED);
    if (!first) first = &fin;
    EXPECT_EQ(fin.candidates_evaluated(), first->candidates_evaluated());
    EXPECT_EQ(fin.best_candidate_id(), first->best_candidate_id());
  }
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

// ContinueSearch (issue 32): a search that ran out of rounds goes on with
// more, over the API: authenticated, the rounds bounded and counted as a new
// total, one more round run from its beam, no model call made twice.
TEST(ServerE2E, AFinishedSearchContinuesWithMoreRounds) {
  ServerHarness h;
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem, 1));
  ASSERT_TRUE(started.ok()) << started.status().ToString() << h.Log();
  const std::string id = started->search_id();
  Watched first = WatchAll(*c, id);
  ExpectWellFormed(first);
  ASSERT_EQ(first.events.back().finished().state(), pb::SUCCEEDED) << h.Log();
  const int rounds_done = first.events.back().finished().rounds_done();

  auto stub = pb::KernelSearch::NewStub(grpc::CreateChannel(h.address(), grpc::InsecureChannelCredentials()));
  auto call = [&](int rounds, const std::string& token, pb::SearchInfo* info) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
    pb::ContinueSearchRequest req;
    req.set_search_id(id);
    req.set_rounds(rounds);
    return stub->ContinueSearch(&ctx, req, info);
  };
  pb::SearchInfo info;
  EXPECT_EQ(call(2, "", &info).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(call(2, "wrong", &info).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  grpc::Status st = call(1, h.token(), &info);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("ran its 1 rounds already"), std::string::npos) << st.error_message();
  EXPECT_EQ(call(51, h.token(), &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // past max_rounds
  const size_t calls_before = h.LlmCallsStarted();

  st = call(2, h.token(), &info);
  ASSERT_TRUE(st.ok()) << st.error_message() << h.Log();
  EXPECT_EQ(info.config().rounds(), 2);
  Watched second = WatchAll(*c, id);
  ExpectWellFormed(second);
  const pb::SearchInfo& fin = second.events.back().finished();
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h.Log();
  EXPECT_EQ(fin.stop_reason(), "rounds");
  EXPECT_EQ(fin.rounds_done(), rounds_done + 1);
  std::vector<int> started_rounds;
  for (const auto& e : second.events)
    if (e.has_round_started()) started_rounds.push_back(e.round_started().round());
  // Round 2 and no other. The watch may begin after round 2 has started (on a
  // loaded machine; CI saw it): its snapshot then stands for that round, and
  // rounds_done above says that exactly one more round ran.
  EXPECT_LE(started_rounds.size(), 1u);
  for (int r : started_rounds) EXPECT_EQ(r, 2);
  EXPECT_GT(h.LlmCallsStarted(), calls_before);
  // No model call made twice: one stored call per slot; nothing evaluated twice.
  auto store = store::LineageStore::Open(h.db());
  ASSERT_TRUE(store.ok());
  auto calls = (*store)->ListLlmCalls(std::stoll(id), /*finished_only=*/false);
  ASSERT_TRUE(calls.ok());
  std::set<std::string> slots;
  for (const auto& call_row : *calls) EXPECT_TRUE(slots.insert(call_row.slot_key).second) << call_row.slot_key;
  EXPECT_EQ(h.LlmCallsStarted(), calls->size());
  std::vector<std::string> evaluated = h.Evaluated();
  EXPECT_EQ(std::set<std::string>(evaluated.begin(), evaluated.end()).size(), evaluated.size());
  // Finished again: a second call with the same total is refused.
  EXPECT_EQ(call(2, h.token(), &info).error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  // The same through the CLI: `kernelsearch continue`, then `watch` to its end.
  SubprocessOptions cli;
  cli.unset_env = {"KS_SERVER_TOKEN"};
  cli.argv = {ks::testing::CliBinary(), "continue", id, "--rounds", "2", "--server", h.address(), "--token-file", h.Path("token")};
  auto refused = RunSubprocess(cli);
  ASSERT_TRUE(refused.ok());
  EXPECT_FALSE(refused->Succeeded());
  EXPECT_NE(refused->err.find("ran its 2 rounds already"), std::string::npos) << refused->err;
  cli.argv = {ks::testing::CliBinary(), "continue", id, "--rounds", "3", "--server", h.address(), "--token-file", h.Path("token")};
  auto queued = RunSubprocess(cli);
  ASSERT_TRUE(queued.ok());
  ASSERT_TRUE(queued->Succeeded()) << queued->err << h.Log();
  EXPECT_NE(queued->out.find("search " + id + " queued for rounds up to 3"), std::string::npos) << queued->out;
  cli.argv = {ks::testing::CliBinary(), "watch", id, "--server", h.address(), "--token-file", h.Path("token")};
  auto watched = RunSubprocess(cli);
  ASSERT_TRUE(watched.ok());
  EXPECT_TRUE(watched->Succeeded()) << watched->err;
  auto after = c->GetSearch([&] {
    pb::GetSearchRequest g;
    g.set_search_id(id);
    return g;
  }());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->rounds_done(), rounds_done + 2) << after->DebugString();
}

// kill -9 mid-search; the restarted server resumes it from the store and
// finishes, with nothing evaluated twice and nothing lost.
TEST(ServerE2E, KilledMidSearchResumesAfterRestart) {
  ServerHarness h({.llm_sleep_s = 0.2, .eval_delay_ms = 100});
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem, 2));
  ASSERT_TRUE(started.ok());
  const std::string id = started->search_id();
  // Wait until a few candidates were evaluated, then kill without warning.
  std::atomic<int> seen{0};
  grpc::ClientContext* live = nullptr;
  std::mutex mu;
  std::thread watcher([&] {
    Status st = c->Watch(
        id,
        [&](const pb::SearchEvent& e) {
          if (e.has_candidate_evaluated()) ++seen;
        },
        [&](grpc::ClientContext* ctx) {
          std::lock_guard<std::mutex> lock(mu);
          live = ctx;
        });
    (void)st;  // the stream ends with the server's death
  });
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (seen.load() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(seen.load(), 2) << h.Log();
  h.KillHard();
  watcher.join();
  const size_t before = h.Evaluated().size();

  h.Start();  // same store
  auto c2 = h.Connect();
  pb::GetSearchRequest g;
  g.set_search_id(id);
  auto info = c2->GetSearch(g);
  ASSERT_TRUE(info.ok());
  EXPECT_NE(info->state(), pb::CANCELLED);
  EXPECT_NE(info->state(), pb::FAILED);
  Watched w = WatchAll(*c2, id);
  ExpectWellFormed(w);
  const pb::SearchInfo& fin = w.events.back().finished();
  EXPECT_EQ(fin.state(), pb::SUCCEEDED) << fin.DebugString() << h.Log();
  EXPECT_NE(h.Log().find("resuming 1 search"), std::string::npos);

  // Nothing evaluated twice (the scripted evaluator logs each content hash),
  // nothing lost (every candidate the store holds was evaluated).
  std::vector<std::string> all = h.Evaluated();
  EXPECT_GT(all.size(), before);
  std::set<std::string> unique(all.begin(), all.end());
  EXPECT_EQ(unique.size(), all.size());
  pb::ListCandidatesRequest lreq;
  lreq.set_search_id(id);
  lreq.set_page_size(500);
  auto cands = c2->ListCandidates(lreq);
  ASSERT_TRUE(cands.ok());
  for (const auto& cand : cands->candidates()) EXPECT_NE(cand.status(), "pending") << cand.candidate_id();
  EXPECT_EQ(fin.candidates_evaluated(), cands->candidates_size());
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

// SIGTERM mid-search: the server exits cleanly, the search is left pending
// (not cancelled) and the next server finishes it.
TEST(ServerE2E, SigtermLeavesSearchResumable) {
  ServerHarness h({.llm_sleep_s = 0.3, .eval_delay_ms = 50});
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  auto started = c->StartSearch(SmallSearch(problem, 2));
  ASSERT_TRUE(started.ok());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_EQ(h.Terminate(), "exit code 0") << h.Log();
  {
    auto store = store::LineageStore::Open(h.db());
    ASSERT_TRUE(store.ok());
    auto row = (*store)->GetSearch(std::stoll(started->search_id()));
    ASSERT_TRUE(row.ok());
    EXPECT_EQ(row->status, store::SearchStatus::kPending) << row->stop_reason;
  }
  h.Start();
  Watched w = WatchAll(*h.Connect(), started->search_id());
  ExpectWellFormed(w);
  EXPECT_EQ(w.events.back().finished().state(), pb::SUCCEEDED) << h.Log();
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

TEST(ServerE2E, EvaluateKernel) {
  ServerHarness h;
  int64_t problem = h.SeedProblem();
  h.Start();
  auto c = h.Connect();
  pb::EvaluateKernelRequest req;
  req.set_problem_id(std::to_string(problem));
  req.set_source("extern \"C\" __global__ void k(float* out, const float* x, int n) { /* FAKE_MS(0.5) */ }");
  req.set_plan_json(R"({"launches": [{"kernel": "k", "grid": ["1"], "block": [256], "args": ["out", "x", "x.numel"]}]})");
  auto r = c->EvaluateKernel(req);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->status(), "correct");
  EXPECT_DOUBLE_EQ(r->median_ms(), 0.5);
  EXPECT_GT(r->speedup_eager(), 0);
  req.set_problem_id("424242");
  EXPECT_EQ(c->EvaluateKernel(req).status().code(), Code::kNotFound);
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

// Without a GPU the real evaluator cannot run: FAILED_PRECONDITION, saying so.
TEST(ServerE2E, EvaluateKernelWithoutGpuIsFailedPrecondition) {
  if (std::filesystem::exists("/dev/nvidia0") || std::filesystem::exists("/dev/nvidiactl"))
    GTEST_SKIP() << "a GPU is present";
  ServerHarness h({.evaluator = "gpu"});
  int64_t problem = h.SeedProblem();
  h.Start();
  pb::EvaluateKernelRequest req;
  req.set_problem_id(std::to_string(problem));
  req.set_source("extern \"C\" __global__ void k(float* out) {}");
  req.set_plan_json(R"({"launches": [{"kernel": "k", "grid": ["1"], "block": [1], "args": ["out"]}]})");
  auto r = h.Connect()->EvaluateKernel(req);
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status().ToString();
  EXPECT_FALSE(r.status().message().empty());
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

// TLS: a client that trusts the server's CA gets through; a plain-text client
// does not. Beyond loopback, the server refuses to start without TLS.
TEST(ServerE2E, TlsAndLoopbackPolicy) {
  if (!FindOnPath("openssl")) GTEST_SKIP() << "no openssl to make a test certificate";
  ServerHarness probe;
  SubprocessOptions gen;
  gen.argv = {"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", probe.Path("key.pem"),
              "-out", probe.Path("cert.pem"), "-days", "2", "-subj", "/CN=localhost",
              "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"};
  auto made = RunSubprocess(gen);
  ASSERT_TRUE(made.ok() && made->Succeeded()) << (made.ok() ? made->err : made.status().ToString());

  ServerHarness h({.extra_args = {"--tls-cert", probe.Path("cert.pem"), "--tls-key", probe.Path("key.pem")}});
  h.Start();
  pb::GetSearchRequest req;
  req.set_search_id("1");
  auto secure = h.Connect(h.token(), probe.Path("cert.pem"))->GetSearch(req);
  EXPECT_EQ(secure.status().code(), Code::kNotFound) << secure.status().ToString();
  auto plain = h.Connect(h.token())->GetSearch(req);
  EXPECT_EQ(plain.status().code(), Code::kUnavailable) << plain.status().ToString();
  EXPECT_EQ(h.Terminate(), "exit code 0");

  SubprocessOptions open;
  open.argv = {ks::testing::CliBinary(), "serve", "--listen", "0.0.0.0:0", "--token-file", probe.Path("token"), "--db",
               probe.db(), "--model", "command:" + probe.Path("model.sh"), "--evaluator", "fake"};
  auto refused = RunSubprocess(open);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(refused->exit_code, 2) << refused->err;
  EXPECT_NE(refused->err.find("--tls-cert"), std::string::npos) << refused->err;
}

// The whole user path through the reference bridge: needs python3 with torch
// (the GPU machines have it; skipped where it is absent).
TEST(ServerE2E, SubmitProblemThroughTheBridgeThenSearch) {
  KS_REQUIRE_TORCH();
  ServerHarness h;
  h.Start();
  auto c = h.Connect();
  const std::string source =
      "import torch\n"
      "DESCRIPTION = 'a tiny scale, for tests'\n"
      "class Model(torch.nn.Module):\n"
      "    def forward(self, x):\n"
      "        return x * 2.0\n"
      "def get_inputs():\n"
      "    return [torch.randn(1024)]\n"
      "def get_init_inputs():\n"
      "    return []\n";
  ASSERT_TRUE(WriteFile(h.Path("scale2.py"), source).ok());
  pb::SubmitProblemRequest req;
  req.set_name("scale2");
  req.set_source(source);
  auto first = c->SubmitProblem(req);
  ASSERT_TRUE(first.ok()) << first.status().ToString() << h.Log();
  EXPECT_EQ(first->signature().name(), "scale2");
  EXPECT_EQ(first->signature().description(), "a tiny scale, for tests");
  EXPECT_GT(first->signature().inputs_size(), 0);
  ASSERT_GT(first->signature().outputs_size(), 0);
  EXPECT_EQ(first->signature().outputs(0).name(), "out");
  auto again = c->SubmitProblem(req);  // the same text is the same problem
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->problem_id(), first->problem_id());

  // A broken operator is INVALID_ARGUMENT naming the problem, never the
  // server's private temporary path.
  req.set_name("broken");
  req.set_source("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x)\n        return x\n");
  auto broken = c->SubmitProblem(req);
  EXPECT_EQ(broken.status().code(), Code::kInvalidArgument) << broken.status().ToString();
  EXPECT_NE(broken.status().message().find("broken.py"), std::string::npos) << broken.status().message();
  EXPECT_EQ(broken.status().message().find("ks-submit-"), std::string::npos) << broken.status().message();

  // `kernelsearch submit --watch` end to end.
  SubprocessOptions cli;
  cli.argv = {ks::testing::CliBinary(), "submit", h.Path("scale2.py"), "--server", h.address(),
              "--token-file", h.Path("token"), "--rounds", "1", "--ideas", "2", "--branches", "1", "--beam", "1",
              "--watch"};
  cli.timeout_s = 600;
  auto out = RunSubprocess(cli);
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(out->Succeeded()) << out->err << out->out << h.Log();
  EXPECT_NE(out->out.find("finished: search"), std::string::npos) << out->out;
  EXPECT_EQ(h.Terminate(), "exit code 0");
}

}  // namespace
}  // namespace ks::e2e
