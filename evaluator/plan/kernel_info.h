// What the compiler tells us about each entry point of a compiled candidate:
// parameter layout (from the PTX .entry declaration) and resource usage (from
// ptxas). The launch plan is checked against this.
#pragma once

#include <string>
#include <vector>

#include "evaluator/evaluation.h"

namespace ks {

enum class ParamKind {
  kB64,    // .u64/.s64/.b64: a pointer or a 64-bit integer
  kB32,    // .u32/.s32/.b32: a 32-bit integer
  kF32,
  kF64,
  kB16,
  kB8,
  kBytes,  // .b8 name[N]: a struct passed by value (e.g. a CUtensorMap)
};

struct ParamInfo {
  ParamKind kind = ParamKind::kB64;
  int size = 8;
  int align = 8;
};

struct KernelInfo {
  std::string name;
  std::vector<ParamInfo> params;
  KernelResources resources;
};

// A module-scope device variable (`__device__ int counter;`), which persists
// across launches; the worker restores every one before each run.
struct GlobalVar {
  std::string name;
  int64_t size = 0;
};

const char* ParamKindName(ParamKind k);

}  // namespace ks
