// The three prompts of a search round (prompts/ideas.md, implement.md,
// repair.md, with system.md as the system prompt), built from typed inputs so
// that the search cannot forget a fact the model needs. Also the pieces they
// are made of, as plain text. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/evaluation.h"
#include "evaluator/signature.h"
#include "llm/llm_client.h"
#include "search/prompt_template.h"

namespace ks {

// What the model should know about the target GPU. Peaks are the measured ones
// where the evaluator measured them.
struct GpuFacts {
  std::string name;                        // "NVIDIA H100 80GB HBM3"
  std::string compute_capability;          // "9.0"
  int sm_count = 0;
  int64_t shared_bytes_per_block = 0;      // opt-in maximum per block
  int64_t shared_bytes_per_sm = 0;         // 0: unknown
  int64_t l2_bytes = 0;
  int registers_per_sm = 0;                // 0: unknown
  double memory_bandwidth_gbps = 0;        // measured
  // Dense matmul peaks measured with cuBLAS (MeasureDevicePeaks); 0: unknown.
  double fp32_tflops = 0;                  // CUDA cores, TF32 off
  double tf32_tflops = 0;                  // tensor cores
  double fp16_tensor_tflops = 0;           // tensor cores, the larger of fp16 and bf16
  // Occupancy limits of one SM (0: unknown).
  int max_threads_per_sm = 0;
  int max_blocks_per_sm = 0;
  int max_registers_per_thread = 0;        // 255 on every GPU of compute capability 3.5 and later
  // Where the figures come from: "" = measured on the device (the evaluator);
  // "datasheet" = the vendor's figures (search/gpu_datasheet.h), used by the
  // model side of a split search until its GPU side has measured the GPU.
  std::string source;
  bool from_datasheet() const { return source == "datasheet"; }
};

// The kernel a round starts from: a correct candidate with its evaluation, or
// the PyTorch reference itself (candidate and evaluation absent).
struct ParentKernel {
  std::optional<Candidate> candidate;
  std::optional<Evaluation> evaluation;
  // Reference timings, shown when the parent is the reference itself.
  std::optional<TimingStats> eager;
  std::optional<TimingStats> compiled;
};

// One of the best correct kernels of the search so far, as the ideas prompt
// lists them so that a model can combine what worked.
struct TopKernel {
  int64_t id = 0;            // for the caller; prompts do not show it
  std::string idea;          // the idea it implements ("" for the seed)
  Evaluation evaluation;     // its figures
  bool is_parent = false;    // the starting point of this prompt
};

struct TriedIdea {
  std::string idea;
  std::string outcome;  // "correct, 1.9x over the parent", "incorrect: max abs 3e-1", ...
};

struct ProblemContext {
  std::string name;          // the signature's name
  std::string source;        // the problem .py as text
  Signature signature;
  GpuFacts gpu;
  // What a candidate is judged against under the search's precision
  // contract (evaluator/judge/judge.h DescribeContract); "" = highest's.
  std::string judging;
};

// A kernel from the bank (the best correct kernel of another problem in the
// store), shown as an example with what it measured.
struct BankKernel {
  int64_t candidate_id = 0;
  std::string problem_name;
  std::string source;
  std::string plan_json;
  std::optional<double> median_ms;
  std::optional<double> speedup_eager;
  std::optional<double> speedup_compile;
};

struct IdeasPromptInputs {
  ProblemContext problem;
  ParentKernel parent;
  std::vector<TriedIdea> tried;  // in this lineage, from this parent
  std::vector<TopKernel> best;   // the best correct kernels of the search, fastest first
  int num_ideas = 4;
  std::vector<BankKernel> bank;  // examples from other problems; may be empty
};

struct ImplementPromptInputs {
  ProblemContext problem;
  ParentKernel parent;
  std::string idea;
  std::vector<BankKernel> bank;  // shown only when there is no parent kernel (round 0)
};

struct RepairPromptInputs {
  ProblemContext problem;
  std::string idea;
  Candidate candidate;     // the one that failed
  Evaluation evaluation;   // why it failed
};

struct RenderedPrompt {
  std::string system;
  std::string user;
  // A request with role, system and prompt set (temperature and max tokens at
  // their defaults; the backend's config may override them).
  LlmRequest ToRequest(const std::string& role) const;
};

StatusOr<RenderedPrompt> RenderIdeasPrompt(const PromptLibrary& lib, const IdeasPromptInputs& in);
StatusOr<RenderedPrompt> RenderImplementPrompt(const PromptLibrary& lib, const ImplementPromptInputs& in);
StatusOr<RenderedPrompt> RenderRepairPrompt(const PromptLibrary& lib, const RepairPromptInputs& in);

// The pieces, as the templates get them.
std::string SignatureTable(const Signature& sig);     // a markdown table
std::string GpuFactsText(const GpuFacts& gpu);         // a bullet list; unknown figures say "unknown"
std::string BankExamplesText(const std::vector<BankKernel>& bank);  // "" when empty
std::string MeasurementsText(const ParentKernel& parent);
// Compile log, plan error or mismatch figures; with the signature, the first
// mismatch is also named by its position in the output's shape (out[3, 1021]).
std::string FailureDetails(const Evaluation& e, const Signature* sig = nullptr);
// The contract's device section: shared memory per block and the register
// budget per thread at each block size ("unknown" where the facts are missing).
std::string LaunchLimitsText(const GpuFacts& gpu);
// The contract's Hopper section (TMA, wgmma, the arch-specific target): one
// record {hopper_target: "sm_90a"} for a GPU of compute capability 9.0 or
// later, none otherwise (or when unknown), so the section is not shown.
std::vector<TemplateRecord> HopperRecords(const GpuFacts& gpu);
// "out[3, 1021]": a flat index of a contiguous tensor by its position.
std::string IndexInShape(const std::string& name, int64_t flat, const std::vector<int64_t>& shape);
// The figures of one evaluation in one line: time, speedups, fraction of the floor.
std::string FiguresLine(const Evaluation& e);
std::string TopKernelsText(const std::vector<TopKernel>& best);

}  // namespace ks
