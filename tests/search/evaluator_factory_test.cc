// The one evaluator builder (search/evaluator_factory.h) on the CPU: the
// options `eval` and `search` hand it become the same reference and GPU
// evaluator options (eval's flags at their defaults are a search's defaults;
// eval's other flags reach the evaluator), an agent's practice options, and
// the scripted evaluator made as both commands make it.
#include "search/evaluator_factory.h"

#include <gtest/gtest.h>

#include "search/evaluator_pool.h"

namespace ks {
namespace {

// What `kernelsearch search --precision P` hands the builder (cli/cmd_search.cc
// SearchEvaluatorOptions; SearchSetup::PrepareEvaluator sets the contract).
EvaluatorOptions SearchOptions(Contract precision) {
  EvaluatorOptions eo{.spec = "gpu", .python = "py", .device = 0, .gpus = ""};
  eo.precision = precision;
  return eo;
}

// What `kernelsearch eval --precision P` hands it with its other flags at
// their defaults (cli/cmd_eval.cc EvalEvaluatorOptions: --sets 3,
// --run-timeout 0, --timing adaptive, no --keep-privileges).
EvaluatorOptions EvalOptions(Contract precision) {
  EvaluatorOptions eo;
  eo.spec = "gpu";
  eo.python = "py";
  eo.precision = precision;
  eo.sets = 3;
  eo.drop_privileges = true;
  eo.run_timeout_s = 0;
  eo.timing = TimingMode::kAdaptive;
  eo.describe_device = false;
  return eo;
}

void ExpectSameGpuOptions(const GpuEvaluatorOptions& a, const GpuEvaluatorOptions& b) {
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.python, b.python);
  EXPECT_EQ(a.compile_threads, b.compile_threads);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.reveal_reference_values, b.reveal_reference_values);
  EXPECT_EQ(a.drop_privileges, b.drop_privileges);
  EXPECT_EQ(a.run_timeout_s, b.run_timeout_s);
  EXPECT_EQ(a.timing, b.timing);
}

void ExpectSameReferenceOptions(const ReferenceOptions& a, const ReferenceOptions& b) {
  EXPECT_EQ(a.bridge.python, b.bridge.python);
  EXPECT_EQ(a.sets, b.sets);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.device, b.device);
  EXPECT_EQ(a.time, b.time);
  EXPECT_EQ(a.precision, b.precision);
  EXPECT_EQ(a.cache_dir, b.cache_dir);
  EXPECT_EQ(a.cache_cap, b.cache_cap);
  EXPECT_EQ(a.practice_sets, b.practice_sets);
  EXPECT_EQ(a.practice_seed, b.practice_seed);
}

TEST(EvaluatorBuilder, EvalAndSearchGiveTheSameEvaluatorOptions) {
  for (Contract c : {Contract::kHighest, Contract::kHigh, Contract::kMedium, Contract::kKernelBench}) {
    SCOPED_TRACE(ContractName(c));
    const EvaluatorOptions search = SearchOptions(c), eval = EvalOptions(c);
    ExpectSameReferenceOptions(ReferenceOptionsFor(search), ReferenceOptionsFor(eval));
    for (size_t gpus : {1u, 2u}) ExpectSameGpuOptions(GpuEvaluatorOptionsFor(search, 1, gpus), GpuEvaluatorOptionsFor(eval, 1, gpus));
    // The contract travels as its canonical name to the bridge and the GPU evaluator.
    EXPECT_EQ(ReferenceOptionsFor(search).precision, ContractName(c));
    EXPECT_EQ(GpuEvaluatorOptionsFor(search, 0, 1).precision, ContractName(c));
  }
  // The defaults are the evaluator's own: a search judges as eval does without flags.
  const ReferenceOptions ro = ReferenceOptionsFor(SearchOptions(Contract::kHighest));
  const ReferenceOptions plain;
  EXPECT_EQ(ro.sets, plain.sets);
  EXPECT_EQ(ro.seed, plain.seed);
  EXPECT_EQ(ro.precision, plain.precision);
  EXPECT_EQ(ro.device, "cuda");
  EXPECT_TRUE(ro.time);
  EXPECT_EQ(ro.practice_sets, 0);
  const GpuEvaluatorOptions go = GpuEvaluatorOptionsFor(SearchOptions(Contract::kHighest), 3, 2);
  const GpuEvaluatorOptions defaults;
  EXPECT_EQ(go.device, 3);
  EXPECT_EQ(go.python, "py");
  EXPECT_EQ(go.compile_threads, CompileThreadsPerGpu(2));
  EXPECT_EQ(go.drop_privileges, defaults.drop_privileges);
  EXPECT_EQ(go.run_timeout_s, defaults.run_timeout_s);
  EXPECT_EQ(go.timing, defaults.timing);
  EXPECT_EQ(go.reveal_reference_values, defaults.reveal_reference_values);
  EXPECT_EQ(go.precision, defaults.precision);
}

TEST(EvaluatorBuilder, EvalFlagsReachTheEvaluator) {
  EvaluatorOptions eo = EvalOptions(Contract::kHigh);
  eo.sets = 5;
  eo.cache_dir = "/tmp/cache";
  eo.cache_cap = 1 << 20;
  eo.drop_privileges = false;  // --keep-privileges
  eo.run_timeout_s = 7;
  eo.timing = TimingMode::kFull;
  const ReferenceOptions ro = ReferenceOptionsFor(eo);
  EXPECT_EQ(ro.sets, 5);
  EXPECT_EQ(ro.cache_dir, "/tmp/cache");
  EXPECT_EQ(ro.cache_cap, 1u << 20);
  EXPECT_EQ(ro.precision, "high");
  const GpuEvaluatorOptions go = GpuEvaluatorOptionsFor(eo, 0, 1);
  EXPECT_FALSE(go.drop_privileges);
  EXPECT_EQ(go.run_timeout_s, 7);
  EXPECT_EQ(go.timing, TimingMode::kFull);
  EXPECT_EQ(go.precision, "high");
  EXPECT_EQ(go.compile_threads, CompileThreadsPerGpu(1));
}

TEST(EvaluatorBuilder, PracticeOptions) {
  EvaluatorOptions judging = SearchOptions(Contract::kMedium);
  judging.gpus = "0,1";
  judging.practice_sets = 1;
  const ReferenceOptions with_practice = ReferenceOptionsFor(judging);
  EXPECT_EQ(with_practice.practice_sets, 1);
  EXPECT_EQ(with_practice.practice_seed, kPracticeReferenceSeed);
  EXPECT_EQ(with_practice.seed, 42u);  // the judging sets stay the judging ones
  EvaluatorOptions own = judging;
  own.practice_sets = 0;
  own = PracticeEvaluatorOptions(own);
  EXPECT_EQ(own.gpus, "");
  EXPECT_EQ(ReferenceOptionsFor(own).seed, kPracticeReferenceSeed);
  EXPECT_EQ(ReferenceOptionsFor(own).precision, "medium");
  EXPECT_FALSE(GpuEvaluatorOptionsFor(own, 0, 1).reveal_reference_values);
}

TEST(EvaluatorBuilder, ScriptedEvaluatorAsEvalAndSearchMakeIt) {
  // eval --problems DIR --evaluator fake --gpus 0,1 and search --evaluator fake --gpus 0,1.
  for (EvaluatorOptions eo : {EvalOptions(Contract::kHighest), SearchOptions(Contract::kHighest)}) {
    eo.spec = "fake";
    eo.gpus = "0,1";
    auto made = MakeSearchEvaluator("problem.py", eo);
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    auto* pool = dynamic_cast<EvaluatorPool*>(made->evaluator.get());
    ASSERT_NE(pool, nullptr);
    EXPECT_EQ(pool->size(), 2u);
    EXPECT_TRUE(made->gpu_evaluators.empty());  // no GPU evaluator inside
    EXPECT_TRUE(made->reference.phases.empty());
    EXPECT_EQ(made->practice, nullptr);
    auto r = made->evaluator->EvaluateBatch({{"// k FAKE_MS(0.5)", R"({"launches": []})"}});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 1u);
    EXPECT_TRUE((*r)[0].correct());
  }
  auto bad = MakeSearchEvaluator("problem.py", {.spec = "tpu"});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "unknown evaluator 'tpu' (gpu, fake, fake:FILE)");
}

}  // namespace
}  // namespace ks
