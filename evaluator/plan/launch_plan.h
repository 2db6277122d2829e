// Launch plans (DESIGN.md, contract 2): parsing the JSON, evaluating the integer
// expressions in it, and resolving it against the problem signature and the
// compiled kernels into concrete launches. Every failure names the plan entry.
// Pure functions; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "evaluator/evaluation.h"
#include "evaluator/plan/kernel_info.h"
#include "evaluator/plan/tensor_map.h"
#include "evaluator/signature.h"

namespace ks {

// Every key the plan parser accepts, at each level. The parser rejects any other
// key, and prompts/contract.md must document each of these (contract_test checks
// it), so a plan feature cannot exist without a model being told about it.
inline constexpr std::array<std::string_view, 3> kPlanKeys = {"launches", "scratch", "tensor_maps"};
inline constexpr std::array<std::string_view, 6> kLaunchKeys = {"kernel", "grid", "block",
                                                                "shared_bytes", "args", "cluster"};
inline constexpr std::array<std::string_view, 2> kScratchKeys = {"name", "bytes"};

// Limits on a plan's size and shape (issue 31: no plan can crash the trusted
// process). Text size and nesting are checked on the raw text by a flat scan,
// the counts on the parsed top level, before anything copies or walks the JSON
// recursively (nlohmann::json copies and dumps recurse). Real plans have a few
// launches and nest 4 deep ({"launches": [{"args": [...]}]}). The same numbers
// are in export/ks_launch_plan.py and one line of prompts/contract.md.
inline constexpr size_t kMaxPlanBytes = 64 << 10;
inline constexpr int kMaxPlanDepth = 8;  // levels of [ ] and { }
inline constexpr int kMaxLaunches = 64;
inline constexpr int kMaxArgsPerLaunch = 128;
inline constexpr int kMaxScratchBuffers = 32;
inline constexpr int kMaxTensorMaps = 32;
inline constexpr size_t kMaxExprChars = 4096;
inline constexpr int kMaxExprDepth = 32;  // nested parentheses, calls, unary signs and shape indices

// Evaluates an integer expression: integers, + - * / %, parentheses, unary minus,
// cdiv(a, b), min(a, b, ...), max(a, b, ...), <tensor>.shape[i] (negative i counts
// from the end), <tensor>.numel, integer scalar inputs by name. Extra names (e.g.
// nothing today) may be given in `extra`. Every arithmetic edge is an error, never
// undefined behaviour: 64-bit overflow of any operator (INT64_MIN / -1 and
// INT64_MIN % -1 included), division by zero, literals beyond int64, more than
// kMaxExprChars characters or kMaxExprDepth levels of nesting.
StatusOr<int64_t> EvalIntExpr(const std::string& expr, const Signature& sig);

// The guard every entry point runs before plan text becomes nlohmann::json:
// at most kMaxPlanBytes and kMaxPlanDepth levels of [ { outside strings, by a
// flat scan of the text. InvalidArgument names the limit.
Status CheckPlanText(std::string_view plan_json);

// The same limits on a JSON value already parsed (a tool call's "plan" object),
// walked without recursion: at most kMaxPlanDepth levels and kMaxPlanBytes nodes.
Status CheckPlanValue(const nlohmann::json& plan);

// CheckPlanText, then the parse, then the counts (kMaxLaunches, kMaxArgsPerLaunch,
// kMaxScratchBuffers, kMaxTensorMaps). InvalidArgument for text that is not
// JSON or breaks a limit; the value is not checked to be a plan otherwise.
StatusOr<nlohmann::json> ParsePlanJson(const std::string& plan_json);

struct ArgValue {
  enum class Kind { kTensor, kScratch, kInt32, kInt64, kFloat32, kFloat64, kTensorMap } kind = Kind::kInt32;
  std::string name;  // tensor, scratch or tensor map name
  int64_t i = 0;
  double f = 0;
};

struct PlannedLaunch {
  std::string kernel;
  std::array<int64_t, 3> grid{1, 1, 1};
  std::array<int64_t, 3> block{1, 1, 1};
  int64_t shared_bytes = 0;
  std::optional<std::array<int64_t, 3>> cluster;  // Hopper thread-block clusters
  std::vector<ArgValue> args;
};

struct ScratchBuffer {
  std::string name;
  int64_t bytes = 0;
};

struct ResolvedPlan {
  std::vector<PlannedLaunch> launches;
  std::vector<ScratchBuffer> scratch;
  std::vector<TensorMapSpec> tensor_maps;  // Hopper TMA descriptors (tensor_map.h)
  std::vector<ResolvedLaunch> Summary() const;
};

struct PlanLimits {
  int64_t max_shared_bytes_per_block = 232448;  // sm_90 opt-in limit; the device's when known
  int64_t max_scratch_bytes = int64_t{16} << 30;
  int max_launches = kMaxLaunches;
  int max_cluster_size = 16;
};

// Parses (ParsePlanJson), evaluates and checks a plan. InvalidArgument (-> status invalid_plan)
// with a message like "launches[1] (normalize): args[3] 'ln.wieght': unknown name".
StatusOr<ResolvedPlan> ResolvePlan(const std::string& plan_json, const Signature& sig,
                                   const std::vector<KernelInfo>& kernels, const PlanLimits& limits);

}  // namespace ks
