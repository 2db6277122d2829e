#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <map>

#include "cli/cli.h"
#include "evaluator/problem.h"
#include "evaluator/reference_cache.h"

namespace ks::cli {
namespace {
std::map<CLI::App*, Action>& Actions() {
  static std::map<CLI::App*, Action> actions;
  return actions;
}
}  // namespace

void SetAction(CLI::App* sub, Action action) { Actions()[sub] = std::move(action); }

void AddPythonOption(CLI::App* sub, std::string* python) {
  sub->add_option("--python", *python,
                  "python3 with torch for the reference bridge (default: $KS_PYTHON, else the first of python3 and "
                  "/usr/bin/python3 that imports torch)");
}

void AddGpusOption(CLI::App* sub, std::string* gpus) {
  sub->add_option("--gpus", *gpus,
                  "GPUs to evaluate on: all, or a list such as 0,1 (one evaluator per GPU, candidates go to whichever "
                  "is free; default: GPU 0)");
}

void AddCacheOptions(CLI::App* sub, CacheFlags* flags) {
  sub->add_option("--cache-dir", flags->dir,
                  "reference cache directory (default: $KS_CACHE_DIR, else ~/.cache/kernelsearch/reference)");
  sub->add_option("--cache-cap", flags->cap,
                  "most the reference cache may hold on disk, e.g. 20G; least recently used entries are evicted "
                  "(default: $KS_CACHE_CAP, else 20G)");
}

StatusOr<std::pair<std::string, uint64_t>> ResolveCacheFlags(const CacheFlags& flags) {
  std::string dir = flags.dir.empty() ? DefaultReferenceCacheDir() : flags.dir;
  uint64_t cap = 0;
  if (!flags.cap.empty()) {
    auto v = ParseByteSize(flags.cap);
    if (!v.ok()) return InvalidArgument("--cache-cap: " + v.status().message());
    cap = *v;
  } else {
    KS_ASSIGN_OR_RETURN(cap, DefaultCacheCap());
  }
  return std::make_pair(dir, cap);
}

int ReportError(const Status& s) {
  std::fprintf(stderr, "kernelsearch: %s\n", s.message().c_str());
  switch (s.code()) {
    case Code::kOk: return kExitOk;
    case Code::kInvalidArgument:
    case Code::kNotFound:
    case Code::kAlreadyExists:
    case Code::kResourceExhausted: return kExitUsage;
    case Code::kFailedPrecondition:
    case Code::kUnavailable:
    case Code::kDeadlineExceeded:
    case Code::kUnauthenticated:
    case Code::kPermissionDenied:
    case Code::kCancelled: return kExitEnv;
    case Code::kInternal: return kExitInternal;
  }
  return kExitInternal;
}

std::string DataDir() {
  namespace fs = std::filesystem;
  if (const char* d = getenv("KS_DATA_DIR"); d && *d) return d;
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n > 0) {
    fs::path exe(std::string(buf, n));
    fs::path installed = exe.parent_path().parent_path() / "share" / "kernelsearch";
    if (fs::exists(installed / "reference")) return installed.string();
  }
  return KS_SOURCE_DIR;
}

}  // namespace ks::cli

int main(int argc, char** argv) {
  using namespace ks::cli;
  CLI::App app{"kernelsearch: finds fast CUDA-C kernels for PyTorch operators"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kernelsearch 0.1.0");
  RegisterProblemCommands(app);
  RegisterCompileCommand(app);
  RegisterEvalCommand(app);
  RegisterCacheCommands(app);
  RegisterLlmCommands(app);
  RegisterSearchCommands(app);
  RegisterBrowseCommands(app);
  RegisterServeCommand(app);
  RegisterReportCommand(app);
  RegisterRemoteCommands(app);
  RegisterGpuWorkerCommand(app);
  RegisterDoctorCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  // The deepest chosen subcommand with an action runs.
  CLI::App* chosen = &app;
  for (;;) {
    auto subs = chosen->get_subcommands();
    if (subs.empty()) break;
    chosen = subs.front();
  }
  for (CLI::App* a = chosen; a; a = a->get_parent()) {
    auto it = Actions().find(a);
    if (it != Actions().end()) {
      try {
        return it->second();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kernelsearch: internal error: %s\n", e.what());
        return kExitInternal;
      }
    }
  }
  std::fprintf(stderr, "%s", chosen->help().c_str());
  return kExitUsage;
}
