// Compiling candidate source with NVRTC, out of process.
//
// Candidate source is untrusted: NVRTC runs in a `ks-worker compile` child with a
// wall-clock limit and memory/file limits, so a compiler hang or blow-up ends
// only that child. The trusted side pre-checks the source (size, includes) and
// parses what comes back (PTX entry points, globals, ptxas resource lines).
// Thread-safe: each call starts its own child, so compiles run in parallel.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/subprocess.h"
#include "evaluator/plan/kernel_info.h"

namespace ks {

// The target a candidate is compiled for on a GPU of architecture `arch`
// (sm_XY): the arch-specific one (sm_90a, sm_100a, ...) from 9.0 on, since only
// it has wgmma, setmaxnreg and the tcgen05 family, which every fast Hopper and
// Blackwell matrix kernel uses. Its cubin loads only on that exact family (an
// sm_90a cubin runs on 9.0 and on nothing newer), which is why export refuses
// another GPU. An arch-specific target, or an older arch, comes back unchanged.
std::string ArchSpecificTarget(const std::string& arch);
// Whether `target` names an arch-specific target (sm_90a).
bool IsArchSpecific(const std::string& target);
// The GPU architecture a target runs on: "sm_90a" -> "sm_90".
std::string TargetArch(const std::string& target);

struct CompileOptions {
  std::string arch = "sm_90a";     // the NVRTC target: sm_XY, or sm_XYa (ArchSpecificTarget)
  double timeout_s = 60;           // wall clock for the whole compile
  size_t max_source_bytes = 1u << 20;
  std::string worker_path;         // ks-worker; "" = next to this executable or the build tree
  std::string cuda_home;           // "" = $KS_CUDA_HOME, $CUDA_HOME, /usr/local/cuda, the build's toolkit
};

struct CompileResult {
  bool ok = false;
  std::string message;   // why it failed, one line (empty when ok)
  std::string log;       // NVRTC + ptxas log
  std::string cubin;     // binary, when ok
  std::string ptx;       // PTX text, when ok
  std::vector<KernelInfo> kernels;
  std::vector<GlobalVar> globals;
  double seconds = 0;
};

// Fails (Status) only when the compiler itself cannot run (no ks-worker, no
// CUDA headers). A candidate that does not compile is a CompileResult with ok=false.
StatusOr<CompileResult> CompileCandidate(const std::string& source, const CompileOptions& opts);

// Long-lived `ks-worker compile-server` processes, so each compile pays for
// NVRTC's work and not for loading it (process start + libnvrtc: ~300 ms). A
// process is lent to one compile at a time; one that overran its time limit or
// died is killed, not returned. Thread-safe; lives for the whole process.
class CompileServerPool {
 public:
  static CompileServerPool& Get();
  StatusOr<ChildProcess> Acquire(const std::string& worker);
  void Release(const std::string& worker, ChildProcess process);

 private:
  struct Entry {
    std::string worker;
    ChildProcess process;
  };
  static constexpr size_t kMaxIdle = 16;
  std::mutex mu_;
  std::vector<Entry> idle_;
};

// Pieces, exposed for tests and for the worker.

// Refuses #include of anything outside the CUDA include tree, computed includes
// (#include MACRO) and paths with "..": the compiler must not read host files.
Status CheckIncludes(const std::string& source, const std::vector<std::string>& include_dirs);
// Entry points and their parameter layouts, and module-scope .global variables.
StatusOr<std::vector<KernelInfo>> ParsePtxEntries(const std::string& ptx);
std::vector<GlobalVar> ParsePtxGlobals(const std::string& ptx);
// Functions the PTX declares .extern (device runtime calls: malloc, free, vprintf).
std::vector<std::string> ParsePtxExternFunctions(const std::string& ptx);
// The device-heap function the PTX calls (malloc, free, ...), if any.
std::optional<std::string> DeviceHeapUse(const std::string& ptx);
// Whether the PTX holds atomic or reduction instructions: such a kernel may
// legitimately give bitwise different outputs from run to run.
bool PtxUsesAtomics(const std::string& ptx);
// Fills registers / shared / stack / spill figures from `ptxas -v` lines in the log.
void ParsePtxasResources(const std::string& log, std::vector<KernelInfo>* kernels);

// The CUDA root whose include/ NVRTC should see; FailedPrecondition if none has cuda_runtime.h... headers.
StatusOr<std::string> FindCudaHome(const std::string& explicit_home);
std::vector<std::string> CudaIncludeDirs(const std::string& cuda_home);
// Path of the ks-worker executable.
StatusOr<std::string> FindWorker(const std::string& explicit_path);

// What every candidate is compiled with, besides -arch=<arch> and -I for each
// CudaIncludeDirs(): the header NVRTC pre-includes (named kNvrtcPreludeName:
// INFINITY, FLT_MAX and the like, which NVRTC does not predefine) and the
// options. `export` builds its module with the same two.
constexpr const char* kNvrtcPreludeName = "ks_prelude.h";
const char* NvrtcPrelude();
const std::vector<std::string>& NvrtcBaseOptions();

// Runs NVRTC in this process (used inside ks-worker). Links libnvrtc.
CompileResult CompileWithNvrtc(const std::string& source, const std::string& arch, const std::string& cuda_home);

// Whether a module image (a cubin) holds memory of its own that a kernel
// could write and a later run read: any allocated ELF section but code
// (.text.*), launch parameters (.nv.constant0.*, written by every launch) and
// the shared-memory reservation (.nv.shared.*). __device__ (.nv.global),
// __managed__, __constant__ (.nv.constant3) and .global variables declared
// in inline PTX all make one. An image that cannot be read counts as having
// some. ks-worker loads such a module afresh before every run.
bool ModuleHasData(const std::string& image);

}  // namespace ks
