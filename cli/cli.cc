// The helpers every subcommand shares (cli.h): actions, common options, the
// exit-code translator and the data directory. Apart from main.cc so that the
// cmd_*.cc files depend on this file and main.cc on them, never round.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <filesystem>
#include <map>

#include "cli/cli.h"
#include "evaluator/problem.h"
#include "evaluator/reference/reference_cache.h"

namespace ks::cli {
namespace {
std::map<CLI::App*, Action>& Actions() {
  static std::map<CLI::App*, Action> actions;
  return actions;
}
}  // namespace

void SetAction(CLI::App* sub, Action action) { Actions()[sub] = std::move(action); }

const Action* FindAction(CLI::App* sub) {
  auto it = Actions().find(sub);
  return it == Actions().end() ? nullptr : &it->second;
}

void AddPythonOption(CLI::App* sub, std::string* python) {
  sub->add_option("--python", *python,
                  "python3 with torch for the reference bridge (default: $KS_PYTHON, else the first of python3 and "
                  "/usr/bin/python3 that imports torch)");
}

void AddPrecisionOption(CLI::App* sub, Contract* precision) {
  sub->add_option_function<std::string>(
         "--precision",
         [precision](const std::string& name) {
           auto contract = ParseContract(name);
           if (!contract.ok()) throw CLI::ValidationError("--precision", contract.status().message());
           *precision = *contract;
         },
         kPrecisionHelp)
      ->check(CLI::IsMember(ContractNames()));
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
