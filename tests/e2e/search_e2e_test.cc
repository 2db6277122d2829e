// End-to-end tests of `kernelsearch search` as a user runs it: the real binary,
// a `command:` model (tests/testing/fake_model.sh, which answers each
// prompt with a reply derived from the prompt's hash, so every process gets the
// same answers) and the scripted fake evaluator, whose log file records every
// evaluation across processes. No torch and no GPU: the problem's signature
// comes from a --signature file.
//
//  - kill -9 mid-round, twice, then --resume: the search finishes with the
//    lineage of an uninterrupted run, without repeating a model call or an
//    evaluation that was finished (stored) when the process died;
//  - alternating `search --generate-only` and `evaluate-pending` gives the
//    lineage of an uninterrupted run;
//  - device facts an evaluator reports reach the search's config and prompts;
//  - a finished search resumed with more --rounds goes on to the lineage of a
//    search created with that many rounds; resumed without, it says so.
#include <unistd.h>

#include <cstdio>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/signature.h"
#include "store/lineage_store.h"
#include "tests/testing/copy_problem.h"
#include "tests/testing/fake_model.h"
#include "tests/testing/lineage.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using store::LineageStore;
using store::SearchStatus;

const std::string kBinary = ks::testing::CliBinary();
const std::string kModel = ks::testing::FakeModelCommand();

using ks::testing::CanonicalLineage;

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

// The last `{"event": "outcome", ...}` line of a --json run.
nlohmann::json Outcome(const std::string& out) {
  nlohmann::json last;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    auto j = nlohmann::json::parse(out.substr(pos, end - pos), nullptr, false);
    if (j.is_object() && j.value("event", "") == "outcome") last = j;
    pos = end + 1;
  }
  return last;
}

class SearchE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto copy = ks::testing::WriteCopyProblem(dir_.path());
    problem_ = copy.file;
    signature_ = copy.signature;
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  std::string StderrOf(const std::string& name) const {
    auto text = ReadFile(Path(name));
    return text.ok() ? *text : text.status().ToString();
  }

  // A fake evaluator config logging to `log`; `extra` is merged in.
  std::string EvaluatorSpec(const std::string& name, const std::string& log, double delay_ms,
                            const nlohmann::json& extra = nlohmann::json::object()) {
    nlohmann::json j = {{"log", log}, {"delay_ms", delay_ms}, {"eager_ms", 2.0}};
    j.update(extra);
    std::string path = Path(name);
    EXPECT_TRUE(WriteFile(path, j.dump()).ok());
    return "fake:" + path;
  }

  // `kernelsearch search` for a new search: `rounds` + 1 rounds in all, `ideas`
  // ideas x 2 branches (a model that answers a prompt the same way makes the
  // two identical: evaluated once), beam 2, one repair, 2 model calls at a time.
  std::vector<std::string> NewSearchArgs(const std::string& db, int rounds, int ideas) const {
    return {kBinary,    "search",     problem_,  "--db",     db,       "--signature",   signature_,
            "--model",  kModel,       "--rounds", std::to_string(rounds), "--ideas", std::to_string(ideas),
            "--branches", "2",        "--beam",  "2",        "--repair", "1",         "--concurrency",
            "2",        "--gpu",      "Fake GPU 1", "--quiet"};
  }
  std::vector<std::string> ResumeArgs(const std::string& db, int64_t id) const {
    return {kBinary, "search", "--resume", std::to_string(id), "--db", db, "--quiet"};
  }

  SubprocessResult Run(std::vector<std::string> argv) {
    SubprocessOptions o;
    o.argv = std::move(argv);
    o.timeout_s = 300;
    auto r = RunSubprocess(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }

  // Runs a search command to its end; returns its outcome JSON.
  nlohmann::json RunToOutcome(std::vector<std::string> argv) {
    argv.push_back("--json");
    SubprocessResult r = Run(argv);
    EXPECT_TRUE(r.Succeeded()) << r.Describe() << "\nstderr: " << r.err;
    nlohmann::json out = Outcome(r.out);
    EXPECT_TRUE(out.is_object()) << "no outcome line in: " << r.out;
    return out;
  }

  // Starts a search command and kill -9s it once the fake evaluator's log has
  // at least `evaluations` lines. Fails the test if the process ended first.
  void KillAfterEvaluations(const std::vector<std::string>& argv, const std::string& log, size_t evaluations) {
    auto child = ChildProcess::Start(argv, {}, Path("killed.stderr"));
    ASSERT_TRUE(child.ok()) << child.status().ToString();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (ReadLines(log).size() < evaluations) {
      auto ended = child->TryReap();
      ASSERT_FALSE(ended.has_value()) << "the search ended (" << *ended << ") before " << evaluations
                                      << " evaluations; stderr: " << StderrOf("killed.stderr");
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no progress in 120 s";
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::string how = child->Kill();
    EXPECT_NE(how.find("signal 9"), std::string::npos) << how;
  }

  ks::testing::TempDir dir_{"ks_search_e2e_", ks::testing::TempDir::OnFailure::kKeep};
  std::string problem_;
  std::string signature_;
};

TEST_F(SearchE2eTest, KillNineMidRoundThenResumeRepeatsNothingFinished) {
  // The uninterrupted run.
  const std::string ref_db = Path("ref.db"), ref_log = Path("ref.log");
  std::vector<std::string> ref_args = NewSearchArgs(ref_db, 3, 3);
  ref_args.insert(ref_args.end(), {"--evaluator", EvaluatorSpec("ref_eval.json", ref_log, 0)});
  nlohmann::json ref_out = RunToOutcome(ref_args);
  ASSERT_EQ(ref_out.value("status", ""), "finished") << ref_out.dump();
  const int64_t ref_id = ref_out.value("search", int64_t{0});
  const std::vector<std::string> ref_evals = ReadLines(ref_log);
  // Every distinct kernel is evaluated once; there is enough work to kill it twice.
  ASSERT_EQ(std::set<std::string>(ref_evals.begin(), ref_evals.end()).size(), ref_evals.size());
  ASSERT_GE(ref_evals.size(), 12u);

  // The same search, kill -9'd twice mid-round. The evaluator is slowed down so
  // that the kills land while work is in flight.
  const std::string db = Path("killed.db"), log = Path("killed.log");
  const std::string spec = EvaluatorSpec("eval.json", log, 40);
  std::vector<std::string> first = NewSearchArgs(db, 3, 3);
  first.insert(first.end(), {"--evaluator", spec});
  std::vector<std::string> resume = ResumeArgs(db, 1);
  resume.insert(resume.end(), {"--evaluator", spec});

  // Per kill: the kernels whose evaluation was stored when the process died,
  // and how many lines the evaluator's log had then.
  std::vector<std::pair<std::set<std::string>, size_t>> kills;
  for (size_t kill_at : {size_t{3}, ref_evals.size() / 2 + 2}) {
    KillAfterEvaluations(kill_at == 3 ? first : resume, log, kill_at);
    if (HasFatalFailure()) return;
    auto store = LineageStore::Open(db);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto search = (*store)->GetSearch(1);
    ASSERT_TRUE(search.ok()) << search.status().ToString();
    EXPECT_EQ(search->status, SearchStatus::kRunning) << "killed, so never marked finished";
    auto cands = (*store)->ListCandidates(1);
    ASSERT_TRUE(cands.ok()) << cands.status().ToString();
    std::set<std::string> stored;
    for (const auto& c : *cands)
      if (c.evaluation && !c.evaluation->reused_from) stored.insert(c.content_hash);
    kills.emplace_back(std::move(stored), ReadLines(log).size());
  }
  ASSERT_FALSE(kills.front().first.empty());

  nlohmann::json out = RunToOutcome(resume);
  EXPECT_EQ(out.value("status", ""), "finished") << out.dump();
  EXPECT_EQ(out.value("stop_reason", ""), "rounds");

  // The lineage of the uninterrupted run.
  EXPECT_EQ(CanonicalLineage(db, 1), CanonicalLineage(ref_db, ref_id));

  // No finished model call was repeated: a call is stored when it finishes, so
  // one repeated would be one row too many (a call in flight at a kill was never
  // stored, and is made once, on resume).
  auto store = LineageStore::Open(db);
  auto ref_store = LineageStore::Open(ref_db);
  ASSERT_TRUE(store.ok() && ref_store.ok());
  auto calls = (*store)->ListLlmCalls(1, /*finished_only=*/false);
  auto ref_calls = (*ref_store)->ListLlmCalls(ref_id, false);
  ASSERT_TRUE(calls.ok() && ref_calls.ok());
  EXPECT_EQ(calls->size(), ref_calls->size());
  std::multiset<std::string> slots, ref_slots;
  for (const auto& c : *calls) slots.insert(c.record.role + " " + c.prompt_sha256);
  for (const auto& c : *ref_calls) ref_slots.insert(c.record.role + " " + c.prompt_sha256);
  EXPECT_EQ(slots, ref_slots);

  // No finished evaluation was repeated: after each kill, the evaluator never saw
  // a kernel whose evaluation was stored when that process died. (Evaluations in
  // flight at a kill are done again, so the log may hold those twice.)
  const std::vector<std::string> evals = ReadLines(log);
  for (const auto& [stored, lines] : kills)
    for (size_t i = lines; i < evals.size(); ++i)
      EXPECT_EQ(stored.count(evals[i]), 0u) << "evaluated again after it was stored: " << evals[i];
  EXPECT_EQ(std::set<std::string>(evals.begin(), evals.end()),
            std::set<std::string>(ref_evals.begin(), ref_evals.end()));
  std::printf("reference: %zu evaluations, %zu model calls; killed at %zu and %zu evaluations (%zu and %zu stored); "
              "%zu evaluations in all\n",
              ref_evals.size(), ref_calls->size(), kills[0].second, kills[1].second, kills[0].first.size(),
              kills[1].first.size(), evals.size());
}

// Issue 32: `search --resume ID --rounds N` on a finished search of R rounds
// runs rounds R+1..N from its beam, to the lineage of a search created with
// N rounds, repeating no model call and no evaluation; without --rounds, or
// with too few, it says what it is and how to add rounds, and runs nothing.
TEST_F(SearchE2eTest, AFinishedSearchResumedWithMoreRoundsGoesOnLikeALongerOne) {
  const std::string ref_db = Path("ref.db"), ref_log = Path("ref.log");
  std::vector<std::string> ref_args = NewSearchArgs(ref_db, 3, 2);
  ref_args.insert(ref_args.end(), {"--evaluator", EvaluatorSpec("ref_eval.json", ref_log, 0)});
  nlohmann::json ref_out = RunToOutcome(ref_args);
  ASSERT_EQ(ref_out.value("stop_reason", ""), "rounds") << ref_out.dump();
  const int64_t ref_id = ref_out.value("search", int64_t{0});

  const std::string db = Path("short.db"), log = Path("short.log");
  const std::string spec = EvaluatorSpec("eval.json", log, 0);
  std::vector<std::string> first = NewSearchArgs(db, 1, 2);
  first.insert(first.end(), {"--evaluator", spec});
  nlohmann::json out = RunToOutcome(first);
  ASSERT_EQ(out.value("stop_reason", ""), "rounds") << out.dump();
  const size_t evaluated = ReadLines(log).size();
  auto calls_now = [&] {
    auto store = LineageStore::Open(db);
    EXPECT_TRUE(store.ok());
    return store.ok() ? (*store)->ListLlmCalls(1, false)->size() : size_t{0};
  };
  const size_t calls = calls_now();

  // Resumed as it is: finished, with the way to add rounds; nothing runs.
  std::vector<std::string> resume = ResumeArgs(db, 1);
  resume.insert(resume.end(), {"--evaluator", spec});
  SubprocessResult plain = Run(resume);
  EXPECT_TRUE(plain.Succeeded()) << plain.Describe() << "\nstderr: " << plain.err;
  EXPECT_NE(plain.err.find("search 1 is finished: it ran its 1 rounds; nothing to resume. To add rounds, give the new "
                           "total: `kernelsearch search --resume 1 --rounds 2` runs round 2"),
            std::string::npos)
      << plain.err;
  EXPECT_NE(plain.out.find("search 1: finished (rounds)"), std::string::npos) << plain.out;
  // Too few rounds: refused, saying what the number means.
  std::vector<std::string> same = resume;
  same.insert(same.end(), {"--rounds", "1"});
  SubprocessResult refused = Run(same);
  EXPECT_EQ(refused.exit_code, 2) << refused.Describe() << "\nstderr: " << refused.err;
  EXPECT_NE(refused.err.find("ran its 1 rounds already; the rounds given are the new total"), std::string::npos)
      << refused.err;
  EXPECT_EQ(ReadLines(log).size(), evaluated);
  EXPECT_EQ(calls_now(), calls);

  // Two more rounds, with the live progress a user sees (no --quiet).
  std::vector<std::string> more = resume;
  more.erase(std::find(more.begin(), more.end(), "--quiet"));
  more.insert(more.end(), {"--rounds", "3"});
  SubprocessResult grown = Run(more);
  ASSERT_TRUE(grown.Succeeded()) << grown.Describe() << "\nstderr: " << grown.err;
  EXPECT_NE(grown.err.find("search 1 ran its 1 rounds; running rounds 2 to 3 (3 in all)"), std::string::npos)
      << grown.err;
  EXPECT_NE(grown.err.find("round 2 started"), std::string::npos) << grown.err;
  EXPECT_NE(grown.err.find("round 3 started"), std::string::npos) << grown.err;
  EXPECT_EQ(grown.err.find("round 1 started"), std::string::npos) << grown.err;
  EXPECT_NE(grown.out.find("search 1: finished (rounds)"), std::string::npos) << grown.out;
  for (const std::string* text : {&plain.err, &plain.out, &grown.err, &grown.out, &refused.err})
    EXPECT_EQ(text->find("round -1"), std::string::npos) << *text;

  EXPECT_EQ(CanonicalLineage(db, 1), CanonicalLineage(ref_db, ref_id));
  auto store = LineageStore::Open(db);
  auto ref_store = LineageStore::Open(ref_db);
  ASSERT_TRUE(store.ok() && ref_store.ok());
  EXPECT_EQ((*store)->GetSearch(1)->status, SearchStatus::kFinished);
  auto llm_calls = (*store)->ListLlmCalls(1, false);
  auto ref_calls = (*ref_store)->ListLlmCalls(ref_id, false);
  ASSERT_TRUE(llm_calls.ok() && ref_calls.ok());
  std::multiset<std::string> slots, ref_slots;
  for (const auto& c : *llm_calls) slots.insert(c.record.role + " " + c.prompt_sha256);
  for (const auto& c : *ref_calls) ref_slots.insert(c.record.role + " " + c.prompt_sha256);
  EXPECT_EQ(slots, ref_slots);  // as many calls as one longer run: none repeated
  const std::vector<std::string> evals = ReadLines(log), ref_evals = ReadLines(ref_log);
  EXPECT_EQ(std::multiset<std::string>(evals.begin(), evals.end()),
            std::multiset<std::string>(ref_evals.begin(), ref_evals.end()));

  // Finished again, at its new total.
  SubprocessResult after = Run(resume);
  EXPECT_TRUE(after.Succeeded()) << after.Describe();
  EXPECT_NE(after.err.find("it ran its 3 rounds; nothing to resume"), std::string::npos) << after.err;
}

TEST_F(SearchE2eTest, GenerateOnlyAndEvaluatePendingAlternatedMatchAContinuousRun) {
  const std::string ref_db = Path("cont.db"), ref_log = Path("cont.log");
  // 3 rounds in all.
  std::vector<std::string> ref_args = NewSearchArgs(ref_db, 2, 2);
  ref_args.insert(ref_args.end(), {"--evaluator", EvaluatorSpec("cont_eval.json", ref_log, 0)});
  nlohmann::json ref_out = RunToOutcome(ref_args);
  ASSERT_EQ(ref_out.value("status", ""), "finished") << ref_out.dump();
  const int64_t ref_id = ref_out.value("search", int64_t{0});

  // The model side (no evaluator) and the GPU side, as separate processes.
  const std::string db = Path("split.db"), log = Path("split.log");
  const std::string spec = EvaluatorSpec("split_eval.json", log, 0);
  std::vector<std::string> generate = NewSearchArgs(db, 2, 2);
  generate.push_back("--generate-only");
  int steps = 0;
  int64_t evaluated = 0;
  std::set<int> rounds_seen;
  for (; steps < 30; ++steps) {
    nlohmann::json gen = RunToOutcome(generate);
    ASSERT_TRUE(gen.is_object());
    ASSERT_EQ(gen.value("search", int64_t{0}), 1);
    if (gen.value("status", "") == "finished") break;
    ASSERT_EQ(gen.value("status", ""), "running") << gen.dump();
    const int64_t pending = gen.value("pending", int64_t{0});
    ASSERT_GT(pending, 0) << gen.dump();
    std::string note = gen.value("stop_reason", "");  // "round N: M candidates pending evaluation"
    if (note.rfind("round ", 0) == 0) rounds_seen.insert(std::stoi(note.substr(6)));
    generate = ResumeArgs(db, 1);
    generate.push_back("--generate-only");

    SubprocessResult ev = Run({kBinary, "evaluate-pending", "--db", db, "--evaluator", spec, "--json"});
    ASSERT_TRUE(ev.Succeeded()) << ev.Describe() << "\nstderr: " << ev.err;
    nlohmann::json eo = Outcome(ev.out);
    EXPECT_EQ(eo.value("evaluated_now", int64_t{-1}), pending) << ev.out;
    evaluated += eo.value("evaluated_now", int64_t{0});
  }
  EXPECT_EQ(rounds_seen, (std::set<int>{0, 1, 2}));  // every round crossed the split
  EXPECT_GE(steps, 3);
  EXPECT_LT(steps, 30);

  EXPECT_EQ(CanonicalLineage(db, 1), CanonicalLineage(ref_db, ref_id));
  auto store = LineageStore::Open(db);
  auto ref_store = LineageStore::Open(ref_db);
  ASSERT_TRUE(store.ok() && ref_store.ok());
  EXPECT_EQ((*store)->ListLlmCalls(1, false)->size(), (*ref_store)->ListLlmCalls(ref_id, false)->size());
  EXPECT_EQ((*store)->GetSearch(1)->status, SearchStatus::kFinished);
  std::vector<std::string> evals = ReadLines(log), ref_evals = ReadLines(ref_log);
  EXPECT_EQ(std::multiset<std::string>(evals.begin(), evals.end()),
            std::multiset<std::string>(ref_evals.begin(), ref_evals.end()));
  // Both sides' wall time counts toward the search's budget.
  EXPECT_GT((*store)->GetSearch(1)->elapsed_s, 0);
}

TEST_F(SearchE2eTest, DeviceFactsFromTheEvaluatorReachTheConfigAndPrompts) {
  const std::string db = Path("facts.db");
  nlohmann::json facts = {{"name", "Fake H100"},       {"compute_capability", "9.0"},
                          {"sm_count", 132},           {"shared_bytes_per_block", 232448},
                          {"l2_bytes", 52428800},      {"memory_bandwidth_gbps", 3021.0},
                          {"fp32_tflops", 51.2},       {"tf32_tflops", 361.0}};
  std::vector<std::string> args = {kBinary,   "search",  problem_,     "--db",      db,   "--signature",
                                   signature_, "--model", kModel,       "--rounds",  "0",  "--branches",
                                   "1",        "--repair", "0",         "--quiet"};
  args.insert(args.end(), {"--evaluator", EvaluatorSpec("facts.json", Path("facts.log"), 0, {{"gpu", facts}})});
  nlohmann::json out = RunToOutcome(args);
  ASSERT_EQ(out.value("status", ""), "finished") << out.dump();
  auto store = LineageStore::Open(db);
  ASSERT_TRUE(store.ok());
  auto search = (*store)->GetSearch(1);
  ASSERT_TRUE(search.ok());
  nlohmann::json gpu = nlohmann::json::parse(search->config_json)["gpu"];
  EXPECT_EQ(gpu.value("sm_count", 0), 132);
  EXPECT_EQ(gpu.value("name", ""), "Fake H100");
  EXPECT_DOUBLE_EQ(gpu.value("memory_bandwidth_gbps", 0.0), 3021.0);
  EXPECT_DOUBLE_EQ(gpu.value("tf32_tflops", 0.0), 361.0);
  auto calls = (*store)->ListLlmCalls(1, true);
  ASSERT_TRUE(calls.ok());
  ASSERT_FALSE(calls->empty());
  const std::string& prompt = calls->front().record.prompt;
  EXPECT_NE(prompt.find("Fake H100 (compute capability 9.0), 132 SMs"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("3021 GB/s"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find("TFLOP/s: FP32 51.2, TF32 tensor cores 361"), std::string::npos) << prompt;
}

// Issue 17 as a user sees it: per-launch figures and occupancy stored with each
// evaluation, shown by `kernelsearch show`, and given to the model in the next
// round's ideas prompt beside this GPU's register budget.
TEST_F(SearchE2eTest, PerLaunchFiguresReachShowAndTheIdeasPrompt) {
  const std::string db = Path("profile.db");
  nlohmann::json facts = {{"name", "Fake H100"},          {"compute_capability", "9.0"},
                          {"sm_count", 132},              {"shared_bytes_per_block", 232448},
                          {"shared_bytes_per_sm", 233472}, {"l2_bytes", 52428800},
                          {"registers_per_sm", 65536},    {"max_threads_per_sm", 2048},
                          {"max_blocks_per_sm", 32},      {"max_registers_per_thread", 255},
                          {"memory_bandwidth_gbps", 3021.0}};
  std::vector<std::string> args = {kBinary,   "search",  problem_,     "--db",      db,   "--signature",
                                   signature_, "--model", kModel,       "--rounds",  "1",  "--ideas", "1",
                                   "--branches", "1",      "--beam", "1", "--repair",   "1",         "--quiet", "--json"};
  args.insert(args.end(), {"--evaluator", EvaluatorSpec("profile.json", Path("profile.log"), 0, {{"gpu", facts}})});
  SubprocessOptions o;
  o.argv = args;
  o.timeout_s = 300;
  o.env["KS_FAKE_MODEL_PROFILE"] = "1";
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->Succeeded()) << r->Describe() << "\nstderr: " << r->err;

  auto store = LineageStore::Open(db);
  ASSERT_TRUE(store.ok());
  auto cands = (*store)->ListCandidates(1);
  ASSERT_TRUE(cands.ok());
  std::optional<int64_t> correct;
  for (const auto& c : *cands)
    if (c.evaluation && c.evaluation->status == EvalStatus::kCorrect) correct = c.id;
  ASSERT_TRUE(correct.has_value()) << "no correct candidate";
  // 40 registers x 256 threads: 1280 per warp, 51 warps of registers, 6 blocks.
  SubprocessResult show = Run({kBinary, "show", std::to_string(*correct), "--db", db});
  ASSERT_TRUE(show.Succeeded()) << show.Describe();
  EXPECT_NE(show.out.find("each launch on its own:\n  launch 0 `"), std::string::npos) << show.out;
  EXPECT_NE(show.out.find("(100% of the plan); occupancy 6 blocks/SM of 256 threads (75% of the SM's warps), 40 "
                          "registers/thread, 0 B shared/block; limited by registers (registers allow 6, shared "
                          "memory 228, threads 8, block limit 32)"),
            std::string::npos)
      << show.out;

  auto calls = (*store)->ListLlmCalls(1, true);
  ASSERT_TRUE(calls.ok());
  int ideas = 0;
  for (const auto& c : *calls) {
    const std::string& prompt = c.record.prompt;
    EXPECT_NE(prompt.find("| 256 | 255 | 32 (8 blocks, 2048 threads per SM) |"), std::string::npos) << prompt;
    if (c.record.role != "ideas") continue;
    ++ideas;
    EXPECT_NE(prompt.find("Each launch on its own"), std::string::npos) << prompt;
    EXPECT_NE(prompt.find("limited by registers (registers allow 6"), std::string::npos) << prompt;
    EXPECT_NE(prompt.find("## The best kernels so far in this search\n"), std::string::npos) << prompt;
    EXPECT_NE(prompt.find("6 blocks/SM, registers-limited"), std::string::npos) << prompt;
  }
  EXPECT_EQ(ideas, 1);
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

// What a prompt must never say about a GPU: a zero or blank figure reads as a fact.
void ExpectNoZeroFact(const std::string& prompt, const std::string& where) {
  for (const char* bad : {" 0 SMs", "compute capability )", "Shared memory: 0 B", "L2 cache: 0 B", ": 0 GB/s",
                          "- (compute capability"})
    EXPECT_EQ(prompt.find(bad), std::string::npos) << where << " holds '" << bad << "':\n" << prompt;
}

// Issue 15, part 1: the model side of a split search learns the device facts
// the GPU node measured (evaluate-pending stores them), and no prompt ever
// shows a zero: before any GPU node reported, figures say "unknown".
TEST_F(SearchE2eTest, SplitSearchPromptsUseTheGpuNodesFactsAndNeverAZero) {
  const std::string db = Path("split_facts.db");
  nlohmann::json facts = {{"name", "Fake H100"},       {"compute_capability", "9.0"},
                          {"sm_count", 132},           {"shared_bytes_per_block", 232448},
                          {"l2_bytes", 52428800},      {"memory_bandwidth_gbps", 2951.0},
                          {"fp32_tflops", 51.2}};
  const std::string spec = EvaluatorSpec("facts_eval.json", Path("facts.log"), 0, {{"gpu", facts}});
  std::vector<std::string> generate = NewSearchArgs(db, 1, 2);
  for (auto& a : generate)
    if (a == "Fake GPU 1") a = "Fake H100";
  generate.push_back("--generate-only");
  bool finished = false;
  int notes = 0;
  for (int step = 0; step < 20 && !finished; ++step) {
    SubprocessResult gen = Run(generate);
    ASSERT_TRUE(gen.Succeeded()) << gen.Describe() << "\nstderr: " << gen.err;
    // Said once, on creation; never again on resume.
    if (gen.err.find("GPU 'Fake H100': the prompts state its datasheet figures") != std::string::npos) ++notes;
    finished = gen.out.find("finished") != std::string::npos;
    generate = ResumeArgs(db, 1);
    generate.push_back("--generate-only");
    SubprocessResult ev = Run({kBinary, "evaluate-pending", "--db", db, "--evaluator", spec, "--quiet"});
    ASSERT_TRUE(ev.Succeeded()) << ev.Describe() << "\nstderr: " << ev.err;
  }
  EXPECT_TRUE(finished);
  EXPECT_EQ(notes, 1);

  auto store = LineageStore::Open(db);
  ASSERT_TRUE(store.ok());
  auto calls = (*store)->ListLlmCalls(1, false);
  ASSERT_TRUE(calls.ok());
  ASSERT_FALSE(calls->empty());
  // Issue 22: round 0 (before the GPU node reported) states the datasheet's
  // figures for an H100, marked so; later rounds the measured ones.
  int unknown = 0, measured = 0;
  for (const auto& c : *calls) {
    ExpectNoZeroFact(c.record.prompt, "call " + std::to_string(c.id) + " (" + c.slot_key + ")");
    if (c.record.prompt.find("Fake H100 (compute capability 9.0), 132 SMs (datasheet figures") != std::string::npos &&
        c.record.prompt.find("Memory bandwidth (datasheet peak): 3350 GB/s") != std::string::npos)
      ++unknown;
    if (c.record.prompt.find("Fake H100 (compute capability 9.0), 132 SMs") != std::string::npos &&
        c.record.prompt.find("Memory bandwidth (measured): 2951 GB/s") != std::string::npos)
      ++measured;
  }
  EXPECT_GT(unknown, 0);   // round 0, before the GPU node reported
  EXPECT_GT(measured, 0);  // round 1, after it did
  EXPECT_EQ(unknown + measured, static_cast<int>(calls->size()));

  // A new split search naming that GPU starts from its facts at once.
  std::vector<std::string> second = NewSearchArgs(db, 0, 2);
  for (auto& a : second)
    if (a == "Fake GPU 1") a = "Fake H100";
  second.push_back("--generate-only");
  SubprocessResult gen = Run(second);
  ASSERT_TRUE(gen.Succeeded()) << gen.Describe() << "\nstderr: " << gen.err;
  EXPECT_EQ(gen.err.find("datasheet"), std::string::npos) << gen.err;
  auto calls2 = (*store)->ListLlmCalls(2, false);
  ASSERT_TRUE(calls2.ok());
  ASSERT_FALSE(calls2->empty());
  EXPECT_NE(calls2->front().record.prompt.find("132 SMs"), std::string::npos) << calls2->front().record.prompt;
}

// Issue 15, part 2: a model that fails every call makes `search` exit 3 (the
// environment) and say how many calls failed and the first error; history
// shows the failed calls too.
TEST_F(SearchE2eTest, AFailingModelMakesSearchExitThreeWithTheError) {
  const std::string db = Path("fail.db");
  const std::string script = Path("broken_model.sh");
  ASSERT_TRUE(WriteFile(script, "#!/bin/sh\necho 'HTTP 401 invalid api key' >&2\nexit 1\n").ok());
  for (bool generate_only : {true, false}) {
    std::vector<std::string> args = NewSearchArgs(db, 0, 2);
    for (auto& a : args)
      if (a == kModel) a = "command:/bin/sh " + script;
    if (generate_only) args.push_back("--generate-only");
    else args.insert(args.end(), {"--evaluator", EvaluatorSpec("fail_eval.json", Path("fail.log"), 0)});
    SubprocessResult r = Run(args);
    EXPECT_EQ(r.exit_code, 3) << r.Describe() << "\nstdout: " << r.out << "\nstderr: " << r.err;
    EXPECT_NE(r.err.find("model calls failed; first error:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("HTTP 401 invalid api key"), std::string::npos) << r.err;
  }
  SubprocessResult h = Run({kBinary, "history", "--db", db});
  ASSERT_TRUE(h.Succeeded()) << h.Describe() << h.err;
  EXPECT_NE(h.out.find("failed"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("first failed model call:"), std::string::npos) << h.out;
  EXPECT_NE(h.out.find("HTTP 401 invalid api key"), std::string::npos) << h.out;
  SubprocessResult hj = Run({kBinary, "history", "--db", db, "--json"});
  auto arr = nlohmann::json::parse(hj.out, nullptr, false);
  ASSERT_TRUE(arr.is_array() && !arr.empty()) << hj.out;
  EXPECT_EQ(arr[0].value("failed_llm_calls", int64_t{0}), 2) << hj.out;  // 2 branches of round 0
}

// Issue 15, part 4: a second problem's round-0 prompt shows the first
// problem's best kernel (the same operator at another shape), with its
// speedup; the lineage records it; --no-bank turns it off.
TEST_F(SearchE2eTest, ASecondProblemsRoundZeroPromptShowsTheFirstProblemsBestKernel) {
  const std::string db = Path("bank.db");
  auto problem = [&](const std::string& name, int rows, int cols) {
    std::string py = Path(name + ".py");
    EXPECT_TRUE(WriteFile(py, "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                              "        return torch.softmax(x, dim=1)\n\ndef get_inputs():\n    return [torch.randn(" +
                                  std::to_string(rows) + ", " + std::to_string(cols) +
                                  ")]\n\ndef get_init_inputs():\n    return []\n")
                    .ok());
    Signature sig;
    sig.name = name;
    sig.file = py;
    sig.inputs.push_back({.name = "x", .dtype = DType::kFloat32, .shape = {rows, cols}, .strides = {cols, 1}});
    sig.outputs.push_back({.name = "out", .dtype = DType::kFloat32, .shape = {rows, cols}, .strides = {cols, 1}});
    std::string sig_path = Path(name + ".sig.json");
    EXPECT_TRUE(WriteFile(sig_path, SignatureToJson(sig).dump()).ok());
    return std::make_pair(py, sig_path);
  };
  // The fake model's replies follow a hash of the prompt, so whether round 0's
  // kernels are correct changes with the prompts' text: the first search may
  // repair (repairs are always correct) so that it always has a best kernel.
  auto search = [&](const std::pair<std::string, std::string>& p, bool bank, const char* repairs = "0") {
    std::vector<std::string> args = {kBinary,  "search",    p.first,  "--db",     db,        "--signature",
                                     p.second, "--model",   kModel,   "--rounds", "0",       "--branches",
                                     "2",      "--repair",  repairs,  "--quiet",  "--json",  "--evaluator",
                                     EvaluatorSpec("bank_eval.json", Path("bank.log"), 0)};
    if (!bank) args.push_back("--no-bank");
    nlohmann::json out = RunToOutcome(args);
    EXPECT_EQ(out.value("status", ""), "finished") << out.dump();
    return out;
  };
  nlohmann::json first = search(problem("softmax_small", 64, 512), true, "1");
  ASSERT_TRUE(first.contains("best_candidate")) << first.dump();
  const int64_t bank_kernel = first["best_candidate"].get<int64_t>();
  nlohmann::json second = search(problem("softmax_wide", 8, 8192), true);
  nlohmann::json third = search(problem("softmax_tall", 4096, 64), false);

  auto store = LineageStore::Open(db);
  ASSERT_TRUE(store.ok());
  auto best = (*store)->GetCandidate(bank_kernel);
  ASSERT_TRUE(best.ok());
  const int64_t second_id = second.value("search", int64_t{0});
  auto calls = (*store)->ListLlmCalls(second_id, false);
  ASSERT_TRUE(calls.ok());
  ASSERT_FALSE(calls->empty());
  for (const auto& c : *calls) {
    const std::string& p = c.record.prompt;
    EXPECT_NE(p.find("## Kernels that worked for similar operators"), std::string::npos) << p;
    EXPECT_NE(p.find("### softmax_small (bank kernel " + std::to_string(bank_kernel) + ")"), std::string::npos) << p;
    EXPECT_NE(p.find(fmt::format("{:.2f}x over eager", *best->evaluation->speedup_eager)), std::string::npos) << p;
    EXPECT_NE(p.find(best->source), std::string::npos) << p;
  }
  auto shown = (*store)->ListBankShown(second_id);
  ASSERT_TRUE(shown.ok());
  EXPECT_EQ(shown->size(), calls->size());  // one per round-0 implement prompt
  for (const auto& [slot, id] : *shown) EXPECT_EQ(id, bank_kernel) << slot;

  const int64_t third_id = third.value("search", int64_t{0});
  auto calls3 = (*store)->ListLlmCalls(third_id, false);
  ASSERT_TRUE(calls3.ok());
  ASSERT_FALSE(calls3->empty());
  for (const auto& c : *calls3) EXPECT_EQ(c.record.prompt.find("similar operators"), std::string::npos);
  EXPECT_TRUE((*store)->ListBankShown(third_id)->empty());
}

}  // namespace
}  // namespace ks
