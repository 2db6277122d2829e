// The ways a test skips where this machine lacks what it needs, one message
// each. Each macro returns from the test (GTEST_SKIP), so use it at the top of a
// TEST body or SetUp. The macros call the evaluator (GpuAvailable,
// ResolvePython, FindNcu): a test that uses them links ks_evaluator.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "evaluator/profile/counters.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/problem.h"

// A CUDA device the driver can open.
#define KS_REQUIRE_GPU()                                                     \
  do {                                                                       \
    std::string why_;                                                        \
    if (!::ks::GpuAvailable(&why_)) GTEST_SKIP() << "no GPU here: " << why_; \
  } while (0)

// A python3 with torch (evaluator/problem.h's ResolvePython).
#define KS_REQUIRE_TORCH()                                                                    \
  do {                                                                                        \
    auto py_ = ::ks::ResolvePython();                                                         \
    if (!py_.ok()) GTEST_SKIP() << "no python3 with torch here: " << py_.status().message(); \
  } while (0)

// Nsight Compute's ncu, for the hardware counters.
#define KS_REQUIRE_NCU()                                                                \
  do {                                                                                  \
    if (::ks::FindNcu().empty()) GTEST_SKIP() << "no ncu (Nsight Compute) on this machine"; \
  } while (0)

// Hopper (compute capability 9.0) under the evaluator `ev` (asserted non-null): TMA and wgmma.
#define KS_REQUIRE_HOPPER(ev)                                                                          \
  do {                                                                                                 \
    KS_REQUIRE_GPU();                                                                                  \
    ASSERT_NE(ev, nullptr);                                                                            \
    if ((ev)->device_info().sm_major < 9) GTEST_SKIP() << "TMA and wgmma need compute capability 9.0"; \
  } while (0)
