// `kernelsearch report` as a user opens it: a real search (command: model,
// fake evaluator) rendered to one HTML file, loaded in headless Chromium with
// no network. The page must load without a console message (errors included:
// the page itself logs nothing) and set data-ks-rendered="plot tree" once the
// speedup plot and the lineage tree are drawn. A page with a broken script is
// caught the same way (so the check can fail). Skips only when /usr/bin/chromium
// is absent (scripts/setup_and_build.sh installs it).
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/signature.h"
#include "store/lineage_store.h"
#include "tests/testing/fake_model.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

const std::string kBinary = ks::testing::CliBinary();
const std::string kChromium = "/usr/bin/chromium";
const std::string kModel = ks::testing::FakeModelCommand();

class ReportE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kChromium))
      GTEST_SKIP() << kChromium << " is absent: install Debian's chromium (scripts/setup_and_build.sh does)";
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  SubprocessResult Run(std::vector<std::string> argv, double timeout_s = 120) {
    SubprocessOptions o;
    o.argv = std::move(argv);
    o.timeout_s = timeout_s;
    auto r = RunSubprocess(o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : SubprocessResult{};
  }

  // A 2-round search in `db` (3 rounds in all), with repairs and failures.
  void MakeSearch(const std::string& db) {
    std::string py = Path("softmax.py");
    ASSERT_TRUE(WriteFile(py, "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
                              "        return torch.softmax(x, dim=1)\n\ndef get_inputs():\n"
                              "    return [torch.randn(64, 1024)]\n\ndef get_init_inputs():\n    return []\n")
                    .ok());
    Signature sig;
    sig.name = "softmax";
    sig.file = py;
    sig.inputs.push_back({.name = "x", .dtype = DType::kFloat32, .shape = {64, 1024}, .strides = {1024, 1}});
    sig.outputs.push_back({.name = "out", .dtype = DType::kFloat32, .shape = {64, 1024}, .strides = {1024, 1}});
    ASSERT_TRUE(WriteFile(Path("sig.json"), SignatureToJson(sig).dump()).ok());
    ASSERT_TRUE(WriteFile(Path("eval.json"), nlohmann::json({{"eager_ms", 2.0}, {"compile_ms", 1.5}}).dump()).ok());
    SubprocessResult r = Run({kBinary, "search", py, "--db", db, "--signature", Path("sig.json"), "--model", kModel,
                              "--rounds", "2", "--ideas", "2", "--branches", "2", "--beam", "2", "--repair", "1",
                              "--gpu", "Fake GPU", "--evaluator", "fake:" + Path("eval.json"), "--quiet"});
    ASSERT_TRUE(r.Succeeded()) << r.Describe() << "\n" << r.err;
  }

  // Loads `html` in headless Chromium; returns the DOM after scripts ran, and
  // the console messages Chromium logged.
  void Load(const std::string& html, std::string* dom, std::string* console) {
    std::string profile = Path("profile-" + std::to_string(++loads_));
    SubprocessResult r = Run({kChromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                              "--no-first-run", "--disable-background-networking", "--disable-component-update",
                              "--disable-sync", "--user-data-dir=" + profile, "--enable-logging=stderr", "--v=0",
                              "--virtual-time-budget=5000", "--dump-dom", "file://" + html},
                             180);
    ASSERT_TRUE(r.Succeeded()) << r.Describe() << "\n" << r.err;
    *dom = r.out;
    console->clear();
    size_t pos = 0;
    while ((pos = r.err.find(":CONSOLE", pos)) != std::string::npos) {
      size_t start = r.err.rfind('\n', pos);
      size_t end = r.err.find('\n', pos);
      console->append(r.err.substr(start == std::string::npos ? 0 : start + 1,
                                   end == std::string::npos ? std::string::npos : end - start));
      pos = end == std::string::npos ? r.err.size() : end;
    }
  }

  ks::testing::TempDir dir_{"ks_report_e2e_", ks::testing::TempDir::OnFailure::kKeep};
  int loads_ = 0;
};

TEST_F(ReportE2eTest, TheReportLoadsInChromiumWithoutErrorsAndDrawsThePlotAndTheTree) {
  const std::string db = Path("ks.db");
  MakeSearch(db);
  const std::string html = Path("report.html");
  SubprocessResult r = Run({kBinary, "report", "softmax", "--db", db, "--out", html});
  ASSERT_TRUE(r.Succeeded()) << r.Describe() << "\n" << r.err;
  auto page = ReadFile(html, 64 << 20);
  ASSERT_TRUE(page.ok());
  // Self-contained: nothing is fetched.
  for (const char* ref : {"src=\"http", "href=\"http", "src=\"//", "<link "})
    EXPECT_EQ(page->find(ref), std::string::npos) << ref;

  std::string dom, console;
  Load(html, &dom, &console);
  EXPECT_TRUE(console.empty()) << "console messages:\n" << console;
  EXPECT_NE(dom.find("data-ks-rendered=\"plot tree\""), std::string::npos) << dom.substr(0, 3000);
  // The tree's nodes are SVG text: the best kernel's node is there, and the
  // page opened on its code.
  auto data = Run({kBinary, "report", "1", "--db", db, "--json"});
  auto j = nlohmann::json::parse(data.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << data.out;
  ASSERT_TRUE(j["search"]["best_candidate"].is_number());
  const std::string best = std::to_string(j["search"]["best_candidate"].get<int64_t>());
  EXPECT_NE(dom.find(">#" + best + "<"), std::string::npos);
  EXPECT_NE(dom.find("Candidate #" + best), std::string::npos);
  EXPECT_EQ(j["rounds"].size(), 3u);
  ASSERT_FALSE(j["best_path"].empty());
  EXPECT_EQ(j["best_path"].back(), j["search"]["best_candidate"]);  // the highlighted path ends at the best
  EXPECT_NE(dom.find("over torch.compile"), std::string::npos);
}

TEST_F(ReportE2eTest, ABrokenPageIsCaught) {
  // The same checks on a page whose script throws: the console line appears and
  // the marker does not, so the test above can fail.
  const std::string html = Path("broken.html");
  ASSERT_TRUE(WriteFile(html, "<!DOCTYPE html><html><body><div id=x></div><script>"
                              "echarts.init(document.getElementById('x'));</script></body></html>")
                  .ok());
  std::string dom, console;
  Load(html, &dom, &console);
  EXPECT_NE(console.find("echarts is not defined"), std::string::npos) << console;
  EXPECT_EQ(dom.find("data-ks-rendered"), std::string::npos);
}

// Needs no browser, so it is not in the fixture that skips without one.
TEST(ReportCliTest, BadTargetsSayWhatIsWrong) {
  ks::testing::TempDir temp("ks_report_cli_");
  const std::string dir = temp.string();
  SubprocessOptions o;
  // A store that does not exist is named, not created empty (issue 22).
  o.argv = {kBinary, "report", "1", "--db", dir + "/missing.db", "--out", dir + "/x.html"};
  auto missing = RunSubprocess(o);
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->exit_code, 2) << missing->err;
  EXPECT_NE(missing->err.find("no lineage store at " + dir + "/missing.db"), std::string::npos) << missing->err;
  EXPECT_FALSE(std::filesystem::exists(dir + "/missing.db"));
  ASSERT_TRUE(store::LineageStore::Open(dir + "/empty.db").ok());
  o.argv = {kBinary, "report", "no_such_problem", "--db", dir + "/empty.db", "--out", dir + "/x.html"};
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->exit_code, 2) << r->Describe() << r->err;
  EXPECT_NE(r->err.find("no search with id or problem 'no_such_problem'"), std::string::npos) << r->err;
  o.argv = {kBinary, "report", "1", "--db", dir + "/empty.db"};  // neither --out nor --json
  r = RunSubprocess(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2) << r->err;
}

}  // namespace
}  // namespace ks
