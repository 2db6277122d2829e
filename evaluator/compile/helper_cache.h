// The evaluator's own helper kernels (trusted source, gpu_evaluator_internal.h)
// compiled once and kept: in this process for every evaluator (one per GPU)
// and, where a directory is given, on disk for the next command (issue 33:
// the compile was a fixed cost of every command's setup). Candidates are
// never cached here: a cubin comes back only for the key it was stored under,
// and the key is made by the trusted caller from the trusted source.
//
// A cached cubin is used only if the caller accepts it (Module::Load on the
// evaluator's GPU); one refused, unreadable or corrupt is compiled again and
// overwritten. The cache never fails a setup: a directory that cannot be
// read or written only costs the compile. Thread-safe; the in-memory entries
// live for the whole process.
#pragma once

#include <functional>
#include <string>

#include "common/status.h"

namespace ks {

// Where a helper cubin came from.
enum class HelperCubinOrigin { kCompiled, kMemory, kDisk };
const char* HelperCubinOriginName(HelperCubinOrigin origin);  // "compile", "memory", "disk"

// The cache key (hex): a hash of the source, the NVRTC target and
// `compiler_id` (what else decides the cubin: HelperCompilerId).
std::string HelperCacheKey(const std::string& source, const std::string& arch, const std::string& compiler_id);
// What decides a cubin besides source and target: the CUDA version the
// compiler was built against, NVRTC's options and prelude, the CUDA headers'
// root and the ks-worker executable that links NVRTC (path, size, mtime).
std::string HelperCompilerId(const std::string& worker_path, const std::string& cuda_home);

// The file a key's cubin is kept in under `dir`.
std::string HelperCacheFile(const std::string& dir, const std::string& key);
// The cubin stored under `key` in `dir`: NotFound where there is none,
// Internal where the file is not a whole entry of that key (a torn or
// corrupt write, another key's content).
StatusOr<std::string> ReadHelperCubin(const std::string& dir, const std::string& key);
// Stores it atomically (a temporary file renamed into place); `dir` is made if missing.
Status WriteHelperCubin(const std::string& dir, const std::string& key, const std::string& cubin);

struct HelperCubin {
  std::string cubin;
  HelperCubinOrigin origin = HelperCubinOrigin::kCompiled;
};

// The cubin for `key`: from this process's memory, else from `dir` ("" = no
// disk cache), else `compile`d. `accept` is called on each one found until
// one passes (a cached one it refuses is compiled afresh); a compiled one it
// refuses fails the call. Errors come only from `compile` and `accept`.
using HelperCompileFn = std::function<StatusOr<std::string>()>;
using HelperAcceptFn = std::function<Status(const std::string& cubin)>;
StatusOr<HelperCubin> GetHelperCubin(const std::string& key, const std::string& dir, const HelperCompileFn& compile,
                                     const HelperAcceptFn& accept);
// Forgets the in-memory entries (tests: the next call reads the disk).
void ClearHelperCubinMemory();

}  // namespace ks
