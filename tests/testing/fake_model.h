// The fake model, in-process: an LlmClient that answers from its prompt, for
// tests that run a search, a suite or an agent in the test binary. Its twin for
// tests that run the real binaries is tests/testing/fake_model.sh (a `command:`
// model; FakeModelCommand() names it), with the same reply shapes:
//  - ideas: a JSON list of three ideas named after the prompt's hash;
//  - implement, repair: a copy kernel (out[i] = x[i]) and its launch plan,
//    carrying the scripted evaluator's markers (search/scripted_evaluator.h):
//    FAKE_MS(...) from a hash of the prompt and of how often that prompt was
//    asked (so that K branches of one prompt differ), FAKE_STATUS(...) when a
//    test asks for one.
// A test changes the replies of a role (ideas_, implement_, repair_) and can act
// after each call (after_call_: cancel a search after N calls). Each call is
// recorded like a paid one (100 tokens in, 50 out, $0.01). Thread-safe for
// Complete; set the members before the first call. Uses ks_llm (LlmClient) and
// ks_common (Sha256Hex).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "common/files.h"
#include "llm/llm_client.h"
#include "tests/testing/paths.h"

namespace ks::testing {

class FakeModel : public LlmClient {
 public:
  // A reply to `request`, the `occurrence`-th time (from 0) its role and prompt were asked.
  using Reply = std::function<std::string(const LlmRequest& request, int occurrence)>;

  StatusOr<std::string> Complete(const LlmRequest& r, LlmCallRecord* record) override {
    int occurrence, calls;
    {
      std::lock_guard<std::mutex> lock(mu_);
      occurrence = seen_[r.role + '\0' + r.prompt]++;
      calls = ++calls_;
      prompts_[r.role].push_back(r.prompt);
    }
    if (after_call_) after_call_(calls);
    std::string reply;
    if (r.role == "ideas") reply = ideas_ ? ideas_(r, occurrence) : Ideas(r.prompt);
    else if (r.role == "implement") reply = implement_ ? implement_(r, occurrence) : Kernel(r.prompt, occurrence, "");
    else reply = repair_ ? repair_(r, occurrence) : Kernel(r.prompt, occurrence, "");
    if (record) {
      record->role = r.role;
      record->backend = "fake";
      record->model = model_;
      record->system = r.system;
      record->prompt = r.prompt;
      record->response = reply;
      record->tokens_in = 100;
      record->tokens_out = 50;
      record->cost_usd = 0.01;
      record->attempts = 1;
    }
    return reply;
  }
  std::string Describe() const override { return "fake"; }

  // Three ideas named after the prompt's hash.
  static std::string Ideas(const std::string& prompt) {
    std::string h = Sha256Hex(prompt).substr(0, 8);
    return "```json\n[{\"title\": \"idea-" + h + "-a\", \"idea\": \"tile it " + h +
           "\"}, {\"title\": \"idea-" + h + "-b\", \"idea\": \"vectorize it " + h +
           "\"}, {\"title\": \"idea-" + h + "-c\", \"idea\": \"fuse it " + h + "\"}]\n```\n";
  }
  // A copy kernel whose time is a function of (prompt, occurrence); `status`
  // ("incorrect", "compile_error", ...) adds FAKE_STATUS(status).
  static std::string Kernel(const std::string& prompt, int occurrence, const std::string& status) {
    std::string h = Sha256Hex(prompt + std::to_string(occurrence));
    double ms = 0.1 + (std::stoul(h.substr(0, 6), nullptr, 16) % 1000) / 1000.0;
    std::string marker = "FAKE_MS(" + std::to_string(ms) + ")";
    if (!status.empty()) marker += " FAKE_STATUS(" + status + ")";
    return "Here it is.\n" + KernelWithMarkers("k_" + h.substr(0, 8), marker);
  }
  // The copy kernel named `name` with `markers` in its comment, and its launch plan.
  static std::string KernelWithMarkers(const std::string& name, const std::string& markers) {
    return "```cuda\nextern \"C\" __global__ void " + name + "(float* out, const float* x, int n) { /* " + markers +
           " */ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i]; }\n```\n"
           "```json\n{\"launches\": [{\"kernel\": \"" + name +
           "\", \"grid\": [\"cdiv(x.numel, 256)\"], \"block\": [256], \"args\": [\"out\", \"x\", \"x.numel\"]}]}\n```\n";
  }

  int calls() const { return calls_.load(); }
  std::vector<std::string> Prompts(const std::string& role) {
    std::lock_guard<std::mutex> lock(mu_);
    return prompts_[role];
  }

  // Set before the first call; null = the defaults above.
  Reply ideas_, implement_, repair_;
  // Called after each call is counted, with the count so far, before the reply.
  std::function<void(int calls)> after_call_;
  std::string model_ = "fake-1";  // the records' model

 private:
  std::mutex mu_;
  std::map<std::string, int> seen_;                          // guarded by mu_
  std::map<std::string, std::vector<std::string>> prompts_;  // guarded by mu_
  std::atomic<int> calls_{0};
};

// The fake model as a `command:` model spec, for the real binaries.
inline std::string FakeModelCommand() { return "command:/bin/sh " + SourcePath("tests/testing/fake_model.sh"); }

}  // namespace ks::testing
