// Shared by the gpu-labelled tests: one GpuEvaluator per problem fixture for the
// whole test binary (its reference is computed once); the skip macros and the
// source tree's paths come from tests/testing/.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "evaluator/cuda_driver.h"
#include "evaluator/gpu_evaluator.h"
#include "evaluator/problem.h"
#include "tests/testing/paths.h"
#include "tests/testing/skip.h"

namespace ks::testing {

inline std::string GpuFixture(const std::string& name) {
  return SourcePath("tests/evaluator/gpu_fixtures/" + name);
}

// A problem the CPU tests also use (tests/evaluator/fixtures/), one copy for both.
inline std::string CpuFixture(const std::string& name) {
  return SourcePath("tests/evaluator/fixtures/" + name);
}

// The evaluator for a fixture problem, created on first use. Asserts on failure.
// `precision`: the contract it judges under (evaluator/judge/judge.h).
inline GpuEvaluator* EvaluatorFor(const std::string& problem, int sets = 3, double run_timeout_s = 3,
                                  double compile_timeout_s = 60, const std::string& precision = "highest") {
  static std::map<std::string, std::unique_ptr<GpuEvaluator>> cache;
  const std::string key = problem + "|" + precision;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second.get();
  ReferenceOptions ro;
  ro.sets = sets;
  ro.device = "cuda";
  ro.time = true;
  ro.precision = precision;  // the baselines timed under the contract (high, medium)
  auto ref = PrepareReference(problem, ro);
  if (!ref.ok()) {
    ADD_FAILURE() << "reference for " << problem << ": " << ref.status().ToString();
    return nullptr;
  }
  GpuEvaluatorOptions go;
  go.run_timeout_s = run_timeout_s;
  go.target_timed_ms = 300;
  go.compile_timeout_s = compile_timeout_s;
  go.precision = precision;
  auto ev = GpuEvaluator::Create(*ref, go);
  if (!ev.ok()) {
    ADD_FAILURE() << "evaluator for " << problem << ": " << ev.status().ToString();
    return nullptr;
  }
  GpuEvaluator* raw = ev->get();
  cache[key] = std::move(*ev);
  return raw;
}

inline Evaluation EvalOne(GpuEvaluator* ev, const std::string& source, const std::string& plan) {
  auto r = ev->EvaluateBatch({Candidate{source, plan}});
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok() || r->empty()) return Evaluation{};
  return (*r)[0];
}

}  // namespace ks::testing
