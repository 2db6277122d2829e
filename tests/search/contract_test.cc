// prompts/contract.md teaches the whole launch-plan language: every key the
// plan parser accepts is documented there (the lists come from the parser
// itself, so a new key without documentation fails here), and the contract's
// device section renders this GPU's shared-memory limit and register budget.
// prompts/agent.md holds the agent mode's text: every section is there, every
// placeholder is one the code sets, the rendered text is what the model was
// always shown, and a missing or garbled template is a clear error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "evaluator/judge/judge.h"
#include "common/files.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/plan/launch_plan.h"
#include "search/agent.h"
#include "search/prompt_template.h"
#include "search/prompts.h"
#include "tests/testing/paths.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Contract() {
  auto text = ReadFile(ks::testing::SourcePath("prompts/contract.md"));
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

TEST(ContractTest, EveryKeyThePlanParserAcceptsIsDocumented) {
  const std::string contract = Contract();
  auto check = [&](auto const& keys, const char* level) {
    for (std::string_view k : keys)
      EXPECT_THAT(contract, HasSubstr("`\"" + std::string(k) + "\"`"))
          << level << " key \"" << k << "\" is accepted by the parser but not documented in prompts/contract.md";
  };
  check(kPlanKeys, "plan");
  check(kLaunchKeys, "launch");
  check(kScratchKeys, "scratch");
  check(kTensorMapKeys, "tensor map");
}

// The lists above are what the parser accepts: a plan that uses every listed
// key resolves, and one more key at any level is refused.
TEST(ContractTest, TheKeyListsAreTheParsersOwn) {
  Signature sig;
  sig.name = "t";
  TensorSpec x;
  x.name = "x";
  x.dtype = DType::kFloat32;
  x.shape = {4, 64};
  sig.inputs.push_back(x);
  x.name = "out";
  sig.outputs.push_back(x);
  KernelInfo k;
  k.name = "k";
  k.params = {ParamInfo{ParamKind::kB64, 8, 8}, ParamInfo{ParamKind::kB64, 8, 8}, ParamInfo{ParamKind::kB64, 8, 8}};
  nlohmann::json launch = {{"kernel", "k"}, {"grid", {2}}, {"block", {64}}, {"shared_bytes", "0"},
                           {"args", {"x", "out", "tmp"}}, {"cluster", {2}}};
  nlohmann::json scratch = {{"name", "tmp"}, {"bytes", "x.numel * 4"}};
  nlohmann::json map = {{"name", "tm"},          {"tensor", "x"},         {"dtype", "float32"},
                        {"dims", {64, 4}},       {"byte_strides", {256}}, {"box", {32, 4}},
                        {"element_strides", {1, 1}}, {"interleave", "none"}, {"swizzle", "128B"},
                        {"l2_promotion", "128B"}, {"oob_fill", "zero"}};
  k.params.push_back(ParamInfo{ParamKind::kBytes, 128, 64});
  launch["args"].push_back("tm");
  nlohmann::json plan = {{"launches", {launch}}, {"scratch", {scratch}}, {"tensor_maps", {map}}};
  for (std::string_view key : kTensorMapKeys) EXPECT_TRUE(map.contains(std::string(key))) << key;
  for (std::string_view key : kLaunchKeys) EXPECT_TRUE(launch.contains(std::string(key))) << key;
  for (std::string_view key : kScratchKeys) EXPECT_TRUE(scratch.contains(std::string(key))) << key;
  for (std::string_view key : kPlanKeys) EXPECT_TRUE(plan.contains(std::string(key))) << key;
  auto ok = ResolvePlan(plan.dump(), sig, {k}, PlanLimits());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  ASSERT_TRUE(ok->launches[0].cluster.has_value());

  for (auto* where : {&plan, &plan["launches"][0], &plan["scratch"][0], &plan["tensor_maps"][0]}) {
    nlohmann::json bad = plan;
    nlohmann::json* target = where == &plan                    ? &bad
                             : where == &plan["launches"][0]   ? &bad["launches"][0]
                             : where == &plan["scratch"][0]    ? &bad["scratch"][0]
                                                               : &bad["tensor_maps"][0];
    (*target)["undocumented"] = 1;
    auto r = ResolvePlan(bad.dump(), sig, {k}, PlanLimits());
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("unknown key \"undocumented\""));
  }
}

// The Hopper section's complete TMA load is code a model will copy: it
// compiles for sm_90a as written, with its CUtensorMap declared in the source.
TEST(ContractTest, TheTmaExampleCompilesForTheArchSpecificTarget) {
  const std::string contract = Contract();
  size_t at = contract.find("**A complete TMA load**");
  ASSERT_NE(at, std::string::npos);
  size_t open = contract.find("```cuda\n", at);
  ASSERT_NE(open, std::string::npos);
  open += 8;
  size_t close = contract.find("```", open);
  ASSERT_NE(close, std::string::npos);
  const std::string code = contract.substr(open, close - open);
  EXPECT_THAT(code, HasSubstr("struct alignas(64) CUtensorMap"));
  EXPECT_THAT(code, Not(HasSubstr("#include <cuda.h>")));
  CompileOptions o;
  o.worker_path = KS_WORKER_PATH;
  o.arch = "sm_90a";
  auto r = CompileCandidate(code, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->ok) << r->message << "\n" << r->log;
  ASSERT_EQ(r->kernels.size(), 1u);
  EXPECT_EQ(r->kernels[0].name, "tile_copy");
  EXPECT_EQ(r->kernels[0].params[0].kind, ParamKind::kBytes);  // the map, by value
  EXPECT_EQ(r->kernels[0].params[0].size, 128);
}

TEST(ContractTest, ClustersAreTaughtWithTheirDeviceSide) {
  const std::string contract = Contract();
  for (const char* needed : {"\"cluster\": [2]", "cooperative_groups", "this_cluster()", "map_shared_rank",
                             "cluster.sync()"})
    EXPECT_THAT(contract, HasSubstr(needed));
}

TEST(ContractTest, TheDeviceSectionRendersThisGpusLimits) {
  auto lib = PromptLibrary::Load(ks::testing::SourcePath("prompts"));
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  GpuFacts h100{"NVIDIA H100 80GB HBM3", "9.0", 132, 232448, 233472, 52428800, 65536, 3010, 51.2, 361, 684};
  h100.max_threads_per_sm = 2048;
  h100.max_blocks_per_sm = 32;
  h100.max_registers_per_thread = 255;
  TemplateVars v;
  v.Set("launch_limits", LaunchLimitsText(h100));
  v.Set("judging", DescribeContract(Contract::kHigh));
  v.SetList("hopper", HopperRecords(h100));
  auto out = lib->Render("contract", v);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_THAT(*out, HasSubstr("227.0 KiB at most (static + dynamic, the opt-in limit"));
  EXPECT_THAT(*out, HasSubstr("228.0 KiB per SM"));
  // Issue 36: what is judged, under the search's contract, and never PyTorch's rounding.
  EXPECT_THAT(*out, HasSubstr("model run in float64 (precision contract 'high'"));
  EXPECT_THAT(*out, HasSubstr("never try to reproduce PyTorch's float32"));
  // 65536 registers: 128 threads may use all 255 and still fit; full occupancy
  // (16 blocks of 128) leaves 32 each; 1024 threads get 64 at most.
  EXPECT_THAT(*out, HasSubstr("| 128 | 255 | 32 (16 blocks, 2048 threads per SM) |"));
  EXPECT_THAT(*out, HasSubstr("| 1024 | 64 | 32 (2 blocks, 2048 threads per SM) |"));
  EXPECT_THAT(*out, HasSubstr("| 64 | 255 | 32 (32 blocks, 2048 threads per SM) |"));

  // The Hopper section, with its target, only where the GPU has one.
  EXPECT_THAT(*out, HasSubstr("### This GPU: sm_90a"));
  EXPECT_THAT(*out, HasSubstr("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"));
  EXPECT_THAT(*out, HasSubstr("wgmma.fence.sync.aligned"));
  GpuFacts a100 = h100;
  a100.compute_capability = "8.0";
  v.SetList("hopper", HopperRecords(a100));
  auto ampere = lib->Render("contract", v);
  ASSERT_TRUE(ampere.ok()) << ampere.status().ToString();
  EXPECT_THAT(*ampere, Not(HasSubstr("wgmma.fence")));
  EXPECT_THAT(*ampere, Not(HasSubstr("sm_90a")));
  EXPECT_THAT(*ampere, HasSubstr("`\"tensor_maps\"`"));  // the keys are documented for every GPU

  GpuFacts unknown;
  std::string text = LaunchLimitsText(unknown);
  EXPECT_THAT(text, HasSubstr("Shared memory per block: unknown"));
  EXPECT_THAT(text, HasSubstr("Registers per thread at each block size: unknown"));
  GpuFacts partial = h100;
  partial.max_threads_per_sm = 0;  // the budget for one block is known, full occupancy is not
  EXPECT_THAT(LaunchLimitsText(partial), HasSubstr("| 256 | 255 | unknown |"));
  EXPECT_THAT(LaunchLimitsText(partial), Not(HasSubstr("blocks, 2048 threads")));
}

// The agent's text as search/agent.cc wrote it in code before it moved to
// prompts/agent.md. A resumed agent finds its stored model turns by a hash of
// the conversation, so the template renders these bytes exactly.
std::string LegacyAgentInstructions(const AgentLimits& limits, bool profile) {
  std::string budget = fmt::format("at most {} tool calls and {} turns", limits.max_tool_calls, limits.max_turns);
  if (limits.max_tokens > 0) budget += fmt::format(" and {} tokens", limits.max_tokens);
  return "## Working with tools\n\n"
         "You may work on this idea like an engineer at a terminal: call `compile` to see compiler errors, "
         "registers, shared memory and spills; call `test` to run a draft on practice input sets and see its "
         "errors and timing" +
         std::string(profile ? "; call `profile` to read a draft's hardware counters (throughput, occupancy, "
                               "stalls)" : "") +
         ". When satisfied, call `submit` with the final source and launch plan; it is then "
         "judged on other input sets than the practice ones, so do not tune to the practice figures. Each tool "
         "takes {\"source\": the CUDA-C source, \"plan\": the launch plan as a JSON object}. You have " +
         budget + "; when they run out, the last draft that tested correct is judged.";
}

nlohmann::json LegacySchema(const char* what) {
  return {{"type", "object"},
          {"properties",
           {{"source", {{"type", "string"}, {"description", "the CUDA-C source: device code only, extern \"C\" __global__ entry points"}}},
            {"plan", {{"type", "object"}, {"description", std::string("the launch plan (JSON object) ") + what}}}}},
          {"required", {"source", "plan"}}};
}

std::vector<ToolSpec> LegacyAgentTools(bool profile) {
  std::vector<ToolSpec> tools = {
      {"compile", "Compile a draft with NVRTC and resolve its launch plan, on the GPU that judges it. Returns the "
                  "status, the compiler log, registers, shared memory and spills per kernel, and the resolved launches.",
       LegacySchema("to resolve")},
      {"test", "Run a draft on practice input sets (other seeds than the judging sets) in the sandboxed worker. "
               "Returns correctness figures per output (relative norm vs its bound, mismatches, the first wrong "
               "element by position), the median time, speedups, the roofline fraction and per-launch figures.",
       LegacySchema("to run")},
      {"submit", "Submit the final candidate. It is judged on the judging input sets; the conversation ends.",
       LegacySchema("of the final candidate")},
  };
  if (profile)
    tools.insert(tools.end() - 1,
                 {"profile", "Read the hardware counters (Nsight Compute) of each launch of a draft on a practice "
                             "input set: DRAM and L2 throughput, SM and tensor pipe use, occupancy, the top warp "
                             "stalls, cache hit rates, shared-memory bank conflicts, spill traffic. Slower than test.",
                  LegacySchema("to profile")});
  return tools;
}

PromptLibrary SourceLibrary() {
  auto lib = PromptLibrary::Load(ks::testing::SourcePath("prompts"));
  EXPECT_TRUE(lib.ok()) << lib.status().ToString();
  return lib.ok() ? *lib : PromptLibrary();
}

TEST(AgentTemplateTest, TheRenderedTextIsWhatTheModelWasAlwaysShown) {
  PromptLibrary lib = SourceLibrary();
  for (bool profile : {false, true}) {
    for (AgentLimits limits : {AgentLimits{}, AgentLimits{3, 5, 20000}}) {
      SCOPED_TRACE(fmt::format("profile {}, tokens {}", profile, limits.max_tokens));
      auto text = RenderAgentText(lib, limits, profile);
      ASSERT_TRUE(text.ok()) << text.status().ToString();
      EXPECT_EQ(text->instructions, LegacyAgentInstructions(limits, profile));
      std::vector<ToolSpec> want = LegacyAgentTools(profile);
      ASSERT_EQ(text->tools.size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(text->tools[i].name, want[i].name);
        EXPECT_EQ(text->tools[i].description, want[i].description);
        EXPECT_EQ(text->tools[i].parameters.dump(), want[i].parameters.dump());
      }
    }
  }
  // Key sentences, in case both sides above ever change together.
  auto text = RenderAgentText(lib, AgentLimits{8, 12, 0}, true);
  ASSERT_TRUE(text.ok());
  EXPECT_THAT(text->instructions, HasSubstr("You have at most 12 tool calls and 8 turns; when they run out"));
  EXPECT_THAT(text->instructions, HasSubstr("call `profile` to read a draft's hardware counters"));
  EXPECT_THAT(text->instructions, Not(HasSubstr("{{")));
  EXPECT_THAT(text->instructions, Not(HasSubstr("tokens")));
}

// Every variable and list a section names, found by the tags in its text.
std::set<std::string> Placeholders(const std::string& text) {
  std::set<std::string> out;
  static const std::regex tag(R"(\{\{\s*([#^/>]?)\s*([^}]*?)\s*\}\})");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), tag); it != std::sregex_iterator(); ++it)
    if ((*it)[1] != ">") out.insert((*it)[2]);
  return out;
}

TEST(AgentTemplateTest, EverySectionIsThereAndNamesOnlyWhatTheCodeSets) {
  PromptLibrary lib = SourceLibrary();
  std::vector<std::string> names = lib.Names();
  const TemplateVars vars = AgentTemplateVars(AgentLimits{}, true);
  std::set<std::string> used;
  for (const char* section : kAgentSections) {
    const std::string name = std::string("agent.") + section;
    ASSERT_NE(std::find(names.begin(), names.end(), name), names.end()) << name << " missing from prompts/agent.md";
    auto raw = ReadFile(ks::testing::SourcePath("prompts/agent.md"));
    ASSERT_TRUE(raw.ok());
    auto parts = SplitTemplateSections("agent", *raw);
    ASSERT_TRUE(parts.ok()) << parts.status().ToString();
    for (const std::string& p : Placeholders(parts->at(name))) {
      EXPECT_TRUE(vars.Find(p) || vars.FindList(p)) << name << " names '" << p << "', which the code never sets";
      used.insert(p);
    }
  }
  // No section beyond the ones the code renders (a tool the code never offers).
  for (const std::string& n : names) {
    if (n.rfind("agent.", 0) != 0) continue;
    EXPECT_NE(std::find_if(std::begin(kAgentSections), std::end(kAgentSections),
                           [&](const char* s) { return n == std::string("agent.") + s; }),
              std::end(kAgentSections))
        << n << " is a section no code renders";
  }
  EXPECT_EQ(names.end(), std::find(names.begin(), names.end(), "agent"));  // the note is never a template
  for (const char* v : {"max_tool_calls", "max_turns", "max_tokens", "profile_offered", "token_limit"})
    EXPECT_TRUE(used.count(v)) << v << " is set by the code but used by no section";
}

// prompts/ copied to a temporary directory with agent.md replaced.
class BrokenAgentTemplate : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::copy(ks::testing::SourcePath("prompts"), dir_.path());
    auto text = ReadFile((dir_ / "agent.md").string());
    ASSERT_TRUE(text.ok());
    original_ = *text;
  }

  // agent.md as shipped, with `from` replaced by `to` (from must be there).
  void Replace(const std::string& from, const std::string& to) {
    std::string text = original_;
    size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    ASSERT_TRUE(WriteFile((dir_ / "agent.md").string(), text).ok());
  }
  StatusOr<AgentText> Render() {
    auto lib = PromptLibrary::Load(dir_.string());
    if (!lib.ok()) return lib.status();
    return RenderAgentText(*lib, AgentLimits{}, false);
  }

  ks::testing::TempDir dir_{"ks_agent_template_"};
  std::string original_;
};

TEST_F(BrokenAgentTemplate, AMissingSectionIsNamedEvenWhereItsToolIsNotOffered) {
  Replace("{{@ profile}}\n", "");  // its text now ends test_plan's section
  auto r = Render();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("agent.md has no section 'profile'"));
  EXPECT_THAT(r.status().message(), HasSubstr("'{{@ profile}}'"));
}

TEST_F(BrokenAgentTemplate, NoAgentFileAtAllSaysWhichFileAndSection) {
  std::filesystem::remove(dir_ / "agent.md");
  auto r = Render();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(dir_.string() + "/agent.md has no section 'instructions'"));
}

TEST_F(BrokenAgentTemplate, AnUnknownPlaceholderNamesItAndItsSection) {
  Replace("{{max_turns}} turns", "{{max_turn}} turns");
  auto r = Render();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("missing variable 'max_turn'"));
  EXPECT_THAT(r.status().message(), HasSubstr("section 'instructions'"));
}

TEST_F(BrokenAgentTemplate, AnUnclosedListIsAnError) {
  Replace("tokens{{/token_limit}}", "tokens");
  auto r = Render();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("'token_limit' is never closed"));
}

TEST_F(BrokenAgentTemplate, AGarbledSectionLineFailsTheLoadWithItsLine) {
  Replace("{{@ submit}}", "{{@ submit tool}}");
  auto r = Render();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("template file 'agent.md' line"));
  EXPECT_THAT(r.status().message(), HasSubstr("letters, digits and '_'"));
  Replace("{{@ submit}}", "{{@ submit}} the final one");
  r = Render();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("alone on its line"));
  Replace("{{@ submit}}", "{{@ compile}}");
  r = Render();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("section 'compile' appears twice"));
}

// RunAgent renders the text before any model turn: a broken template stops it
// with the reason, and nothing is asked of the model or stored.
class NoCallsHost final : public AgentHost {
 public:
  StatusOr<std::optional<AssistantReply>> Converse(const ConversationRequest&, const std::string&) override {
    ++calls;
    return std::optional<AssistantReply>();
  }
  StatusOr<Evaluation> Practice(const Candidate&) override { return Internal("unexpected"); }
  StatusOr<Evaluation> CompileOnly(const Candidate&) override { return Internal("unexpected"); }
  StatusOr<CounterReport> Profile(const Candidate&) override { return Internal("unexpected"); }
  StatusOr<std::vector<store::AttemptRow>> StoredAttempts(const std::string&) override {
    return std::vector<store::AttemptRow>{};
  }
  Status StoreAttempt(const store::AttemptRow&) override { return Internal("unexpected"); }
  int calls = 0;
};

TEST_F(BrokenAgentTemplate, TheAgentStopsBeforeAnyModelTurn) {
  Replace("{{@ instructions}}", "{{@ instruction}}");
  auto lib = PromptLibrary::Load(dir_.string());
  ASSERT_TRUE(lib.ok()) << lib.status().ToString();
  AgentTask task;
  task.slot = "r0/i1/b0";
  task.prompts = &*lib;
  NoCallsHost host;
  auto out = RunAgent(task, &host);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("no section 'instructions'"));
  EXPECT_EQ(host.calls, 0);

  // The shipped text, through the default library: one turn asked (and refused).
  task.prompts = nullptr;
  auto ok = RunAgent(task, &host);
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->stop, AgentStop::kRefused) << AgentStopName(ok->stop);
  EXPECT_EQ(host.calls, 1);
}

}  // namespace
}  // namespace ks
