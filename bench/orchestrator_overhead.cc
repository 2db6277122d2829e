// Orchestrator overhead: the time a search spends outside model calls and GPU
// work (store writes, prompt rendering, reply parsing, beam selection, thread
// hand-offs). Runs a search with a model that answers at once and a scripted
// evaluator that does no work, so nearly all measured time is overhead; also
// reports the split the orchestrator itself measures (wall - evaluator - wait).
// Usage: orchestrator_overhead [rounds ideas branches beam]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/files.h"
#include "search/orchestrator.h"
#include "search/scripted_evaluator.h"

namespace {

class InstantLlm : public ks::LlmClient {
 public:
  ks::StatusOr<std::string> Complete(const ks::LlmRequest& r, ks::LlmCallRecord* record) override {
    std::string h = ks::Sha256Hex(r.prompt + std::to_string(n_++));
    std::string reply;
    if (r.role == "ideas") {
      reply = "```json\n[";
      for (int i = 0; i < 8; ++i) reply += (i ? "," : "") + std::string("{\"title\": \"t") + h.substr(i, 6) +
                                           "\", \"idea\": \"idea " + h.substr(i, 12) + "\"}";
      reply += "]\n```";
    } else {
      double ms = 0.1 + (std::stoul(h.substr(0, 6), nullptr, 16) % 1000) / 1000.0;
      reply = "```cuda\nextern \"C\" __global__ void k" + h.substr(0, 8) + "(float* out) { /* FAKE_MS(" +
              std::to_string(ms) + ") */ out[0] = 1; }\n```\n```json\n{\"launches\": [{\"kernel\": \"k" +
              h.substr(0, 8) + "\", \"grid\": [1], \"block\": [1], \"args\": [\"out\"]}]}\n```";
    }
    if (record) {
      record->role = r.role;
      record->prompt = r.prompt;
      record->system = r.system;
      record->response = reply;
      record->backend = "instant";
    }
    return reply;
  }
  std::string Describe() const override { return "instant"; }

 private:
  std::atomic<int64_t> n_{0};
};

}  // namespace

int main(int argc, char** argv) {
  ks::SearchConfig c;
  c.rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  c.ideas = argc > 2 ? std::atoi(argv[2]) : 4;
  c.branches = argc > 3 ? std::atoi(argv[3]) : 4;
  c.beam = argc > 4 ? std::atoi(argv[4]) : 4;
  c.repair_attempts = 0;
  c.model = "instant";
  std::string dir = (std::filesystem::temp_directory_path() / ("ks_bench_" + std::to_string(getpid()))).string();
  auto store = ks::store::LineageStore::Open(dir + "/lineage.db");
  auto prompts = ks::PromptLibrary::Load(std::string(KS_SOURCE_DIR) + "/prompts");
  if (!store.ok() || !prompts.ok()) {
    std::fprintf(stderr, "setup failed: %s %s\n", store.status().ToString().c_str(), prompts.status().ToString().c_str());
    return 1;
  }
  ks::Signature sig;
  sig.name = "copy";
  sig.inputs.push_back({.name = "x", .dtype = ks::DType::kFloat32, .shape = {1 << 20}, .strides = {1}});
  sig.outputs.push_back({.name = "out", .dtype = ks::DType::kFloat32, .shape = {1 << 20}, .strides = {1}});
  auto id = ks::Orchestrator::CreateSearch(store->get(), "copy.py", "class Model: pass\n", sig, c);
  InstantLlm llm;
  ks::ScriptedEvaluator evaluator({});
  ks::Orchestrator orch({store->get(), &llm, &evaluator, &*prompts}, nullptr);
  auto out = orch.Run(*id);
  if (!out.ok()) {
    std::fprintf(stderr, "search failed: %s\n", out.status().ToString().c_str());
    return 1;
  }
  int64_t candidates = static_cast<int64_t>(store->get()->ListCandidates(*id)->size());
  int64_t calls = out->llm_calls_now;
  double overhead = out->wall_s - out->evaluator_s - out->llm_wait_s;
  std::printf("search: rounds=%d ideas=%d branches=%d beam=%d\n", c.rounds, c.ideas, c.branches, c.beam);
  std::printf("candidates=%lld model_calls=%lld evaluator_batches=%lld\n", static_cast<long long>(candidates),
              static_cast<long long>(calls), static_cast<long long>(evaluator.batches()));
  std::printf("wall=%.3f s  (instant model, no-op evaluator: all of it is orchestrator time)\n", out->wall_s);
  std::printf("per candidate=%.3f ms  per model call=%.3f ms\n", 1e3 * out->wall_s / candidates,
              1e3 * out->wall_s / calls);
  std::printf("orchestrator's own split: evaluator=%.3f s, waiting on model tasks=%.3f s, rest=%.3f s\n",
              out->evaluator_s, out->llm_wait_s, overhead);
  std::filesystem::remove_all(dir);
  return 0;
}
