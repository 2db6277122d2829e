// Prompt templates render completely with a real problem and a realistic
// evaluation, fail loudly when a variable is missing, and the reply parsers
// read what models actually write.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "common/files.h"
#include "search/kernel_bank.h"
#include "search/prompt_template.h"
#include "search/prompts.h"
#include "search/response_parser.h"
#include "tests/testing/paths.h"

namespace ks {
namespace {

using ::testing::HasSubstr;

PromptLibrary Library() {
  auto lib = PromptLibrary::Load(ks::testing::SourcePath("prompts"));
  EXPECT_TRUE(lib.ok()) << lib.status().ToString();
  return lib.ok() ? *lib : PromptLibrary();
}

// problems/layernorm_large.py as the reference bridge describes it.
ProblemContext LayerNormProblem() {
  ProblemContext p;
  p.name = "layernorm_large";
  auto src = ReadFile(ks::testing::SourcePath("problems/layernorm_large.py"));
  EXPECT_TRUE(src.ok()) << src.status().ToString();
  p.source = src.ok() ? *src : "";
  auto sig = SignatureFromJson(nlohmann::json::parse(R"({
    "file": "problems/layernorm_large.py", "name": "layernorm_large",
    "description": "LayerNorm over the last three dims (64,256,256) of a 16x64x256x256 fp32 tensor",
    "inputs": [{"name": "x", "dtype": "float32", "shape": [16, 64, 256, 256], "strides": [4194304, 65536, 256, 1]}],
    "parameters": [
      {"name": "ln.weight", "dtype": "float32", "shape": [64, 256, 256], "strides": [65536, 256, 1]},
      {"name": "ln.bias", "dtype": "float32", "shape": [64, 256, 256], "strides": [65536, 256, 1]}],
    "outputs": [{"name": "out", "dtype": "float32", "shape": [16, 64, 256, 256], "strides": [4194304, 65536, 256, 1]}]
  })"));
  EXPECT_TRUE(sig.ok()) << sig.status().ToString();
  if (sig.ok()) p.signature = *sig;
  p.gpu = {"NVIDIA H100 80GB HBM3", "9.0", 132, 232448, 233472, 52428800, 65536, 3010, 51.2, 361, 684};
  return p;
}

Candidate SeedCandidate() {
  return {"extern \"C\" __global__ void row_stats(const float* x, double* partial, long long rows, long long n) {}\n",
          R"({"launches": [{"kernel": "row_stats", "grid": ["x.shape[0]"], "block": [256], "args": ["x", "partial", "x.shape[0]", "x.numel"]}], "scratch": [{"name": "partial", "bytes": "x.shape[0] * 16"}]})"};
}

Evaluation MeasuredEvaluation() {
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.device = "NVIDIA H100 80GB HBM3";
  e.timing = TimingStats{1.234, 1.25, 1.2, 1.3, 0.02, 100};
  e.eager = TimingStats{2.5, 2.5, 2.4, 2.6, 0.03, 100};
  e.compiled = TimingStats{1.8, 1.8, 1.7, 1.9, 0.03, 100};
  e.speedup_eager = 2.5 / 1.234;
  e.speedup_compile = 1.8 / 1.234;
  e.roofline = Roofline{5.4e8, 0, 437.6, 0, 0.179, 0.151};
  e.resources = {{"row_stats", 40, 2048, 0, 0, 0}};
  ResolvedLaunch l;
  l.kernel = "row_stats";
  l.grid[0] = 16;
  l.block[0] = 256;
  e.launches = {l};
  return e;
}

TEST(LlmPromptTest, IdeasPromptHasEverythingTheModelNeeds) {
  PromptLibrary lib = Library();
  IdeasPromptInputs in;
  in.problem = LayerNormProblem();
  in.parent.candidate = SeedCandidate();
  in.parent.evaluation = MeasuredEvaluation();
  in.tried = {{"vectorized float4 loads", "correct, 1.3x over the parent"},
              {"one block per row with a tree reduction", "incorrect: max abs error 0.4"}};
  in.num_ideas = 5;
  auto p = RenderIdeasPrompt(lib, in);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string& u = p->user;
  for (const char* needle :
       {"class Model(torch.nn.Module)", "| input | `x` | float32 | [16, 64, 256, 256]", "`ln.weight`",
        "NVIDIA H100 80GB HBM3", "132 SMs", "227.0 KiB per block", "50.0 MiB", "3010 GB/s", "FP32 51.2", "TF32 tensor cores 361",
        "FP16/BF16 tensor cores 684",
        "extern \"C\" __global__", "NVRTC", "\"launches\"", "cdiv(", "row_stats", "median 1.2340 ms",
        "Speedup over eager: 2.03x", "15% of the achievable speed", "40 registers/thread",
        "- vectorized float4 loads → correct, 1.3x over the parent",
        "one block per row with a tree reduction → incorrect", "Propose 5 distinct ideas", "```json"})
    EXPECT_NE(u.find(needle), std::string::npos) << "missing: " << needle;
  EXPECT_EQ(u.find("None yet."), std::string::npos);
  EXPECT_EQ(u.find("{{"), std::string::npos);
  EXPECT_NE(p->system.find("CUDA"), std::string::npos);
  LlmRequest req = p->ToRequest("ideas");
  EXPECT_EQ(req.role, "ideas");
  EXPECT_EQ(req.prompt, u);
}

TEST(LlmPromptTest, ASpecialisedParentSaysWhichShiftedInputsBrokeIt) {
  Evaluation e;
  e.status = EvalStatus::kCorrect;
  e.timing = TimingStats{0.5, 0.5, 0.5, 0.5, 0, 20};
  e.speedup_eager = 2.8;
  e.robustness = Robustness{{{"get_inputs", "held", "3 input set(s) from get_inputs()"},
                             {"scale_up", "broke", "floating-point inputs x 1e5: output 'out' wrong"}},
                            "scale_up"};
  ParentKernel parent;
  parent.evaluation = e;
  EXPECT_THAT(MeasurementsText(parent), HasSubstr("- Inputs: specialised: correct on the get_inputs() sets, but "
                                                  "'scale_up' broke it (floating-point inputs x 1e5"));
  EXPECT_THAT(FiguresLine(e), HasSubstr("(specialised: 'scale_up' broke it)"));
  e.robustness->broken_by.clear();  // a robust kernel: nothing extra to say
  parent.evaluation = e;
  EXPECT_THAT(MeasurementsText(parent), ::testing::Not(HasSubstr("specialised")));
  EXPECT_THAT(FiguresLine(e), ::testing::Not(HasSubstr("specialised")));
}

TEST(LlmPromptTest, UnmeasuredPeaksAreUnknownNotZero) {
  GpuFacts g = LayerNormProblem().gpu;
  g.fp32_tflops = g.tf32_tflops = g.fp16_tensor_tflops = 0;
  std::string text = GpuFactsText(g);
  EXPECT_THAT(text, HasSubstr("- Compute peaks: unknown"));
  EXPECT_EQ(text.find("0.0 TFLOP"), std::string::npos) << text;
  g.fp32_tflops = 51.2;
  text = GpuFactsText(g);
  EXPECT_THAT(text, HasSubstr("Dense matmul peaks (measured, cuBLAS), TFLOP/s: FP32 51.2"));
  EXPECT_EQ(text.find("TF32"), std::string::npos) << text;
}

TEST(LlmPromptTest, IdeasPromptFromTheReferenceWithNothingTried) {
  IdeasPromptInputs in;
  in.problem = LayerNormProblem();
  in.parent.eager = TimingStats{2.5, 2.5, 2.4, 2.6, 0.03, 100};
  auto p = RenderIdeasPrompt(Library(), in);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_NE(p->user.find("None yet."), std::string::npos);
  EXPECT_NE(p->user.find("PyTorch eager: median 2.5000 ms"), std::string::npos);
  EXPECT_NE(p->user.find("No kernel yet"), std::string::npos);
}

TEST(LlmPromptTest, ImplementAndRepairPromptsRender) {
  PromptLibrary lib = Library();
  ImplementPromptInputs im;
  im.problem = LayerNormProblem();
  im.parent.candidate = SeedCandidate();
  im.parent.evaluation = MeasuredEvaluation();
  im.idea = "Two-pass Welford with float4 loads and one block per 4096-element chunk";
  auto p = RenderImplementPrompt(lib, im);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_NE(p->user.find(im.idea), std::string::npos);
  EXPECT_NE(p->user.find("```cuda block"), std::string::npos);
  EXPECT_EQ(p->user.find("{{"), std::string::npos);

  RepairPromptInputs rp;
  rp.problem = LayerNormProblem();
  rp.idea = im.idea;
  rp.candidate = SeedCandidate();
  rp.evaluation.status = EvalStatus::kCompileError;
  rp.evaluation.message = "NVRTC failed";
  rp.evaluation.compile_log = "kernel.cu(3): error: identifier \"blockDimx\" is undefined";
  auto r = RenderRepairPrompt(lib, rp);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->user.find("What went wrong: compile_error"), std::string::npos);
  EXPECT_NE(r->user.find("identifier \"blockDimx\" is undefined"), std::string::npos);
  EXPECT_NE(r->user.find("long long rows"), std::string::npos);

  rp.evaluation = Evaluation{};
  rp.evaluation.status = EvalStatus::kIncorrect;
  OutputError oe;
  oe.name = "out";
  oe.max_abs = 0.4;
  oe.mismatches = 1024;
  oe.first_mismatch = 65536;
  rp.evaluation.errors = {oe};
  r = RenderRepairPrompt(lib, rp);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->user.find("1024 elements outside tolerance (first at flat index 65536)"), std::string::npos);
}

// Issue 15: an unmeasured device (a split search before its GPU node
// reported) is described as unknown, never as zeros or blanks.
TEST(LlmPromptTest, UnmeasuredFactsAreUnknownNeverZeroOrBlank) {
  GpuFacts g;
  std::string text = GpuFactsText(g);
  EXPECT_THAT(text, HasSubstr("- GPU model unknown (compute capability unknown), unknown SMs"));
  EXPECT_THAT(text, HasSubstr("- Shared memory: unknown per block"));
  EXPECT_THAT(text, HasSubstr("- L2 cache: unknown"));
  EXPECT_THAT(text, HasSubstr("- Memory bandwidth (measured): unknown"));
  for (const char* bad : {" 0 SMs", "0 B", "0 GB/s", "()", "capability )"})
    EXPECT_EQ(text.find(bad), std::string::npos) << bad << " in:\n" << text;
  g.name = "NVIDIA H100 80GB HBM3";
  g.memory_bandwidth_gbps = 2951;
  text = GpuFactsText(g);
  EXPECT_THAT(text, HasSubstr("- NVIDIA H100 80GB HBM3 (compute capability unknown), unknown SMs"));
  EXPECT_THAT(text, HasSubstr("Memory bandwidth (measured): 2951 GB/s"));
}

// Issue 15, the kernel bank: the similarity rule and what prompts show.
TEST(KernelBankTest, SimilarityIsTheOverlapOfTheTorchOperationsNamed) {
  const std::string softmax = "import torch\nclass Model(torch.nn.Module):\n  def forward(self, x):\n"
                              "    return torch.softmax(x, dim=1)\ndef get_inputs():\n  return [torch.randn(8, 8)]\n";
  const std::string softmax_f = "import torch.nn.functional as F\nclass Model(torch.nn.Module):\n"
                                "  def forward(self, x):\n    return F.softmax(x, dim=-1)\n";
  const std::string conv_relu = "class Model(nn.Module):\n  def __init__(self):\n    self.c = nn.Conv2d(3, 8, 3)\n"
                                "  def forward(self, x):\n    return torch.relu(self.c(x))\n";
  const std::string relu = "class Model(torch.nn.Module):\n  def forward(self, x):\n    return torch.relu(x)\n";
  EXPECT_EQ(OperatorSet(softmax), (std::set<std::string>{"softmax"}));  // randn, Module: not operators
  EXPECT_EQ(OperatorSet(conv_relu), (std::set<std::string>{"Conv2d", "relu"}));
  EXPECT_DOUBLE_EQ(OperatorSimilarity(OperatorSet(softmax), OperatorSet(softmax_f)), 1.0);
  EXPECT_DOUBLE_EQ(OperatorSimilarity(OperatorSet(conv_relu), OperatorSet(relu)), 0.5);
  EXPECT_DOUBLE_EQ(OperatorSimilarity(OperatorSet(softmax), OperatorSet(relu)), 0.0);
  EXPECT_DOUBLE_EQ(OperatorSimilarity({}, {}), 0.0);

  auto entry = [](int64_t problem, const std::string& source, int64_t cand, double speedup) {
    store::BankEntry e;
    e.problem.id = problem;
    e.problem.name = "p" + std::to_string(problem);
    e.problem.source = source;
    e.candidate.id = cand;
    e.candidate.source = "// kernel " + std::to_string(cand);
    e.candidate.evaluation = store::EvaluationRow{.status = EvalStatus::kCorrect, .median_ms = 1.0 / speedup,
                                                  .speedup_eager = speedup};
    return e;
  };
  std::vector<store::BankEntry> entries = {entry(1, relu, 10, 3.0), entry(2, softmax_f, 20, 1.5),
                                           entry(3, conv_relu, 30, 9.0), entry(4, softmax, 40, 2.5)};
  // Same operator first (the faster of the two), then nothing below 0.5.
  auto picked = SelectBankKernels(softmax, entries);
  ASSERT_EQ(picked.size(), 2u);
  EXPECT_EQ(picked[0].candidate_id, 40);
  EXPECT_EQ(picked[1].candidate_id, 20);
  picked = SelectBankKernels(relu, entries);
  ASSERT_EQ(picked.size(), 2u);
  EXPECT_EQ(picked[0].candidate_id, 10);  // overlap 1 beats the faster conv+relu (0.5)
  EXPECT_EQ(picked[1].candidate_id, 30);
  std::string text = BankExamplesText(picked);
  EXPECT_THAT(text, HasSubstr("### p1 (bank kernel 10): 3.00x over eager"));
  EXPECT_THAT(text, HasSubstr("// kernel 30"));
  EXPECT_EQ(BankExamplesText({}), "");
}

TEST(LlmPromptTest, IdeasPromptShowsEachLaunchAndItsOccupancy) {
  Evaluation e = MeasuredEvaluation();
  Occupancy reg;
  reg.threads_per_block = 256;
  reg.registers = 64;
  reg.blocks_per_sm = 4;
  ExplainOccupancy(SmLimits{65536, 65536, 233472, 1024, 2048, 32}, &reg);
  e.launch_profiles = BuildLaunchProfiles({"row_stats", "normalize"}, {{0.9}, {0.3}}, {5.4e8, 1.08e9}, 0, 3010, 0,
                                          {reg, std::nullopt});
  IdeasPromptInputs in;
  in.problem = LayerNormProblem();
  in.parent.candidate = SeedCandidate();
  in.parent.evaluation = e;
  in.best = {{7, "Welford in registers, one block per row", e, true},
             {3, "", MeasuredEvaluation(), false}};
  auto p = RenderIdeasPrompt(Library(), in);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const std::string& u = p->user;
  EXPECT_THAT(u, HasSubstr("Each launch on its own (events between launches"));
  EXPECT_THAT(u, HasSubstr("  - launch 0 `row_stats`: 0.9000 ms (75% of the plan), 600 GB/s over the 515.0 MiB of "
                           "buffers it is passed (20% of its floor); occupancy 4 blocks/SM of 256 threads (50% of the "
                           "SM's warps), 64 registers/thread, 0 B shared/block; limited by registers (registers allow "
                           "4, shared memory 228, threads 8, block limit 32)"));
  EXPECT_THAT(u, HasSubstr("  - launch 1 `normalize`: 0.3000 ms (25% of the plan), 3600 GB/s"));
  // The best kernels: the starting point first, with its idea and figures, then the seed.
  EXPECT_THAT(u, HasSubstr("1. (the starting point below) 1.2340 ms, 2.03x eager, 1.46x torch.compile, "
                           "15% of the floor (438 GB/s); launches: `row_stats` 0.9000 ms (4 blocks/SM, "
                           "registers-limited) `normalize` 0.3000 ms\n   idea: Welford in registers, one block per row"));
  EXPECT_THAT(u, HasSubstr("2. 1.2340 ms"));
  EXPECT_THAT(u, HasSubstr("   idea: (the seed kernel)"));
  EXPECT_THAT(u, HasSubstr("   launch `row_stats`: grid (16, 1, 1), block (256, 1, 1)"));
  // The contract in the same prompt: the cluster feature and this GPU's limits.
  EXPECT_THAT(u, HasSubstr("`\"cluster\"`"));
  EXPECT_THAT(u, HasSubstr("- Shared memory per block: 227.0 KiB at most"));
  EXPECT_THAT(u, HasSubstr("- Registers: 65536 per SM"));

  in.best.clear();
  auto none = RenderIdeasPrompt(Library(), in);
  ASSERT_TRUE(none.ok());
  EXPECT_THAT(none->user, HasSubstr("(no correct kernel yet)"));
}

TEST(LlmPromptTest, RepairPromptNamesTheFirstWrongElementByItsPosition) {
  RepairPromptInputs rp;
  rp.problem = LayerNormProblem();
  rp.candidate = SeedCandidate();
  rp.evaluation.status = EvalStatus::kIncorrect;
  rp.evaluation.message = "output 'out', input set 2: 3 of 67108864 elements wrong; first at index 197885: got 1, "
                          "expected 0.5";
  OutputError oe;
  oe.name = "out";
  oe.mismatches = 3;
  // [16, 64, 256, 256]: 197885 = 3 * 65536 + 4 * 256 + 253.
  oe.first_mismatch = 197885;
  oe.input_set = 2;
  rp.evaluation.errors = {oe};
  auto r = RenderRepairPrompt(Library(), rp);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(r->user, HasSubstr("the first wrong element is out[0, 3, 4, 253] of shape [16, 64, 256, 256], in input "
                                 "set 2"));
  EXPECT_THAT(r->user, HasSubstr("got 1, expected 0.5"));
  EXPECT_EQ(IndexInShape("y", 5, {2, 3}), "y[1, 2]");
  EXPECT_EQ(IndexInShape("y", 0, {}), "y[]");
}

TEST(LlmPromptTest, EveryTemplateRendersWithAFullVariableSet) {
  PromptLibrary lib = Library();
  TemplateVars v;
  for (const char* name :
       {"problem_name", "problem_source", "signature_table", "gpu_facts", "parent_description", "parent_code",
        "parent_measurements", "num_ideas", "idea", "candidate_source", "candidate_plan", "failure_status",
        "bank_examples", "failure_details", "launch_limits", "best_kernels", "judging"})
    v.Set(name, std::string("<") + name + ">");
  v.SetList("tried_ideas", {{{"idea", "<i>"}, {"outcome", "<o>"}}});
  v.SetList("hopper", {{{"hopper_target", "<hopper_target>"}}});
  // prompts/agent.md's sections (search/agent.h AgentTemplateVars).
  for (const char* name : {"max_tool_calls", "max_turns", "max_tokens"}) v.Set(name, std::string("<") + name + ">");
  v.SetList("profile_offered", {{}});
  v.SetList("token_limit", {{}});
  std::vector<std::string> names = lib.Names();
  for (const char* expected : {"system", "contract", "ideas", "implement", "repair", "agent.instructions"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  for (const auto& name : names) {
    auto out = lib.Render(name, v);
    ASSERT_TRUE(out.ok()) << name << ": " << out.status().ToString();
    EXPECT_EQ(out->find("{{"), std::string::npos) << name;
    EXPECT_FALSE(out->empty()) << name;
  }
}

TEST(LlmPromptTest, RenderingFailsLoudly) {
  PromptLibrary lib = Library();
  TemplateVars v;
  v.Set("problem_name", "x");
  auto missing = lib.Render("ideas", v);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("missing variable"), std::string::npos) << missing.status().message();
  auto unknown = lib.Render("no_such_template", v);
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), Code::kNotFound);

  EXPECT_FALSE(RenderTemplateText("{{#xs}}open", TemplateVars().SetList("xs", {{}})).ok());
  EXPECT_FALSE(RenderTemplateText("{{name}", TemplateVars().Set("name", "a")).ok());
  EXPECT_FALSE(RenderTemplateText("{{/xs}}", TemplateVars()).ok());
  EXPECT_FALSE(RenderTemplateText("{{xs}}", TemplateVars().SetList("xs", {})).ok());   // list as string
  EXPECT_FALSE(RenderTemplateText("{{#s}}{{/s}}", TemplateVars().Set("s", "a")).ok());  // string as list
  EXPECT_FALSE(RenderTemplateText("{{> contract}}", TemplateVars()).ok());               // no library
}

TEST(LlmPromptTest, SectionsRepeatAndFallBack) {
  TemplateVars v;
  v.Set("who", "A");
  v.SetList("xs", {{{"n", "1"}}, {{"n", "2"}}});
  v.SetList("none", {});
  auto out = RenderTemplateText("{{#xs}}[{{n}}{{who}}]{{/xs}}{{^xs}}empty{{/xs}}{{#none}}{{gone}}{{/none}}{{^none}}E{{/none}}", v);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "[1A][2A]E");
}

TEST(LlmParseTest, IdeasFromFencedListWithProse) {
  auto ideas = ParseIdeas(
      "Here are my ideas:\n```json\n[\n  {\"title\": \"Vectorize\", \"idea\": \"Use float4 loads.\"},\n"
      "  \"Fuse the two passes\"\n]\n```\nLet me know!");
  ASSERT_TRUE(ideas.ok()) << ideas.status().ToString();
  ASSERT_EQ(ideas->size(), 2u);
  EXPECT_EQ((*ideas)[0].title, "Vectorize");
  EXPECT_EQ((*ideas)[0].description, "Use float4 loads.");
  EXPECT_EQ((*ideas)[0].Text(), "Vectorize: Use float4 loads.");
  EXPECT_EQ((*ideas)[1].Text(), "Fuse the two passes");
}

TEST(LlmParseTest, IdeasFromWrappedObjectAndBareList) {
  auto wrapped = ParseIdeas(R"(Sure. {"ideas": [{"name": "Tiling", "description": "32x32 tiles in shared memory"}]})");
  ASSERT_TRUE(wrapped.ok()) << wrapped.status().ToString();
  ASSERT_EQ(wrapped->size(), 1u);
  EXPECT_EQ((*wrapped)[0].Text(), "Tiling: 32x32 tiles in shared memory");

  auto bare = ParseIdeas("My answer: [\"a\", \"b\", \"c\"] -- done");
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->size(), 3u);

  auto only_title = ParseIdeas(R"([{"title": "Use warp shuffles"}])");
  ASSERT_TRUE(only_title.ok());
  EXPECT_EQ((*only_title)[0].description, "Use warp shuffles");
}

TEST(LlmParseTest, NoIdeasIsAnError) {
  auto none = ParseIdeas("I think you should use shared memory.");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(ParseIdeas("```json\n[]\n```").ok());
  EXPECT_FALSE(ParseIdeas("```json\n{\"ideas\": 3}\n```").ok());
}

TEST(LlmParseTest, CandidateReply) {
  std::string reply =
      "Here is the kernel.\n```cuda\nextern \"C\" __global__ void scale(const float* x, float* out, long long n) {\n"
      "  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i < n) out[i] = 2.f * x[i];\n}\n```\n"
      "```json\n{\"launches\": [{\"kernel\": \"scale\", \"grid\": [\"cdiv(x.numel, 256)\"], \"block\": [256], "
      "\"args\": [\"x\", \"out\", \"x.numel\"]}]}\n```\n";
  ParsedCandidate c = ParseCandidateResponse(reply);
  ASSERT_TRUE(c.ok()) << c.parse_error;
  EXPECT_NE(c.candidate.source.find("void scale"), std::string::npos);
  EXPECT_NE(c.candidate.plan_json.find("\"launches\""), std::string::npos);
  EXPECT_EQ(c.raw, reply);

  ParsedCandidate no_plan = ParseCandidateResponse("```cuda\nextern \"C\" __global__ void k() {}\n```");
  EXPECT_FALSE(no_plan.ok());
  EXPECT_FALSE(no_plan.parse_error.empty());
}

}  // namespace
}  // namespace ks

namespace ks {
namespace {

// The compute floor and the hardware counters reach both prompts as a short
// digest next to the roofline fraction, within a size budget.
TEST(LlmPromptTest, MeasurementsShowTheFloorBasisAndTheCounterDigest) {
  ParentKernel parent;
  parent.candidate = SeedCandidate();
  Evaluation e = MeasuredEvaluation();
  Roofline& r = *e.roofline;
  r.flops = 1.374e11;
  r.compute_class = "fp32";
  r.bound = "compute";
  r.peak_tflops = 165;
  r.compute_floor_ms = 0.833;
  r.memory_floor_ms = 0.0671;
  r.floor_ms = 0.833;
  r.fp32_path = "3xTF32";
  CounterReport c;
  for (int i = 0; i < 12; ++i) {  // a plan of many launches: the budget holds
    LaunchCounters l;
    l.index = i;
    l.kernel = "row_stats";
    l.duration_ms = 0.1;
    l.dram_pct = 61;
    l.dram_gbps = 1830;
    l.l2_hit_pct = 12;
    l.tensor_pct = 0;
    l.stalls = {{"long_scoreboard", 0.48}, {"barrier", 0.21}};
    c.launches.push_back(l);
  }
  e.counters = c;
  parent.evaluation = e;
  std::string text = MeasurementsText(parent);
  EXPECT_THAT(text, HasSubstr("compute-bound: 137 GFLOP of fp32 matrix work at 165 TFLOP/s via 3xTF32"));
  EXPECT_THAT(text, HasSubstr("Hardware counters (Nsight Compute"));
  EXPECT_THAT(text, HasSubstr("DRAM 61% of peak (1830 GB/s)"));
  EXPECT_THAT(text, HasSubstr("L2 hit 12%"));
  EXPECT_THAT(text, HasSubstr("stalls: long scoreboard 48%, barrier 21%"));
  EXPECT_THAT(text, HasSubstr("tensor pipe 0%"));
  EXPECT_THAT(text, HasSubstr("more launches (not shown)"));
  // The block, from its heading to the next measurement: within its budget.
  size_t at = text.find("- Hardware counters"), end = text.find("\n- ", at + 1);
  ASSERT_NE(end, std::string::npos);
  EXPECT_LT(end - at, 1300u) << "the digest must stay short";
  // No counters: the model is told nothing (the user gets the reason).
  e.counters = CounterReport{{}, "no Nsight Compute (ncu) on PATH", 0};
  parent.evaluation = e;
  EXPECT_EQ(MeasurementsText(parent).find("Hardware counters"), std::string::npos);
}

}  // namespace
}  // namespace ks
