#include "search/orchestrator.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/files.h"
#include "search/report.h"
#include "search/search_setup.h"
#include "search/scripted_evaluator.h"
#include "store/candidate_hash.h"
#include "tests/testing/copy_problem.h"
#include "tests/testing/fake_model.h"
#include "tests/testing/paths.h"
#include "tests/testing/lineage.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using store::CandidateKind;
using store::LineageStore;
using store::SearchStatus;

using ks::testing::FakeModel;
using ks::testing::TempDir;

using ks::testing::CanonicalLineage;

class OrchestratorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto lib = PromptLibrary::Load(ks::testing::SourcePath("prompts"));
    ASSERT_TRUE(lib.ok()) << lib.status().ToString();
    prompts_ = std::move(lib).value();
  }

  std::unique_ptr<LineageStore> Store(const std::string& name) {
    auto s = LineageStore::Open((dir_ / name).string());
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return std::move(s).value();
  }

  SearchConfig Config(int rounds, int ideas, int branches, int beam, int repairs) {
    SearchConfig c;
    c.rounds = rounds;
    c.ideas = ideas;
    c.branches = branches;
    c.beam = beam;
    c.repair_attempts = repairs;
    c.model = "fake";
    c.llm_concurrency = 4;
    return c;
  }

  int64_t NewSearch(LineageStore* store, const SearchConfig& c) {
    auto id = Orchestrator::CreateSearch(store, "copy.py", "class Model: pass\n", ks::testing::CopySignature(), c);
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    return *id;
  }

  TempDir dir_{"ks_orch_test_"};
  PromptLibrary prompts_;
};

TEST_F(OrchestratorTest, ThreeRoundSearchBuildsTheRightLineage) {
  auto store = Store("a.db");
  FakeModel llm;
  ScriptedEvaluator evaluator({});
  std::vector<SearchEvent> events;
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [&](const SearchEvent& e) { events.push_back(e); });
  int64_t id = NewSearch(store.get(), Config(/*rounds=*/2, /*ideas=*/2, /*branches=*/2, /*beam=*/2, 0));
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status, SearchStatus::kFinished);
  EXPECT_EQ(out->stop_reason, "rounds");

  // Round 0: one "straightforward" idea, K candidates from the reference.
  // Rounds 1, 2: B parents x I ideas x K candidates, parents from the stored beam.
  auto cands = *store->ListCandidates(id);
  std::map<int, int> per_round;
  for (const auto& c : cands) {
    per_round[c.round]++;
    ASSERT_TRUE(c.evaluation.has_value());
    ASSERT_TRUE(c.idea_id.has_value());
    auto idea = *store->GetIdea(*c.idea_id);
    EXPECT_EQ(idea.round, c.round);
    if (c.round == 0) {
      EXPECT_FALSE(c.parent_candidate.has_value());
      EXPECT_EQ(idea.text, kFirstIdea);
    } else {
      auto round = *store->GetRound(id, c.round);
      ASSERT_TRUE(round.has_value());
      ASSERT_TRUE(c.parent_candidate.has_value());
      EXPECT_EQ(idea.parent_candidate, c.parent_candidate);
      EXPECT_NE(std::find(round->beam.begin(), round->beam.end(), *c.parent_candidate), round->beam.end());
      auto parent = *store->GetCandidate(*c.parent_candidate);
      EXPECT_LT(parent.round, c.round);
      EXPECT_EQ(parent.evaluation->status, EvalStatus::kCorrect);
    }
  }
  EXPECT_EQ(per_round[0], 2);
  EXPECT_EQ(per_round[1], 8);
  EXPECT_EQ(per_round[2], 8);
  // 2 implement calls, then per round 2 ideas calls + 8 implement calls.
  EXPECT_EQ(llm.calls(), 2 + 2 * (2 + 8));
  EXPECT_EQ(store->Spend(id)->calls, llm.calls());
  EXPECT_EQ(evaluator.evaluated(), 18);

  // The beam of each round is the best of what came before.
  for (int r = 1; r <= 2; ++r) {
    auto round = *store->GetRound(id, r);
    ASSERT_EQ(round->beam.size(), 2u);
    double worst_in_beam = 0;
    for (int64_t b : round->beam) worst_in_beam = std::max(worst_in_beam, *store->GetCandidate(b)->evaluation->median_ms);
    for (const auto& c : cands) {
      if (c.round >= r || std::count(round->beam.begin(), round->beam.end(), c.id)) continue;
      EXPECT_GE(*c.evaluation->median_ms, worst_in_beam * (1 - 0.021)) << "candidate " << c.id << " round " << r;
    }
  }

  // Ideas of round 2 are conditioned on the ideas tried in their lineage.
  for (const auto& prompt : llm.Prompts("ideas")) {
    if (prompt.find("None yet.") != std::string::npos) continue;  // a round-1 parent: nothing tried before
    EXPECT_NE(prompt.find("→ correct"), std::string::npos);
  }
  int conditioned = 0;
  auto round2 = *store->GetRound(id, 2);
  ASSERT_TRUE(round2.has_value());
  for (int64_t parent : round2->beam) {
    auto lineage = *store->Lineage(parent);
    // A round-0 kernel may still be among the fastest (times come from prompt
    // hashes); its lineage is itself.
    ASSERT_GE(lineage.size(), lineage.back().round == 0 ? 1u : 2u);
    EXPECT_EQ(lineage.front().round, 0);
    if (lineage.back().round != 1) continue;
    std::string tried = store->GetIdea(*lineage.back().idea_id)->text;
    for (const auto& prompt : llm.Prompts("ideas"))
      if (prompt.find(tried) != std::string::npos) ++conditioned;
  }
  EXPECT_GT(conditioned, 0);

  // Best: the fastest correct kernel, recorded in the search row and announced.
  auto best = *store->BestCorrect(id);
  EXPECT_EQ(store->GetSearch(id)->best_candidate, best->id);
  EXPECT_EQ(out->best_candidate, best->id);
  int round_events = 0, finished = 0;
  for (const auto& e : events) {
    round_events += e.type == SearchEvent::Type::kRoundStarted;
    finished += e.type == SearchEvent::Type::kFinished;
  }
  EXPECT_EQ(round_events, 3);
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(events.back().type, SearchEvent::Type::kFinished);
  EXPECT_EQ(events.back().evaluated, 18);
}

store::CandidateRow Correct(int64_t id, std::optional<int64_t> idea, double ms, const std::string& hash) {
  store::CandidateRow c;
  c.id = id;
  c.idea_id = idea;
  c.content_hash = hash;
  store::EvaluationRow e;
  e.status = EvalStatus::kCorrect;
  e.median_ms = ms;
  c.evaluation = e;
  return c;
}

TEST(SelectBeamTest, RobustKernelsGoBeforeFasterSpecialisedOnes) {
  auto specialised = [](store::CandidateRow c) {
    Evaluation e;
    e.status = EvalStatus::kCorrect;
    e.robustness = Robustness{{{"scale_up", "broke", "x 1e5"}}, "scale_up"};
    c.evaluation->evaluation_json = EvaluationToJson(e).dump();
    return c;
  };
  std::vector<store::CandidateRow> cands = {specialised(Correct(1, 10, 0.5, "split")), Correct(2, 20, 1.0, "honest"),
                                            specialised(Correct(3, 30, 0.99, "other")), Correct(4, 10, 3.0, "slow")};
  EXPECT_EQ(SelectBeam(cands, 2, 42), (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(SelectBeam(cands, 4, 42), (std::vector<int64_t>{2, 4, 1, 3}));
}

TEST(SelectBeamTest, FastestFirstNearTiesGoToNewIdeasDuplicatesSkipped) {
  std::vector<store::CandidateRow> cands = {
      Correct(1, 10, 1.000, "a"), Correct(2, 10, 1.010, "b"), Correct(3, 20, 1.015, "c"),
      Correct(4, 30, 2.000, "d"), Correct(5, 10, 0.999, "a")};
  // 5 is the fastest; 1 is the same kernel as 5 (skipped); 2 and 3 tie within
  // 2% with 5 and 3's idea is new to the beam, so 3 goes before 2.
  EXPECT_EQ(SelectBeam(cands, 2, 42), (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(SelectBeam(cands, 3, 42), (std::vector<int64_t>{5, 3, 2}));
  // A clearly faster kernel wins even when its idea is already in the beam.
  std::vector<store::CandidateRow> far = {Correct(1, 10, 1.0, "a"), Correct(2, 10, 1.5, "b"),
                                          Correct(3, 20, 2.0, "c")};
  EXPECT_EQ(SelectBeam(far, 2, 42), (std::vector<int64_t>{1, 2}));
  // Incorrect or untimed candidates never enter.
  auto wrong = Correct(9, 50, 0.1, "z");
  wrong.evaluation->status = EvalStatus::kIncorrect;
  EXPECT_EQ(SelectBeam({wrong}, 2, 42), std::vector<int64_t>{});
  // Exact ties are decided by content and seed, not by id order.
  std::vector<store::CandidateRow> tie1 = {Correct(1, 10, 1.0, "p"), Correct(2, 10, 1.0, "q")};
  std::vector<store::CandidateRow> tie2 = {Correct(7, 10, 1.0, "q"), Correct(8, 10, 1.0, "p")};
  auto pick1 = SelectBeam(tie1, 1, 42), pick2 = SelectBeam(tie2, 1, 42);
  EXPECT_EQ(pick1[0] == 1 ? "p" : "q", pick2[0] == 8 ? "p" : "q");
}

TEST_F(OrchestratorTest, BudgetStopsTheSearch) {
  auto store = Store("b.db");
  FakeModel llm;
  ScriptedEvaluator evaluator({});
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  SearchConfig c = Config(3, 2, 2, 2, 0);
  c.budget_calls = 5;
  int64_t id = NewSearch(store.get(), c);
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status, SearchStatus::kFinished);
  EXPECT_EQ(out->stop_reason, "budget: 5 model calls");
  EXPECT_EQ(llm.calls(), 5);
  EXPECT_EQ(store->Spend(id)->calls, 5);
  EXPECT_TRUE(store->PendingCandidates(id)->empty());  // what was generated got evaluated

  // Cost budget: $0.01 a call, $0.035 allows 4 calls.
  FakeModel llm2;
  Orchestrator orch2({store.get(), &llm2, &evaluator, &prompts_}, nullptr);
  c.budget_calls = 0;
  c.budget_cost_usd = 0.035;
  c.llm_concurrency = 1;  // with calls in flight a cost budget can overrun by those calls
  int64_t id2 = NewSearch(store.get(), c);
  auto out2 = orch2.Run(id2);
  ASSERT_TRUE(out2.ok());
  EXPECT_EQ(llm2.calls(), 4);
  EXPECT_EQ(out2->stop_reason, "budget: $0.035");
}

TEST_F(OrchestratorTest, TargetSpeedupStopsTheSearch) {
  auto store = Store("t.db");
  FakeModel llm;
  ScriptedEvaluator evaluator({.eager_ms = 100});  // every kernel is > 90x faster than eager
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  SearchConfig c = Config(3, 2, 2, 2, 0);
  c.target_speedup = 50;
  int64_t id = NewSearch(store.get(), c);
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->stop_reason, "target speedup 50.00x reached");
  EXPECT_EQ(store->LastRound(id)->value().round, 0);
  EXPECT_LE(llm.calls(), 2);  // the second call may be refused once the first kernel hit the target
}

TEST_F(OrchestratorTest, DuplicateCandidatesAreEvaluatedOnce) {
  auto store = Store("d.db");
  FakeModel llm;
  // Every implementation is the same kernel, formatted differently.
  llm.implement_ = [](const LlmRequest&, int occurrence) {
    std::string pad(occurrence, ' ');
    return "```cuda\n// variant " + std::to_string(occurrence) + "\nextern \"C\" __global__ void k(float* out)" + pad +
           "{ out[0] = 1; }\n```\n```json\n{\"launches\": [{\"kernel\": \"k\", \"grid\": [1], \"block\": [1], "
           "\"args\": [\"out\"]}]}\n```\n";
  };
  ScriptedEvaluator evaluator({});
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  int64_t id = NewSearch(store.get(), Config(1, 2, 3, 1, 0));
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto cands = *store->ListCandidates(id);
  EXPECT_EQ(cands.size(), 3u + 2 * 3);
  EXPECT_EQ(evaluator.evaluated(), 1);
  int reused = 0;
  for (const auto& c : cands) {
    ASSERT_TRUE(c.evaluation.has_value());
    EXPECT_EQ(c.evaluation->status, EvalStatus::kCorrect);
    reused += c.evaluation->reused_from.has_value();
  }
  EXPECT_EQ(reused, static_cast<int>(cands.size()) - 1);
  // A new search of the same problem reuses the stored evaluation too.
  Orchestrator orch2({store.get(), &llm, &evaluator, &prompts_}, nullptr);
  int64_t id2 = NewSearch(store.get(), Config(0, 1, 2, 1, 0));
  ASSERT_TRUE(orch2.Run(id2).ok());
  EXPECT_EQ(evaluator.evaluated(), 1);
}

TEST_F(OrchestratorTest, FailedCandidatesAreRepaired) {
  auto store = Store("r.db");
  FakeModel llm;
  llm.implement_ = [](const LlmRequest& r, int occ) { return FakeModel::Kernel(r.prompt, occ, "compile_error"); };
  ScriptedEvaluator evaluator({});
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  int64_t id = NewSearch(store.get(), Config(0, 1, 2, 1, /*repairs=*/1));
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto cands = *store->ListCandidates(id);
  int repairs = 0;
  for (const auto& c : cands) {
    if (c.kind != CandidateKind::kRepair) {
      EXPECT_EQ(c.evaluation->status, EvalStatus::kCompileError);
      EXPECT_TRUE(c.repair_attempted);
      continue;
    }
    ++repairs;
    ASSERT_TRUE(c.parent_candidate.has_value());
    auto failed = *store->GetCandidate(*c.parent_candidate);
    EXPECT_EQ(failed.idea_id, c.idea_id);
    EXPECT_EQ(c.repair_depth, 1);
    EXPECT_EQ(c.evaluation->status, EvalStatus::kCorrect);
  }
  EXPECT_EQ(repairs, 2);
  auto repair_prompts = llm.Prompts("repair");
  ASSERT_EQ(repair_prompts.size(), 2u);
  EXPECT_NE(repair_prompts[0].find("scripted failure"), std::string::npos);  // the compile log reached the model
  EXPECT_TRUE(out->best_candidate.has_value());
}

TEST_F(OrchestratorTest, UnparsableReplyIsAFailedCandidateNotAnError) {
  auto store = Store("u.db");
  FakeModel llm;
  llm.implement_ = [](const LlmRequest&, int) { return std::string("I cannot do that."); };
  ScriptedEvaluator evaluator({});
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  int64_t id = NewSearch(store.get(), Config(0, 1, 1, 1, 0));
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  auto cands = *store->ListCandidates(id);
  ASSERT_EQ(cands.size(), 1u);
  EXPECT_EQ(cands[0].raw_response, "I cannot do that.");
  EXPECT_EQ(cands[0].evaluation->status, EvalStatus::kCompileError);
  EXPECT_EQ(evaluator.evaluated(), 0);
}

TEST_F(OrchestratorTest, EvaluatorFailureFailsTheSearchResumably) {
  auto store = Store("f.db");
  FakeModel llm;
  ScriptedEvaluator broken({.fail_after = 0});
  Orchestrator orch({store.get(), &llm, &broken, &prompts_}, nullptr);
  int64_t id = NewSearch(store.get(), Config(1, 1, 2, 1, 0));
  auto out = orch.Run(id);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), Code::kUnavailable);
  EXPECT_EQ(store->GetSearch(id)->status, SearchStatus::kFailed);
  int calls = llm.calls();
  ScriptedEvaluator good({});
  Orchestrator again({store.get(), &llm, &good, &prompts_}, nullptr);
  auto resumed = again.Run(id);
  ASSERT_TRUE(resumed.ok()) << resumed.status().ToString();
  EXPECT_EQ(resumed->status, SearchStatus::kFinished);
  EXPECT_EQ(llm.calls() - calls, 1 + 2);  // round 1 only: round 0's calls were not repeated
}

TEST_F(OrchestratorTest, ResumeAfterCancelMidRoundRepeatsNothingFinished) {
  SearchConfig c = Config(2, 2, 2, 2, 1);
  c.llm_concurrency = 2;
  auto ref_store = Store("ref.db");
  FakeModel ref_llm;
  ScriptedEvaluator ref_eval({});
  Orchestrator ref({ref_store.get(), &ref_llm, &ref_eval, &prompts_}, nullptr);
  int64_t ref_id = NewSearch(ref_store.get(), c);
  ASSERT_TRUE(ref.Run(ref_id).ok());

  for (int cancel_at : {1, 7, 13}) {
    auto store = Store("resume" + std::to_string(cancel_at) + ".db");
    FakeModel llm;
    ScriptedEvaluator evaluator({});
    int64_t id = NewSearch(store.get(), c);
    int total_calls = 0;
    for (int attempt = 0; attempt < 10; ++attempt) {
      Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
      llm.after_call_ = nullptr;
      if (attempt == 0) llm.after_call_ = [&orch, cancel_at](int calls) {
        if (calls >= cancel_at) orch.Cancel();
      };
      auto out = orch.Run(id);
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      total_calls += out->llm_calls_now;
      if (out->status == SearchStatus::kFinished) break;
      EXPECT_EQ(out->status, SearchStatus::kCancelled);
    }
    EXPECT_EQ(store->GetSearch(id)->status, SearchStatus::kFinished);
    EXPECT_EQ(CanonicalLineage(store.get(), id), CanonicalLineage(ref_store.get(), ref_id)) << cancel_at;
    // Nothing finished was repeated: as many model calls and evaluations as one run.
    EXPECT_EQ(llm.calls(), ref_llm.calls()) << cancel_at;
    EXPECT_EQ(total_calls, ref_llm.calls());
    EXPECT_EQ(evaluator.evaluated(), ref_eval.evaluated()) << cancel_at;
  }
}

// `search --resume ID --rounds N` on a finished search (issue 32): it goes on
// from its beam, round after round, to the lineage a search created with N
// rounds builds, and no model call is made twice.
TEST_F(OrchestratorTest, AFinishedSearchGivenMoreRoundsGoesOnLikeALongerOne) {
  auto ref_store = Store("ref.db");
  FakeModel ref_llm;
  ScriptedEvaluator ref_eval({});
  Orchestrator ref({ref_store.get(), &ref_llm, &ref_eval, &prompts_}, nullptr);
  int64_t ref_id = NewSearch(ref_store.get(), Config(3, 2, 2, 2, 1));
  ASSERT_TRUE(ref.Run(ref_id).ok());

  auto store = Store("short.db");
  FakeModel llm;
  ScriptedEvaluator evaluator({});
  std::vector<SearchEvent> events;
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [&](const SearchEvent& e) { events.push_back(e); });
  int64_t id = NewSearch(store.get(), Config(1, 2, 2, 2, 1));
  auto first = orch.Run(id);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->stop_reason, kStopRounds);
  const int first_calls = llm.calls();

  // Run again as it is: nothing to do, and its end names its last round.
  events.clear();
  auto again = orch.Run(id);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->status, SearchStatus::kFinished);
  EXPECT_EQ(llm.calls(), first_calls);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type, SearchEvent::Type::kFinished);
  EXPECT_EQ(events.back().round, 1);
  EXPECT_EQ(SearchEventToJson(events.back())["round"], 1);

  // The total may only grow past what it ran.
  auto same = SetSearchRounds(store.get(), id, 1);
  ASSERT_FALSE(same.ok());
  EXPECT_EQ(same.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(same.status().message(), ::testing::HasSubstr("ran its 1 rounds already"));
  EXPECT_EQ(store->GetSearch(id)->status, SearchStatus::kFinished);  // untouched

  auto change = SetSearchRounds(store.get(), id, 3);
  ASSERT_TRUE(change.ok()) << change.status().ToString();
  EXPECT_TRUE(change->reopened);
  EXPECT_EQ(change->Describe(id), fmt::format("search {} ran its 1 rounds; running rounds 2 to 3 (3 in all)", id));
  EXPECT_EQ(store->GetSearch(id)->status, SearchStatus::kPending);
  events.clear();
  auto more = orch.Run(id);
  ASSERT_TRUE(more.ok()) << more.status().ToString();
  EXPECT_EQ(more->status, SearchStatus::kFinished);
  EXPECT_EQ(more->stop_reason, kStopRounds);
  EXPECT_EQ(more->llm_calls_reused, 0);  // earlier rounds are complete: not even looked up
  std::vector<int> started;
  for (const auto& e : events) {
    EXPECT_GE(e.round, 1) << SearchEventTypeName(e.type);
    if (e.type == SearchEvent::Type::kRoundStarted) started.push_back(e.round);
  }
  EXPECT_EQ(started, (std::vector<int>{2, 3}));

  EXPECT_EQ(CanonicalLineage(store.get(), id), CanonicalLineage(ref_store.get(), ref_id));
  EXPECT_EQ(llm.calls(), ref_llm.calls());  // no model call twice
  EXPECT_EQ(evaluator.evaluated(), ref_eval.evaluated());
  auto calls = store->ListLlmCalls(id, false);
  auto ref_calls = ref_store->ListLlmCalls(ref_id, false);
  ASSERT_TRUE(calls.ok() && ref_calls.ok());
  std::multiset<std::string> hashes, ref_hashes;
  for (const auto& c : *calls) hashes.insert(c.record.role + " " + c.prompt_sha256);
  for (const auto& c : *ref_calls) ref_hashes.insert(c.record.role + " " + c.prompt_sha256);
  EXPECT_EQ(hashes, ref_hashes);
}

TEST_F(OrchestratorTest, RoundsOnlyContinueASearchThatRanOutOfRounds) {
  auto store = Store("r.db");
  FakeModel llm;
  ScriptedEvaluator evaluator({});
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, nullptr);
  SearchConfig c = Config(3, 2, 2, 2, 0);
  c.budget_calls = 3;
  int64_t spent = NewSearch(store.get(), c);
  ASSERT_TRUE(orch.Run(spent).ok());
  auto r = SetSearchRounds(store.get(), spent, 5);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("finished: budget: 3 model calls; more rounds would stop"));
  auto row = store->GetSearch(spent);
  SearchConfig stored = *SearchConfigFromJson(nlohmann::json::parse(row->config_json));
  EXPECT_EQ(stored.rounds, 3);  // untouched
  EXPECT_THAT(FinishedSearchNote(*row, stored, "resume {id} --rounds {rounds}"),
              ::testing::HasSubstr("(budget: 3 model calls); nothing to resume"));

  // A search that has not finished keeps its state with the new total.
  int64_t pending = NewSearch(store.get(), Config(3, 2, 2, 2, 0));
  auto lower = SetSearchRounds(store.get(), pending, 1);
  ASSERT_TRUE(lower.ok()) << lower.status().ToString();
  EXPECT_FALSE(lower->reopened);
  EXPECT_EQ(lower->Describe(pending), fmt::format("search {}: 1 rounds in all (was 3)", pending));
  EXPECT_EQ(store->GetSearch(pending)->status, SearchStatus::kPending);
  EXPECT_FALSE(SetSearchRounds(store.get(), pending, -1).ok());
  EXPECT_EQ(SetSearchRounds(store.get(), 999, 4).status().code(), Code::kNotFound);

  // What a user who resumes a finished search without rounds is told.
  ASSERT_TRUE(orch.Run(pending).ok());
  row = store->GetSearch(pending);
  ASSERT_EQ(row->status, SearchStatus::kFinished);
  stored = *SearchConfigFromJson(nlohmann::json::parse(row->config_json));
  EXPECT_EQ(FinishedSearchNote(*row, stored, "resume {id} --rounds {rounds}"),
            fmt::format("search {} is finished: it ran its 1 rounds; nothing to resume. To add rounds, give the new "
                        "total: `resume {} --rounds 2` runs round 2",
                        pending, pending));
}

TEST_F(OrchestratorTest, GenerateOnlyAndEvaluatePendingMatchAContinuousRun) {
  SearchConfig c = Config(2, 2, 2, 2, 1);
  // Some implementations fail so that repairs cross the split as well.
  auto implement = [](const LlmRequest& r, int occ) {
    return FakeModel::Kernel(r.prompt, occ, occ == 1 ? "incorrect" : "");
  };
  auto ref_store = Store("cont.db");
  FakeModel ref_llm;
  ref_llm.implement_ = implement;
  ScriptedEvaluator ref_eval({});
  Orchestrator ref({ref_store.get(), &ref_llm, &ref_eval, &prompts_}, nullptr);
  int64_t ref_id = NewSearch(ref_store.get(), c);
  ASSERT_TRUE(ref.Run(ref_id).ok());

  auto store = Store("split.db");
  FakeModel llm;
  llm.implement_ = implement;
  ScriptedEvaluator evaluator({});
  int64_t id = NewSearch(store.get(), c);
  int steps = 0;
  for (; steps < 20; ++steps) {
    Orchestrator model_side({store.get(), &llm, nullptr, &prompts_}, nullptr);
    auto gen = model_side.Run(id, Orchestrator::Mode::kGenerateOnly);
    ASSERT_TRUE(gen.ok()) << gen.status().ToString();
    if (gen->status == SearchStatus::kFinished) break;
    EXPECT_GT(gen->pending, 0);
    Orchestrator gpu_side({store.get(), nullptr, &evaluator, nullptr}, nullptr);
    auto ev = gpu_side.EvaluatePending(id);
    ASSERT_TRUE(ev.ok()) << ev.status().ToString();
    EXPECT_EQ(ev->evaluated_now, gen->pending);
  }
  EXPECT_GE(steps, 6);  // 3 rounds, each with a repair step
  EXPECT_EQ(CanonicalLineage(store.get(), id), CanonicalLineage(ref_store.get(), ref_id));
  EXPECT_EQ(llm.calls(), ref_llm.calls());
  EXPECT_EQ(evaluator.evaluated(), ref_eval.evaluated());
}

TEST_F(OrchestratorTest, WallTimeIsStoredAndTheBudgetCountsEveryRun) {
  SearchConfig c = Config(2, 2, 1, 1, 0);
  c.budget_minutes = 10;
  auto store = Store("wall.db");
  int64_t id = NewSearch(store.get(), c);
  EXPECT_EQ(store->GetSearch(id)->elapsed_s, 0);

  // A first run, cancelled after a few calls, leaves its wall time in the store.
  FakeModel llm;
  ScriptedEvaluator evaluator({.delay_ms = 20});
  {
    Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
    llm.after_call_ = [&orch](int calls) {
      if (calls >= 3) orch.Cancel();
    };
    auto out = orch.Run(id);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(out->status, SearchStatus::kCancelled);
    double stored = store->GetSearch(id)->elapsed_s;
    EXPECT_GT(stored, 0);
    EXPECT_LE(stored, out->wall_s + 1e-6);
    EXPECT_NEAR(out->total_elapsed_s, out->wall_s, 1e-9);  // the first run: nothing before it
    llm.after_call_ = nullptr;  // orch goes
  }
  // Evaluating what is pending (the GPU side of a split search) adds its time.
  double before = store->GetSearch(id)->elapsed_s;
  {
    Orchestrator gpu_side({store.get(), nullptr, &evaluator, nullptr}, nullptr);
    auto out = gpu_side.EvaluatePending(id);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_GT(store->GetSearch(id)->elapsed_s, before);
    EXPECT_GE(out->total_elapsed_s, before);
  }
  // Earlier processes spent the budget (as if they had run for 10 minutes): the
  // next run stops before asking the model anything, however short it is.
  ASSERT_TRUE(store->AddSearchElapsed(id, 600).ok());
  int calls = llm.calls();
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status, SearchStatus::kFinished);
  EXPECT_EQ(out->stop_reason, "budget: 10 minutes");
  EXPECT_EQ(llm.calls(), calls);
  EXPECT_GE(out->total_elapsed_s, 600);
}

TEST_F(OrchestratorTest, SeedKernelStartsRoundZero) {
  auto store = Store("s.db");
  FakeModel llm;
  ScriptedEvaluator evaluator({});
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  SearchConfig c = Config(1, 1, 1, 1, 0);
  c.seed_source = "extern \"C\" __global__ void seed(float* out) { /* FAKE_MS(5) */ }";
  c.seed_plan = R"({"launches": [{"kernel": "seed", "grid": [1], "block": [1], "args": ["out"]}]})";
  c.seed_label = "seed.cu";
  int64_t id = NewSearch(store.get(), c);
  ASSERT_TRUE(orch.Run(id).ok());
  auto cands = *store->ListCandidates(id);
  ASSERT_EQ(cands.size(), 2u);
  EXPECT_EQ(cands[0].kind, CandidateKind::kSeed);
  EXPECT_EQ(cands[1].parent_candidate, cands[0].id);
  EXPECT_EQ(llm.Prompts("implement").size(), 1u);
  EXPECT_NE(llm.Prompts("ideas")[0].find("void seed"), std::string::npos);
}

TEST(SearchConfigTest, JsonRoundTripAndValidation) {
  SearchConfig c;
  c.rounds = 5;
  c.role_models["ideas"] = "openai:o3";
  c.gpu.name = "H100";
  auto back = SearchConfigFromJson(SearchConfigToJson(c));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->rounds, 5);
  EXPECT_EQ(back->role_models.at("ideas"), "openai:o3");
  EXPECT_EQ(back->gpu.name, "H100");
  EXPECT_FALSE(SearchConfigFromJson({{"roundz", 3}}).ok());
  EXPECT_FALSE(SearchConfigFromJson({{"beam", 0}}).ok());
  EXPECT_FALSE(SearchConfigFromJson({{"role_models", {{"writer", "x"}}}}).ok());
  // The implement mode: stored by name, read back as the mode; another name is refused.
  c.implement = ImplementMode::kAgent;
  EXPECT_EQ(SearchConfigToJson(c).at("implement"), "agent");
  EXPECT_EQ(SearchConfigFromJson(SearchConfigToJson(c))->implement, ImplementMode::kAgent);
  EXPECT_EQ(SearchConfigFromJson(nlohmann::json::object())->implement, ImplementMode::kOneShot);
  auto bad = SearchConfigFromJson({{"implement", "agents"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("implement must be oneshot or agent, not 'agents'"), std::string::npos)
      << bad.status().message();
}

// Issue 35: the contract is an enum, stored by its canonical name; the
// aliases of older stores read back as their contract, and an unknown stored
// name is an error that names it.
TEST(SearchConfigTest, ThePrecisionContractIsStoredByNameAndReadBack) {
  SearchConfig c;
  EXPECT_EQ(c.precision, Contract::kHighest);
  EXPECT_EQ(SearchConfigToJson(c).at("precision"), "highest");
  for (Contract k : {Contract::kHighest, Contract::kHigh, Contract::kMedium, Contract::kKernelBench}) {
    c.precision = k;
    EXPECT_EQ(SearchConfigToJson(c).at("precision"), ContractName(k));
    EXPECT_EQ(SearchConfigFromJson(SearchConfigToJson(c))->precision, k);
  }
  EXPECT_EQ(SearchConfigFromJson({{"precision", "fp32"}})->precision, Contract::kHighest);
  EXPECT_EQ(SearchConfigFromJson({{"precision", "tf32"}})->precision, Contract::kHigh);
  EXPECT_EQ(SearchConfigFromJson(nlohmann::json::object())->precision, Contract::kHighest);
  auto bad = SearchConfigFromJson({{"precision", "fp16"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("highest, high, medium or kernelbench"), std::string::npos)
      << bad.status().message();
  EXPECT_NE(bad.status().message().find("'fp16'"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

using ::testing::HasSubstr;

// A two-launch candidate whose scripted evaluation carries per-launch times
// (3/4 and 1/4 of the plan) and registers (64 at 256 threads: register-bound;
// 32 at 1024 threads: thread-bound).
std::string TwoLaunchKernel(const std::string& prompt, int occurrence) {
  std::string h = Sha256Hex(prompt + std::to_string(occurrence)).substr(0, 8);
  double ms = 0.2 + (std::stoul(h.substr(0, 6), nullptr, 16) % 1000) / 1000.0;
  return "```cuda\n// FAKE_MS(" + std::to_string(ms) + ") FAKE_LAUNCH_MS(" + std::to_string(0.75 * ms) + ", " +
         std::to_string(0.25 * ms) + ") FAKE_REGISTERS(64, 32)\n"
         "extern \"C\" __global__ void stats_" + h + "(const float* x, float* s, int n) {}\n"
         "extern \"C\" __global__ void apply_" + h + "(const float* x, const float* s, float* out, int n) {}\n```\n"
         "```json\n{\"launches\": [{\"kernel\": \"stats_" + h +
         "\", \"grid\": [4], \"block\": [256], \"args\": [\"x\", \"s\", \"x.numel\"]},\n"
         " {\"kernel\": \"apply_" + h + "\", \"grid\": [1], \"block\": [1024], \"args\": [\"x\", \"s\", \"out\", \"x.numel\"]}],\n"
         " \"scratch\": [{\"name\": \"s\", \"bytes\": 64}]}\n```\n";
}

TEST_F(OrchestratorTest, IdeasPromptsShowPerLaunchFiguresOccupancyAndTheBestKernels) {
  auto store = Store("p.db");
  FakeModel llm;
  llm.implement_ = [](const LlmRequest& r, int occ) { return TwoLaunchKernel(r.prompt, occ); };
  ScriptedEvaluator evaluator({});
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  int64_t id = NewSearch(store.get(), Config(/*rounds=*/2, /*ideas=*/2, /*branches=*/1, /*beam=*/1, 0));
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();

  // The figures are stored with each evaluation.
  auto cands = *store->ListCandidates(id);
  ASSERT_EQ(cands.size(), 5u);
  for (const auto& c : cands) {
    auto e = EvaluationFromJson(nlohmann::json::parse(c.evaluation->evaluation_json));
    ASSERT_TRUE(e.ok());
    ASSERT_EQ(e->launch_profiles.size(), 2u) << c.id;
    EXPECT_EQ(e->launch_profiles[0].occupancy->limiter, "registers");
    EXPECT_EQ(e->launch_profiles[1].occupancy->limiter, "threads");
  }

  auto ideas = llm.Prompts("ideas");
  ASSERT_EQ(ideas.size(), 2u);  // one parent in rounds 1 and 2
  for (const auto& p : ideas) {
    // The starting point's launches, each on its own, with occupancy and its limit.
    EXPECT_THAT(p, HasSubstr("(75% of the plan)"));
    EXPECT_THAT(p, HasSubstr("occupancy 4 blocks/SM of 256 threads (50% of the SM's warps), 64 registers/thread"));
    EXPECT_THAT(p, HasSubstr("limited by registers (registers allow 4"));
    EXPECT_THAT(p, HasSubstr("occupancy 2 blocks/SM of 1024 threads (100% of the SM's warps)"));
    EXPECT_THAT(p, HasSubstr("limited by threads"));
    EXPECT_THAT(p, HasSubstr("## The best kernels so far in this search"));
    EXPECT_THAT(p, HasSubstr("(the starting point below)"));
  }
  // Round 2: the best kernels of rounds 0 and 1, fastest first, with their
  // ideas; the ideas tried from round 1 with their measured figures.
  const std::string& r2 = ideas[1];
  std::vector<std::pair<double, int64_t>> correct;
  for (const auto& c : cands)
    if (c.round < 2) correct.push_back({*c.evaluation->median_ms, c.id});
  std::sort(correct.begin(), correct.end());
  ASSERT_EQ(correct.size(), 3u);
  size_t section = r2.find("## The best kernels so far in this search");
  ASSERT_NE(section, std::string::npos);
  for (size_t i = 0; i < correct.size(); ++i) {
    size_t at = r2.find(fmt::format("\n{}. ", i + 1), section);
    ASSERT_NE(at, std::string::npos) << r2;
    std::string line = r2.substr(at + 1, r2.find('\n', at + 1) - at - 1);
    EXPECT_THAT(line, HasSubstr(fmt::format("{:.4f} ms, ", correct[i].first))) << line;
    EXPECT_THAT(line, HasSubstr("launches: `stats_"));
  }
  for (const auto& c : cands) {
    if (c.round != 1) continue;
    std::string idea = store->GetIdea(*c.idea_id)->text;
    EXPECT_THAT(r2, HasSubstr("   idea: " + idea));                    // in the table of the best
    EXPECT_THAT(r2, HasSubstr("- " + idea + " → correct"));            // and among the ideas tried
  }
  EXPECT_THAT(r2, HasSubstr("; measured: "));
  EXPECT_THAT(r2, HasSubstr("x eager, "));
  EXPECT_THAT(r2, HasSubstr("launches: `stats_"));
  EXPECT_THAT(r2, HasSubstr("(4 blocks/SM, registers-limited)"));
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

// Hardware counters of each round's best kernels reach the next round's
// prompts; where the evaluator has none, the search goes on with one note.
TEST_F(OrchestratorTest, CountersOfEachRoundsBestReachTheNextPrompts) {
  auto store = Store("counters.db");
  FakeModel llm;
  ScriptedEvaluatorOptions opts;
  LaunchCounters l;
  l.kernel = "copy";
  l.dram_pct = 61;
  l.l2_hit_pct = 12;
  l.tensor_pct = 0;
  l.stalls = {{"long_scoreboard", 0.48}, {"barrier", 0.21}};
  opts.counters = CounterReport{{l}, "", 0.5};
  ScriptedEvaluator evaluator(opts);
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [](const SearchEvent&) {});
  SearchConfig c = Config(/*rounds=*/1, /*ideas=*/2, /*branches=*/2, /*beam=*/1, 0);
  c.profile_top = 1;
  int64_t id = NewSearch(store.get(), c);
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  // One per round, once the round is evaluated: its fastest.
  EXPECT_EQ(evaluator.profiled(), 2);
  int with_counters = 0;
  auto cands = store->ListCandidates(id);
  ASSERT_TRUE(cands.ok());
  for (const auto& cand : *cands)
    if (cand.evaluation && cand.evaluation->evaluation_json.find("\"counters\"") != std::string::npos) ++with_counters;
  EXPECT_EQ(with_counters, evaluator.profiled());
  bool shown = false;
  for (const auto& prompt : llm.Prompts("ideas"))
    shown = shown || prompt.find("stalls: long scoreboard 48%, barrier 21%") != std::string::npos;
  EXPECT_TRUE(shown) << "the ideas prompt of round 1 shows its parent's counter digest";
  // The report shows the digest beside each profiled candidate.
  auto data = ReportData(store.get(), id);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  int digests = 0;
  for (const auto& rc : (*data)["candidates"])
    if (rc.value("counters", std::string()).find("stalls: long scoreboard 48%") != std::string::npos) ++digests;
  EXPECT_EQ(digests, 2);
}

TEST_F(OrchestratorTest, WithoutCountersTheSearchGoesOnWithOneNote) {
  auto store = Store("nocounters.db");
  FakeModel llm;
  ScriptedEvaluator evaluator({});
  std::vector<SearchEvent> events;
  Orchestrator orch({store.get(), &llm, &evaluator, &prompts_}, [&](const SearchEvent& e) { events.push_back(e); });
  int64_t id = NewSearch(store.get(), Config(/*rounds=*/1, /*ideas=*/2, /*branches=*/2, /*beam=*/1, 0));
  auto out = orch.Run(id);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->status, SearchStatus::kFinished);
  int notes = 0;
  for (const auto& e : events)
    if (e.type == SearchEvent::Type::kNote) {
      ++notes;
      EXPECT_THAT(e.text, ::testing::HasSubstr("reads no hardware counters"));
    }
  EXPECT_EQ(notes, 1) << "said once, not per candidate";
  for (const auto& prompt : llm.Prompts("ideas")) EXPECT_EQ(prompt.find("Hardware counters"), std::string::npos);
}

}  // namespace
}  // namespace ks
