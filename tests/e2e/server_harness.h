// Starts the real `kernelsearch serve` binary for end-to-end tests and the load
// benchmark: a private directory with a token, a lineage store seeded with a
// problem (no torch needed), a stand-in model (command: backend, a shell
// script) and the scripted evaluator; an ephemeral loopback port read from the
// server's "listening on" line. Owns the child (SIGKILLed if still alive when
// the harness dies). Not thread-safe; one harness per test.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/files.h"
#include "common/status.h"
#include "common/subprocess.h"
#include "evaluator/signature.h"
#include "store/lineage_store.h"
#include "server/client.h"
#include "tests/testing/copy_problem.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks::e2e {

// The stand-in model: tests/testing/fake_model.sh with every kernel different
// (a random time, so that K branches of one prompt are K candidates), two ideas
// a reply, and every call counted where the model is (tests of cancel count
// calls made after it).
inline std::string ModelScript() {
  return "#!/bin/sh\nKS_FAKE_MODEL_VARY=1 KS_FAKE_MODEL_CORRECT=1 KS_FAKE_MODEL_IDEAS=2 exec /bin/sh '" +
         ks::testing::SourcePath("tests/testing/fake_model.sh") + "'\n";
}

// A problem whose reference is degenerate (all zeros): the GPU side refuses to judge kernels against it.
inline constexpr const char* kZerosProblem =
    "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n"
    "        return torch.zeros_like(x)\n\ndef get_inputs():\n    return [torch.randn(256)]\n\n"
    "def get_init_inputs():\n    return []\n";

struct HarnessOptions {
  double llm_sleep_s = 0;      // per model call
  double eval_delay_ms = 0;    // per candidate
  std::string evaluator = "";  // "" = the scripted one with the options above
  bool check_reference = false;  // the scripted one checks the reference with the real bridge (needs torch)
  std::vector<std::string> extra_args;
};

class ServerHarness {
 public:
  explicit ServerHarness(HarnessOptions o = {}) : opts_(std::move(o)) {
    token_ = Sha256Hex(dir_.string() + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    Check(WriteFile(Path("token"), token_ + "\n"));
    Check(WriteFile(Path("model.sh"), ModelScript()));
    std::filesystem::permissions(Path("model.sh"), std::filesystem::perms::owner_all);
    nlohmann::json ev = {{"delay_ms", opts_.eval_delay_ms}, {"log", Path("evaluated.log")},
                         {"check_reference", opts_.check_reference}};
    Check(WriteFile(Path("evaluator.json"), ev.dump()));
  }
  ~ServerHarness() {
    child_ = ChildProcess();  // SIGKILL + reap; dir_ goes after
  }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  const std::string& token() const { return token_; }
  const std::string& address() const { return address_; }
  std::string db() const { return Path("lineage.db"); }

  // Stores a 1-D copy problem directly (the server would need torch to load one).
  int64_t SeedProblem(const std::string& name = "copy") {
    auto store = store::LineageStore::Open(db());
    Check(store.status());
    store::ProblemRow row;
    row.name = name;
    row.file_path = name + ".py";
    row.source = "# " + name + "\n" + ks::testing::kCopyProblemSource;  // the name makes each problem's hash its own
    row.signature_json = SignatureToJson(ks::testing::CopySignature(row.file_path, name)).dump();
    row.sha256 = Sha256Hex(row.source);
    auto id = (*store)->PutProblem(row);
    Check(id.status());
    return *id;
  }

  // Starts the server and waits (generously: 2-core CI) for its listening line.
  void Start() {
    std::vector<std::string> argv = {ks::testing::CliBinary(), "serve", "--listen", "127.0.0.1:0", "--token-file", Path("token"),
                                     "--db", db(), "--model", "command:" + Path("model.sh"), "--poll-interval", "0.05"};
    argv.push_back("--evaluator");
    argv.push_back(opts_.evaluator.empty() ? "fake:" + Path("evaluator.json") : opts_.evaluator);
    for (const auto& a : opts_.extra_args) argv.push_back(a);
    std::map<std::string, std::string> env = {{"KS_FAKE_MODEL_DELAY", std::to_string(opts_.llm_sleep_s)},
                                              {"KS_FAKE_MODEL_CALLS", Path("llm_calls.log")}};
    auto child = ChildProcess::Start(argv, env, Path("server.log." + std::to_string(starts_++)));
    Check(child.status());
    child_ = std::move(child).value();
    std::string line;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      char ch;
      Status st = ReadExact(child_.stdout_fd(), &ch, 1, 60);
      if (!st.ok()) Fail("server did not start: " + st.ToString() + "\n" + Log());
      if (ch == '\n') break;
      line += ch;
    }
    const std::string prefix = "listening on ";
    if (line.rfind(prefix, 0) != 0) Fail("unexpected first line: " + line + "\n" + Log());
    address_ = line.substr(prefix.size());
  }

  // SIGTERM; returns how the server ended ("exit code 0"), waiting up to 60 s.
  std::string Terminate() {
    ::kill(child_.pid(), SIGTERM);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      if (auto how = child_.TryReap()) return *how;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return "still running after 60 s";
  }
  void KillHard() { child_.Kill(); }
  pid_t pid() const { return child_.pid(); }

  std::unique_ptr<server::Client> Connect(const std::string& token, const std::string& tls_ca = "") const {
    server::ClientOptions o;
    o.address = address_;
    o.token = token;
    o.tls_ca = tls_ca;
    o.timeout_s = 60;
    auto c = server::Client::Connect(o);
    Check(c.status());
    return std::move(c).value();
  }
  std::unique_ptr<server::Client> Connect() const { return Connect(token_); }

  std::string Log() const {
    std::string all;
    for (int i = 0; i < starts_; ++i) {
      auto t = ReadFile(Path("server.log." + std::to_string(i)));
      if (t.ok()) all += *t;
    }
    return all;
  }
  // Model calls started so far (the model script counts them).
  size_t LlmCallsStarted() const {
    auto text = ReadFile(Path("llm_calls.log"));
    if (!text.ok()) return 0;
    return static_cast<size_t>(std::count(text->begin(), text->end(), '\n'));
  }

  // Lines of the scripted evaluator's log: one content hash per evaluation.
  std::vector<std::string> Evaluated() const {
    std::vector<std::string> out;
    std::ifstream in(Path("evaluated.log"));
    for (std::string l; std::getline(in, l);)
      if (!l.empty()) out.push_back(l);
    return out;
  }

 private:
  static void Check(const Status& s) {
    if (!s.ok()) Fail(s.ToString());
  }
  [[noreturn]] static void Fail(const std::string& why) {
    std::fprintf(stderr, "harness: %s\n", why.c_str());
    std::abort();
  }

  HarnessOptions opts_;
  ks::testing::TempDir dir_{"ks_e2e_"};
  std::string token_;
  std::string address_;
  ChildProcess child_;
  int starts_ = 0;
};

}  // namespace ks::e2e
