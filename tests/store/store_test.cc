#include "store/lineage_store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include <gtest/gtest.h>

#include "store/candidate_hash.h"
#include "tests/testing/temp_dir.h"

namespace ks::store {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (dir_ / "sub" / "lineage.db").string();
  }

  std::unique_ptr<LineageStore> OpenOrDie() {
    auto s = LineageStore::Open(path_);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s).value();
  }

  Evaluation Correct(double ms, double speedup) {
    Evaluation e;
    e.status = EvalStatus::kCorrect;
    e.timing = TimingStats{ms, ms, ms, ms, 0, 10};
    e.speedup_eager = speedup;
    return e;
  }

  ks::testing::TempDir dir_{"ks_store_test_"};
  std::string path_;
};

TEST_F(StoreTest, CreatesFileInWalModeAtLatestVersion) {
  auto store = OpenOrDie();
  EXPECT_TRUE(std::filesystem::exists(path_));
  auto v = store->SchemaVersion();
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, LatestSchemaVersion());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  SqliteDbPtr owned(db);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr), SQLITE_OK);
  SqliteStmtPtr stmt(st);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
}

TEST_F(StoreTest, ElapsedTimeAddsUpAcrossConnectionsAndMigratesFromVersionTwo) {
  int64_t search_id;
  {
    auto old = LineageStore::Open(path_, {.max_schema_version = 2});
    ASSERT_TRUE(old.ok()) << old.status().ToString();
    auto p = (*old)->PutProblem({.name = "softmax", .file_path = "softmax.py", .source = "class Model: ..."});
    ASSERT_TRUE(p.ok());
    auto s = (*old)->CreateSearch(*p, "{}");
    ASSERT_TRUE(s.ok());
    search_id = *s;
    EXPECT_FALSE((*old)->AddSearchElapsed(search_id, 1).ok());  // no column yet: really a version-2 file
  }
  auto a = OpenOrDie();
  EXPECT_EQ(a->GetSearch(search_id)->elapsed_s, 0);
  auto b = OpenOrDie();  // another process's connection
  ASSERT_TRUE(a->AddSearchElapsed(search_id, 1.5).ok());
  ASSERT_TRUE(b->AddSearchElapsed(search_id, 2.25).ok());
  EXPECT_DOUBLE_EQ(a->GetSearch(search_id)->elapsed_s, 3.75);
  EXPECT_FALSE(a->AddSearchElapsed(search_id, -1).ok());
  EXPECT_EQ(a->AddSearchElapsed(search_id + 100, 1).code(), Code::kNotFound);
}

TEST_F(StoreTest, MigratesVersionOneFileKeepingItsRows) {
  int64_t problem_id, search_id;
  {
    auto old = LineageStore::Open(path_, {.max_schema_version = 1});
    ASSERT_TRUE(old.ok()) << old.status().ToString();
    EXPECT_EQ(*(*old)->SchemaVersion(), 1);
    auto p = (*old)->PutProblem({.name = "softmax", .file_path = "p/softmax.py", .source = "class Model: ..."});
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    problem_id = *p;
    auto s = (*old)->CreateSearch(problem_id, R"({"rounds":3})");
    ASSERT_TRUE(s.ok());
    search_id = *s;
    // A version-1 file has no rounds table: the newer queries must fail on it,
    // which shows the test really built an old schema.
    EXPECT_FALSE((*old)->LastRound(search_id).ok());
  }
  auto store = OpenOrDie();
  EXPECT_EQ(*store->SchemaVersion(), LatestSchemaVersion());
  auto search = store->GetSearch(search_id);
  ASSERT_TRUE(search.ok()) << search.status().ToString();
  EXPECT_EQ(search->config_json, R"({"rounds":3})");
  EXPECT_EQ(search->stop_reason, "");  // the column added by version 2, defaulted
  auto round = store->StartRound(search_id, 0, {});
  ASSERT_TRUE(round.ok()) << round.status().ToString();
  EXPECT_EQ(store->GetProblem(problem_id)->name, "softmax");
}

TEST_F(StoreTest, RefusesFileFromNewerBuild) {
  {
    auto store = OpenOrDie();
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  SqliteDbPtr owned(db);
  std::string sql = "PRAGMA user_version = " + std::to_string(LatestSchemaVersion() + 1);
  ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK);
  owned.reset();
  auto again = LineageStore::Open(path_);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(again.status().message().find("newer"), std::string::npos);
}

TEST_F(StoreTest, ProblemsAreDeduplicatedBySourceAndSignatureFilledLater) {
  auto store = OpenOrDie();
  auto a = store->PutProblem({.name = "relu", .file_path = "relu.py", .source = "A"});
  auto b = store->PutProblem({.name = "relu", .file_path = "relu.py", .source = "A", .signature_json = R"({"x":1})"});
  auto c = store->PutProblem({.name = "relu", .file_path = "relu.py", .source = "B"});
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
  EXPECT_EQ(store->GetProblem(*a)->signature_json, R"({"x":1})");
  auto found = store->FindProblems("relu");
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->size(), 2u);
  EXPECT_EQ(found->front().id, *c);  // newest first
}

TEST_F(StoreTest, SlotKeysMakeInsertsIdempotent) {
  auto store = OpenOrDie();
  int64_t p = *store->PutProblem({.name = "x", .file_path = "x.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  int64_t i1 = *store->PutIdea({.search_id = s, .round = 1, .text = "tile", .slot_key = "r1/p0/i0"});
  int64_t i2 = *store->PutIdea({.search_id = s, .round = 1, .text = "other text", .slot_key = "r1/p0/i0"});
  EXPECT_EQ(i1, i2);
  EXPECT_EQ(store->GetIdea(i1)->text, "tile");
  CandidateRow c{.search_id = s, .round = 1, .idea_id = i1, .source = "a", .plan_json = "{}", .slot_key = "k"};
  int64_t c1 = *store->PutCandidate(c);
  c.source = "b";
  int64_t c2 = *store->PutCandidate(c);
  EXPECT_EQ(c1, c2);
  EXPECT_EQ(store->ListCandidates(s)->size(), 1u);
  EXPECT_FALSE(store->PutIdea({.search_id = s, .text = "no slot"}).ok());
}

TEST_F(StoreTest, AgentAttemptsAreIdempotentOrderedAndCounted) {
  auto store = OpenOrDie();
  int64_t p = *store->PutProblem({.name = "x", .file_path = "x.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  auto put = [&](int turn, int call, const std::string& tool, bool error, const std::string& eval) {
    return store->PutAttempt({.search_id = s, .slot_key = "r0/i1/b0", .turn = turn, .call_index = call,
                              .tool_call_id = "c", .tool = tool, .arguments = "{}", .is_error = error,
                              .result = tool + " result", .evaluation_json = eval});
  };
  auto first = put(1, 0, "test", false, "{}");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(put(0, 0, "compile", false, "{}").ok());
  ASSERT_TRUE(put(0, 1, "nonsense", true, "").ok());
  ASSERT_TRUE(put(2, 0, "submit", false, "").ok());
  auto again = put(1, 0, "test", true, "");  // a resumed run stores the same step again: the first row stays
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *first);
  auto rows = *store->ListAttempts(s, "r0/i1/b0");
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0].tool, "compile");
  EXPECT_EQ(rows[1].tool, "nonsense");
  EXPECT_EQ(rows[2].tool, "test");
  EXPECT_FALSE(rows[2].is_error);
  EXPECT_TRUE(store->ListAttempts(s, "r0/i2/b0")->empty());
  auto counts = *store->CountAttempts(s);
  EXPECT_EQ(counts.tool_calls, 4);
  EXPECT_EQ(counts.tool_errors, 1);
  EXPECT_EQ(counts.tests, 2);
  EXPECT_EQ(counts.submitted, 1);
}

TEST_F(StoreTest, EvaluationsBestLineageAndPending) {
  auto store = OpenOrDie();
  int64_t p = *store->PutProblem({.name = "x", .file_path = "x.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  int64_t root = *store->PutCandidate({.search_id = s, .source = "r", .plan_json = "{}", .kind = CandidateKind::kSeed,
                                       .slot_key = "seed"});
  int64_t idea = *store->PutIdea({.search_id = s, .round = 1, .parent_candidate = root, .text = "vectorize",
                                  .slot_key = "r1/i0"});
  int64_t child = *store->PutCandidate({.search_id = s, .round = 1, .idea_id = idea, .parent_candidate = root,
                                        .source = "c", .plan_json = "{}", .slot_key = "r1/b0"});
  int64_t broken = *store->PutCandidate({.search_id = s, .round = 1, .idea_id = idea, .parent_candidate = root,
                                         .source = "d", .plan_json = "{}", .slot_key = "r1/b1"});
  EXPECT_EQ(store->PendingCandidates(s)->size(), 3u);
  EXPECT_EQ(store->PendingCandidates(0)->size(), 3u);

  ASSERT_TRUE(store->PutEvaluation(root, Correct(2.0, 1.0), std::nullopt).ok());
  ASSERT_TRUE(store->PutEvaluation(child, Correct(1.0, 2.0), std::nullopt).ok());
  Evaluation bad;
  bad.status = EvalStatus::kCompileError;
  bad.message = "error: expected ';'";
  ASSERT_TRUE(store->PutEvaluation(broken, bad, std::nullopt).ok());
  // A second evaluation of the same candidate is refused (evaluated once).
  EXPECT_FALSE(store->PutEvaluation(broken, bad, std::nullopt).ok());
  EXPECT_TRUE(store->PendingCandidates(s)->empty());

  auto best = store->BestCorrect(s);
  ASSERT_TRUE(best.ok() && best->has_value());
  EXPECT_EQ((*best)->id, child);
  EXPECT_DOUBLE_EQ(*(*best)->evaluation->speedup_eager, 2.0);
  EXPECT_EQ((*store->BestCorrectForProblem(p))->id, child);
  auto correct = store->CorrectCandidates(s);
  ASSERT_EQ(correct->size(), 2u);
  EXPECT_EQ((*correct)[1].id, root);

  auto got = store->GetCandidate(broken);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->evaluation->status, EvalStatus::kCompileError);
  auto parsed = EvaluationFromJson(nlohmann::json::parse(got->evaluation->evaluation_json));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->message, "error: expected ';'");

  auto path = store->Lineage(child);
  ASSERT_TRUE(path.ok());
  ASSERT_EQ(path->size(), 2u);
  EXPECT_EQ((*path)[0].id, root);
  EXPECT_EQ((*path)[1].id, child);

  auto summary = store->Summarize(s);
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->candidates, 3);
  EXPECT_EQ(summary->evaluated, 3);
  EXPECT_EQ(summary->correct, 2);
  EXPECT_DOUBLE_EQ(*summary->best_speedup_eager, 2.0);
  EXPECT_EQ(store->History(p)->size(), 1u);
  EXPECT_EQ(store->History(p + 1)->size(), 0u);
}

TEST_F(StoreTest, TheRooflineAndItsPeaksSurviveTheStore) {
  auto store = OpenOrDie();
  int64_t p = *store->PutProblem({.name = "mm", .file_path = "mm.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  int64_t c = *store->PutCandidate({.search_id = s, .source = "k", .plan_json = "{}", .slot_key = "seed"});
  Evaluation e = Correct(25.26, 0.11);
  e.roofline = Roofline{.bytes = 2.0e8, .flops = 1.374e11, .achieved_gbps = 7.9, .achieved_tflops = 5.44,
                        .floor_ms = 2.684, .fraction_of_floor = 0.106, .peak_gbps = 2931, .peak_tflops = 51.2,
                        .compute_class = "fp32", .bound = "compute"};
  ASSERT_TRUE(store->PutEvaluation(c, e, std::nullopt).ok());
  auto got = store->GetCandidate(c);
  ASSERT_TRUE(got.ok());
  auto parsed = EvaluationFromJson(nlohmann::json::parse(got->evaluation->evaluation_json));
  ASSERT_TRUE(parsed.ok());
  ASSERT_TRUE(parsed->roofline.has_value());
  EXPECT_DOUBLE_EQ(parsed->roofline->peak_tflops, 51.2);
  EXPECT_DOUBLE_EQ(parsed->roofline->peak_gbps, 2931);
  EXPECT_EQ(parsed->roofline->compute_class, "fp32");
  EXPECT_EQ(parsed->roofline->bound, "compute");
  EXPECT_DOUBLE_EQ(parsed->roofline->floor_ms, 2.684);
}

TEST_F(StoreTest, ASpecialisedKernelIsStoredAndRanksAfterEveryRobustOne) {
  auto store = OpenOrDie();
  int64_t p = *store->PutProblem({.name = "gemm", .file_path = "gemm.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  int64_t fast = *store->PutCandidate({.search_id = s, .source = "split", .plan_json = "{}", .slot_key = "a"});
  int64_t slow = *store->PutCandidate({.search_id = s, .source = "3xtf32", .plan_json = "{}", .slot_key = "b"});
  Evaluation split = Correct(1.0, 2.83);
  split.robustness = Robustness{{{"get_inputs", "held", "3 input set(s) from get_inputs()"},
                                 {"scale_up", "broke", "floating-point inputs x 1e5: output 'out' wrong"},
                                 {"shapes", "not_checked", "one shape"}},
                                "scale_up"};
  split.precision = "fp32";
  Evaluation honest = Correct(2.0, 1.4);
  honest.robustness = Robustness{{{"get_inputs", "held", ""}, {"scale_up", "held", ""}}, ""};
  ASSERT_TRUE(store->PutEvaluation(fast, split, std::nullopt).ok());
  ASSERT_TRUE(store->PutEvaluation(slow, honest, std::nullopt).ok());
  // Twice as fast, but a shifted input set broke it: the robust kernel is the best.
  EXPECT_EQ((*store->BestCorrect(s))->id, slow);
  EXPECT_EQ((*store->BestCorrectForProblem(p))->id, slow);
  auto correct = store->CorrectCandidates(s);
  ASSERT_EQ(correct->size(), 2u);
  EXPECT_EQ((*correct)[1].id, fast);
  // The mark and every check survive the store.
  auto parsed = EvaluationFromJson(nlohmann::json::parse(store->GetCandidate(fast)->evaluation->evaluation_json));
  ASSERT_TRUE(parsed.ok());
  EXPECT_TRUE(parsed->specialised());
  EXPECT_EQ(parsed->robustness->broken_by, "scale_up");
  ASSERT_EQ(parsed->robustness->checks.size(), 3u);
  EXPECT_EQ(parsed->robustness->checks[1].outcome, "broke");
  EXPECT_EQ(parsed->precision, "fp32");
  EXPECT_EQ(parsed->robustness->Summary(),
            "specialised: correct on the get_inputs() sets, but 'scale_up' broke it (floating-point inputs x 1e5: "
            "output 'out' wrong); not checked: shapes");
}

TEST_F(StoreTest, IdenticalCandidateFoundByNormalizedHash) {
  auto store = OpenOrDie();
  int64_t p = *store->PutProblem({.name = "x", .file_path = "x.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  std::string src = "extern \"C\" __global__ void k(float* x) { x[0] = 1; }";
  std::string plan = R"({"launches": [{"kernel": "k", "grid": [1], "block": [1], "args": ["x"]}]})";
  int64_t a = *store->PutCandidate({.search_id = s, .source = src, .plan_json = plan, .slot_key = "a"});
  ASSERT_TRUE(store->PutEvaluation(a, Correct(1, 1), std::nullopt).ok());
  std::string same_src = "// a comment\nextern  \"C\"  __global__ void k(float* x)\n{ /* c */ x[0] = 1; }\n";
  std::string same_plan = R"({"launches":[{"args":["x"],"block":[1],"grid":[1],"kernel":"k"}]})";
  EXPECT_EQ(CandidateContentHash(src, plan), CandidateContentHash(same_src, same_plan));
  auto hit = store->FindEvaluatedByHash(p, CandidateContentHash(same_src, same_plan), "fp32");
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->id, a);
  // A string literal's "//" is not a comment; a real change in code is a new candidate.
  EXPECT_NE(NormalizeSource("f(\"//x\");"), NormalizeSource("f(\"\");"));
  EXPECT_NE(CandidateContentHash(src, plan), CandidateContentHash(src + "int y;", plan));
  EXPECT_FALSE(store->FindEvaluatedByHash(p + 1, CandidateContentHash(src, plan), "fp32")->has_value());
}

TEST_F(StoreTest, LlmCallsFoundForResumeAndSpendTotals) {
  auto store = OpenOrDie();
  int64_t p = *store->PutProblem({.name = "x", .file_path = "x.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  LlmCallRecord ok{.role = "ideas", .backend = "replay", .model = "m", .prompt = "P", .response = "R",
                   .tokens_in = 10, .tokens_out = 5, .cost_usd = 0.5};
  LlmCallRecord failed = ok;
  failed.response = "";
  failed.error = "HTTP 500";
  ASSERT_TRUE(store->PutLlmCall(s, "r1/p3", failed).ok());
  ASSERT_TRUE(store->PutLlmCall(s, "r1/p3", ok).ok());
  std::string hash = PromptHash("ideas", "", "P");
  auto hit = store->FindFinishedLlmCall(s, "ideas", hash, "r1/p3");
  ASSERT_TRUE(hit.ok() && hit->has_value());
  EXPECT_EQ((*hit)->record.response, "R");
  EXPECT_FALSE(store->FindFinishedLlmCall(s, "ideas", hash, "r1/p4")->has_value());
  EXPECT_FALSE(store->FindFinishedLlmCall(s, "ideas", PromptHash("ideas", "", "Q"), "r1/p3")->has_value());
  EXPECT_EQ(store->ListLlmCalls(s, true)->size(), 1u);
  EXPECT_EQ(store->ListLlmCalls(s, false)->size(), 2u);
  auto spend = store->Spend(s);
  EXPECT_EQ(spend->calls, 2);
  EXPECT_EQ(spend->tokens_in, 20);
  EXPECT_DOUBLE_EQ(spend->cost_usd, 1.0);
}

TEST_F(StoreTest, ConcurrentWritersFromThreadsAndConnections) {
  auto store = OpenOrDie();
  auto second = OpenOrDie();  // another connection, as another process would hold
  int64_t p = *store->PutProblem({.name = "x", .file_path = "x.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      LineageStore* target = t % 2 ? store.get() : second.get();
      for (int i = 0; i < 25; ++i) {
        auto r = target->PutLlmCall(s, "t" + std::to_string(t), {.role = "implement", .prompt = "p"});
        EXPECT_TRUE(r.ok()) << r.status().ToString();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(store->Spend(s)->calls, 200);
}

TEST_F(StoreTest, SearchStatusRoundTrip) {
  auto store = OpenOrDie();
  int64_t p = *store->PutProblem({.name = "x", .file_path = "x.py", .source = "x"});
  int64_t s = *store->CreateSearch(p, "{}");
  EXPECT_EQ(store->GetSearch(s)->status, SearchStatus::kPending);
  ASSERT_TRUE(store->SetSearchStatus(s, SearchStatus::kFinished, "rounds").ok());
  EXPECT_EQ(store->GetSearch(s)->status, SearchStatus::kFinished);
  EXPECT_EQ(store->GetSearch(s)->stop_reason, "rounds");
  EXPECT_EQ(store->SetSearchStatus(s + 7, SearchStatus::kFailed, "").code(), Code::kNotFound);
  EXPECT_EQ(store->GetSearch(s + 7).status().code(), Code::kNotFound);
  auto r = store->StartRound(s, 2, {5, 3});
  ASSERT_TRUE(r.ok());
  auto again = store->StartRound(s, 2, {9});
  EXPECT_EQ(again->beam, (std::vector<int64_t>{5, 3}));  // first beam kept
  ASSERT_TRUE(store->MarkRoundGenerated(s, 2).ok());
  EXPECT_TRUE((*store->LastRound(s))->generated);
}

}  // namespace
}  // namespace ks::store
