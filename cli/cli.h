// The kernelsearch command line: each subcommand lives in its own cmd_*.cc and
// registers itself here; the shared helpers are in cli.cc, main() in main.cc. The one place where Status becomes an exit code and a
// message on stderr.
#pragma once

#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "evaluator/judge/judge.h"

namespace ks::cli {

// --precision's help, the same on eval, search, suite and submit.
inline constexpr const char* kPrecisionHelp =
    "the precision contract, under PyTorch's names (evaluator/judge/judge.h): highest (default: exact to fp32, "
    "judged against the model run in float64 with 16x PyTorch's own float32 error per block of 256 elements), "
    "high (TF32-class matmul and convolution error, as torch.set_float32_matmul_precision(\"high\")), medium "
    "(bf16-class), kernelbench (KernelBench's atol = rtol = 1e-2 on the get_inputs() sets, speedups against the "
    "faster of eager and torch.compile); fp32 and tf32 are aliases of highest and high";

// Exit codes, documented in README.md.
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;   // the command ran; its answer is negative (candidate incorrect, check failed)
constexpr int kExitUsage = 2;    // bad arguments or bad input files
constexpr int kExitEnv = 3;      // environment: no GPU, no torch, unreachable server or model
constexpr int kExitInternal = 4; // a bug or an unexpected failure

// Maps a Status to an exit code and prints "kernelsearch: <message>" on stderr.
int ReportError(const Status& s);

// A subcommand's body: returns an exit code.
using Action = std::function<int()>;

// Registers `sub` so that its action runs when it was chosen on the command line.
void SetAction(CLI::App* sub, Action action);
// The action registered for `sub`, or null.
const Action* FindAction(CLI::App* sub);

// --cache-dir and --cache-cap: where the reference cache lives and how much it
// may hold (evaluator/reference/reference_cache.h). Empty = $KS_CACHE_DIR / $KS_CACHE_CAP
// or the defaults.
struct CacheFlags {
  std::string dir;
  std::string cap;
};
void AddCacheOptions(CLI::App* sub, CacheFlags* flags);
// The directory and the cap in bytes that `flags` select; a bad size is InvalidArgument.
StatusOr<std::pair<std::string, uint64_t>> ResolveCacheFlags(const CacheFlags& flags);

// The --python option, the same on every command that runs the reference bridge.
void AddPythonOption(CLI::App* sub, std::string* python);

// The --precision option (kPrecisionHelp), the same on eval, search and suite:
// a contract's name or alias, parsed into `precision` once, where it is read.
void AddPrecisionOption(CLI::App* sub, Contract* precision);

// The --gpus option (search/evaluator_pool.h): "all" or "0,1,..", one
// evaluator per GPU; empty = GPU 0 only.
void AddGpusOption(CLI::App* sub, std::string* gpus);

// Where bundled data lives (prompts/, problems/, evaluator/reference/): the source
// tree for a build, share/kernelsearch for an installed binary, or KS_DATA_DIR.
std::string DataDir();

// Registration functions, one per cmd_*.cc.
void RegisterProblemCommands(CLI::App& app);
void RegisterCompileCommand(CLI::App& app);
void RegisterEvalCommand(CLI::App& app);
void RegisterCacheCommands(CLI::App& app);  // cache list, cache clear
void RegisterLlmCommands(CLI::App& app);
void RegisterSearchCommands(CLI::App& app);  // search, evaluate-pending
void RegisterBrowseCommands(CLI::App& app);  // history, best, show, lineage, export
void RegisterServeCommand(CLI::App& app);    // serve (gRPC server)
void RegisterReportCommand(CLI::App& app);   // report (HTML page of a search)
void RegisterRemoteCommands(CLI::App& app);  // submit, watch, cancel, remote history|best|show|lineage|eval
void RegisterGpuWorkerCommand(CLI::App& app);  // gpu-worker (pulls leased candidates from a server)
void RegisterDoctorCommand(CLI::App& app);     // doctor: what this machine can do

}  // namespace ks::cli
