// End-to-end tests of suites as a user runs them: the real binary on a small
// "level" folder.
//  - `kernelsearch suite DIR` with a `command:` model (tests/testing/
//    fake_model.sh) and the scripted fake evaluator; signatures and the
//    degenerate check from the real reference bridge on the CPU (tiny
//    problems). A problem with a syntax error and one with a degenerate
//    reference are rows, not the end; the table, the fast_p figures and --json;
//    `suite --show`; a finished suite resumed evaluates nothing again; a suite
//    kill -9'd mid-run and resumed finishes without searching a finished
//    problem again.
//  - `kernelsearch eval KERNELS --problems DIR` with the fake evaluator: kernels
//    matched by name (.cu + .json, .md), a missing kernel and an unreadable
//    one as rows, the figures, the exit status; bad arguments exit 2.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "tests/testing/fake_model.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {
namespace fs = std::filesystem;

const std::string kBinary = ks::testing::CliBinary();
const std::string kModel = ks::testing::FakeModelCommand();

std::vector<std::string> ReadLines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

// The JSON lines of a --json run whose "event" is `event`.
std::vector<nlohmann::json> Events(const std::string& out, const std::string& event) {
  std::vector<nlohmann::json> found;
  size_t pos = 0;
  while (pos < out.size()) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    auto j = nlohmann::json::parse(out.substr(pos, end - pos), nullptr, false);
    if (j.is_object() && j.value("event", "") == event) found.push_back(j);
    pos = end + 1;
  }
  return found;
}

std::string Problem(const std::string& body) {
  return "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return " + body +
         "\n\ndef get_inputs():\n    return [torch.randn(256)]\n\ndef get_init_inputs():\n    return []\n";
}

class SuiteE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_ / "level");
    Write("level/1_copy.py", Problem("x.clone()"));
    Write("level/2_syntax.py", "import torch\nclass Model(torch.nn.Module:\n");
    Write("level/3_zeros.py", Problem("torch.zeros_like(x)"));
    Write("level/10_double.py", Problem("x * 2"));
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  void Write(const std::string& name, const std::string& text) {
    fs::create_directories(fs::path(Path(name)).parent_path());
    ASSERT_TRUE(WriteFile(Path(name), text).ok());
  }
  std::string EvaluatorSpec(const std::string& name, const std::string& log, double delay_ms) {
    // check_reference: the fake stands for the GPU side, which refuses a
    // degenerate reference (the real bridge, on the CPU).
    nlohmann::json j = {{"log", log}, {"delay_ms", delay_ms}, {"eager_ms", 2.0}, {"compile_ms", 1.0},
                        {"floor_ms", 0.05}, {"check_reference", true}};
    Write(name, j.dump());
    return "fake:" + Path(name);
  }
  std::vector<std::string> SuiteArgs(const std::string& db, const std::string& evaluator) const {
    return {kBinary, "suite", Path("level"), "--db", db, "--model", kModel, "--rounds", "1", "--ideas", "2",
            "--branches", "1", "--beam", "1", "--repair", "1", "--concurrency", "2", "--evaluator", evaluator};
  }
  SubprocessResult Run(std::vector<std::string> argv) {
    SubprocessOptions o;
    o.argv = std::move(argv);
    o.timeout_s = 300;
    auto r = RunSubprocess(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }

  ks::testing::TempDir dir_{"ks_suite_e2e_", ks::testing::TempDir::OnFailure::kKeep};
};

TEST_F(SuiteE2eTest, ALevelWithBrokenProblemsGivesTheTableAndResumes) {
  const std::string db = Path("suite.db"), log = Path("eval.log");
  std::vector<std::string> args = SuiteArgs(db, EvaluatorSpec("eval.json", log, 0));
  args.push_back("--json");
  SubprocessResult r = Run(args);
  ASSERT_TRUE(r.Succeeded()) << r.Describe() << "\nstdout: " << r.out << "\nstderr: " << r.err;
  // One line per problem as it finishes, in the level's natural order, then the suite.
  auto problems = Events(r.out, "problem");
  ASSERT_EQ(problems.size(), 4u) << r.out;
  EXPECT_EQ(problems[0]["problem"], "1_copy");
  EXPECT_EQ(problems[3]["problem"], "10_double");
  auto suites = Events(r.out, "suite");
  ASSERT_EQ(suites.size(), 1u) << r.out;
  nlohmann::json suite = suites[0];
  EXPECT_EQ(suite["status"], "finished");
  const int64_t id = suite["suite"].get<int64_t>();
  auto rows = suite["problems"];
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0]["status"], "correct") << rows[0].dump();
  EXPECT_GT(rows[0]["speedup_eager"].get<double>(), 0);
  EXPECT_GT(rows[0]["fraction_of_floor"].get<double>(), 0);
  EXPECT_EQ(rows[1]["status"], "error");
  EXPECT_NE(rows[1].value("message", "").find("2_syntax.py"), std::string::npos) << rows[1].dump();
  EXPECT_EQ(rows[2]["status"], "error");
  EXPECT_NE(rows[2].value("message", "").find("degenerate"), std::string::npos) << rows[2].dump();
  EXPECT_EQ(rows[3]["status"], "correct") << rows[3].dump();
  // The figures follow from the rows: 2 of 4 problems have a correct kernel;
  // the fake model's kernels take 0.1-1.0 ms against 2 ms eager, so all are
  // faster than eager.
  auto figures = suite["figures"];
  EXPECT_EQ(figures["problems"], 4);
  EXPECT_EQ(figures["correct"], 2);
  EXPECT_DOUBLE_EQ(figures["fast_0_eager"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(figures["fast_1_eager"].get<double>(), 0.5);
  double geomean = std::sqrt(rows[0]["speedup_eager"].get<double>() * rows[3]["speedup_eager"].get<double>());
  EXPECT_NEAR(figures["geomean_speedup_eager"].get<double>(), geomean, 1e-9);

  // The table a person reads, from the store.
  SubprocessResult shown = Run({kBinary, "suite", "--show", std::to_string(id), "--db", db});
  ASSERT_TRUE(shown.Succeeded()) << shown.Describe() << shown.err;
  for (const char* want : {"1_copy", "2_syntax", "degenerate", "10_double", "fast_0", "fast_2", "vs torch.compile",
                           "geomean speedup", "50.0%"})
    EXPECT_NE(shown.out.find(want), std::string::npos) << want << " not in:\n" << shown.out;

  // Resuming a finished suite runs nothing again (a failed problem is retried,
  // and fails again before anything is evaluated).
  size_t evaluated = ReadLines(log).size();
  ASSERT_GT(evaluated, 0u);
  SubprocessResult resumed = Run({kBinary, "suite", "--resume", std::to_string(id), "--db", db, "--evaluator",
                                  "fake:" + Path("eval.json"), "--model", kModel, "--json"});
  ASSERT_TRUE(resumed.Succeeded()) << resumed.Describe() << resumed.err;
  EXPECT_EQ(ReadLines(log).size(), evaluated);
  auto again = Events(resumed.out, "suite");
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0]["figures"], figures);

  // kill -9 in the middle of a suite (of the two good problems, to keep the
  // test short), then --resume: it ends as an uninterrupted run does, and the
  // problem that had finished is not searched again.
  fs::create_directories(Path("short"));
  fs::copy_file(Path("level/1_copy.py"), Path("short/1_copy.py"));
  fs::copy_file(Path("level/10_double.py"), Path("short/10_double.py"));
  const std::string killed_db = Path("killed.db"), killed_log = Path("killed.log");
  std::vector<std::string> killed_args = SuiteArgs(killed_db, EvaluatorSpec("slow.json", killed_log, 200));
  killed_args[2] = Path("short");
  killed_args.push_back("--json");
  {
    auto child = ChildProcess::Start(killed_args, {}, Path("killed.stderr"));
    ASSERT_TRUE(child.ok()) << child.status().ToString();
    // Killed once the second problem's search has evaluated something.
    std::string out;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (Events(out, "problem").empty()) {
      char buf[4096];
      ssize_t n = read(child->stdout_fd(), buf, sizeof buf);
      ASSERT_GT(n, 0) << "the suite ended before its first problem finished; stderr: " << *ReadFile(Path("killed.stderr"));
      out.append(buf, n);
      ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    }
    size_t first_problem_evals = ReadLines(killed_log).size();
    while (ReadLines(killed_log).size() < first_problem_evals + 1) {
      ASSERT_FALSE(child->TryReap().has_value()) << "the suite ended before the kill";
      ASSERT_LT(std::chrono::steady_clock::now(), deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    EXPECT_NE(child->Kill().find("signal 9"), std::string::npos);
  }
  SubprocessResult killed_state = Run({kBinary, "suite", "--show", "1", "--db", killed_db, "--json"});
  auto before = Events(killed_state.out, "suite");
  ASSERT_EQ(before.size(), 1u) << killed_state.out << killed_state.err;
  EXPECT_EQ(before[0]["status"], "running");
  EXPECT_EQ(before[0]["problems"][0]["status"], "correct");
  // Searched when killed: "running", or "correct (running)" once it had a correct kernel.
  EXPECT_NE(before[0]["problems"][1]["status"].get<std::string>().find("running"), std::string::npos)
      << before[0]["problems"][1].dump();
  SubprocessResult finished = Run({kBinary, "suite", "--resume", "1", "--db", killed_db, "--evaluator",
                                   "fake:" + Path("slow.json"), "--model", kModel, "--json"});
  ASSERT_TRUE(finished.Succeeded()) << finished.Describe() << finished.err;
  auto resumed_problems = Events(finished.out, "problem");
  ASSERT_EQ(resumed_problems.size(), 2u);
  EXPECT_TRUE(resumed_problems[0]["resumed_done"].get<bool>());
  EXPECT_FALSE(resumed_problems[1]["resumed_done"].get<bool>());
  auto final_suite = Events(finished.out, "suite");
  ASSERT_EQ(final_suite.size(), 1u);
  EXPECT_EQ(final_suite[0]["status"], "finished");
  EXPECT_DOUBLE_EQ(final_suite[0]["figures"]["fast_0_eager"].get<double>(), 1.0);
  EXPECT_EQ(final_suite[0]["problems"][0], before[0]["problems"][0]);
}

TEST_F(SuiteE2eTest, EvalScoresAFolderOfKernelsAgainstALevel) {
  const std::string kernel =
      "extern \"C\" __global__ void k(float* out, const float* x, int n) { /* FAKE_MS(MS) */ }\n";
  const std::string plan =
      R"P({"launches": [{"kernel": "k", "grid": ["cdiv(x.numel, 256)"], "block": [256], "args": ["out", "x", "x.numel"]}]})P";
  auto with_ms = [&](const std::string& ms) {
    std::string k = kernel;
    k.replace(k.find("MS)"), 2, ms);
    return k;
  };
  Write("kernels/1_copy.cu", with_ms("0.5"));
  Write("kernels/1_copy.json", plan);
  Write("kernels/10_double.md", "Doubles x.\n```cuda\n" + with_ms("4.0") + "```\n```json\n" + plan + "\n```\n");
  Write("kernels/3_zeros.cu", with_ms("1.0"));  // no plan beside it
  Write("kernels/77_orphan.cu", with_ms("1.0"));
  const std::string spec = EvaluatorSpec("eval.json", Path("eval.log"), 0);

  SubprocessResult r = Run({kBinary, "eval", Path("kernels"), "--problems", Path("level"), "--evaluator", spec, "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe() << r.err;  // not every problem has a correct kernel
  auto suites = Events(r.out, "suite");
  ASSERT_EQ(suites.size(), 1u) << r.out;
  auto rows = suites[0]["problems"];
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0]["problem"], "1_copy");
  EXPECT_EQ(rows[0]["status"], "correct");
  EXPECT_DOUBLE_EQ(rows[0]["speedup_eager"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(rows[0]["speedup_compile"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(rows[0]["fraction_of_floor"].get<double>(), 0.1);
  EXPECT_EQ(rows[1]["status"], "no kernel");
  EXPECT_EQ(rows[2]["status"], "parse_error");
  EXPECT_EQ(rows[3]["problem"], "10_double");
  EXPECT_EQ(rows[3]["status"], "correct");
  EXPECT_DOUBLE_EQ(rows[3]["speedup_eager"].get<double>(), 0.5);
  auto f = suites[0]["figures"];
  EXPECT_DOUBLE_EQ(f["fast_0_eager"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(f["fast_1_eager"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(f["fast_2_eager"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(f["fast_1_compile"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(f["fast_2_compile"].get<double>(), 0.0);  // exactly 2x is not more than 2x
  EXPECT_NEAR(f["geomean_speedup_eager"].get<double>(), std::sqrt(4.0 * 0.5), 1e-12);
  EXPECT_NE(r.err.find("77_orphan.cu matches no problem"), std::string::npos) << r.err;

  SubprocessResult table = Run({kBinary, "eval", Path("kernels"), "--problems", Path("level"), "--evaluator", spec});
  EXPECT_EQ(table.exit_code, 1);
  for (const char* want : {"1_copy", "4.00x", "no kernel", "parse_error", "fast_1", "25.0%", "10%"})
    EXPECT_NE(table.out.find(want), std::string::npos) << want << " not in:\n" << table.out;

  // Bad arguments are usage errors with a message.
  SubprocessResult missing = Run({kBinary, "eval", Path("kernels"), "--problems", Path("nowhere")});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  SubprocessResult two = Run({kBinary, "eval", Path("kernels"), Path("kernels"), "--problems", Path("level"),
                              "--evaluator", spec});
  EXPECT_EQ(two.exit_code, 2) << two.err;
  EXPECT_NE(two.err.find("one KERNELS_DIR"), std::string::npos) << two.err;
  SubprocessResult none = Run({kBinary, "eval"});
  EXPECT_EQ(none.exit_code, 2) << none.err;
}

TEST_F(SuiteE2eTest, BadSuiteArgumentsAreUsageErrors) {
  SubprocessResult missing = Run({kBinary, "suite", Path("nowhere"), "--db", Path("x.db"), "--model", kModel,
                                  "--evaluator", "fake"});
  EXPECT_EQ(missing.exit_code, 2) << missing.err;
  EXPECT_NE(missing.err.find("nowhere"), std::string::npos) << missing.err;
  SubprocessResult nothing = Run({kBinary, "suite", "--db", Path("x.db"), "--model", kModel, "--evaluator", "fake"});
  EXPECT_EQ(nothing.exit_code, 2) << nothing.err;
  SubprocessResult no_suite = Run({kBinary, "suite", "--show", "42", "--db", Path("x.db")});
  EXPECT_EQ(no_suite.exit_code, 2) << no_suite.err;
  // A directory given to `search` points at `suite`.
  SubprocessResult dir = Run({kBinary, "search", Path("level"), "--db", Path("x.db"), "--model", kModel,
                              "--evaluator", "fake"});
  EXPECT_EQ(dir.exit_code, 2) << dir.err;
  EXPECT_NE(dir.err.find("kernelsearch suite"), std::string::npos) << dir.err;
}

}  // namespace
}  // namespace ks
