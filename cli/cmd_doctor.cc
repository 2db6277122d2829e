// kernelsearch doctor: what this machine can do, one line per check, each
// failing or missing one with what to do about it. Runs every check whatever
// the others say (a laptop without a GPU is still a good model side).
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/llm_flags.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/problem.h"
#include "evaluator/reference/reference_cache.h"
#include "store/lineage_store.h"

namespace ks::cli {
namespace {

enum class Verdict { kOk, kWarn, kFail };

struct Check {
  Verdict verdict;
  std::string what;    // "GPU", "python + torch", ...
  std::string detail;  // what was found
  std::string todo;    // what to do (not ok only)
};

// The driver and the GPUs it sees.
Check CheckGpu() {
  std::string why;
  if (!GpuAvailable(&why))
    return {Verdict::kFail, "GPU", "none usable here: " + why,
            "this machine can still be the model side of a split search (`search --generate-only --gpu NAME`); "
            "evaluate with `kernelsearch evaluate-pending` or `gpu-worker` on a machine with an NVIDIA GPU and "
            "its driver, or try the tool with `--evaluator fake`"};
  auto driver = CudaDriver::Get();
  if (!driver.ok()) return {Verdict::kFail, "GPU", driver.status().message(), "install the NVIDIA driver"};
  const CudaDriver* d = *driver;
  int version = 0, count = 0;
  d->cuDriverGetVersion(&version);
  d->cuDeviceGetCount(&count);
  std::string names;
  for (int i = 0; i < count; ++i) {
    CUdevice dev = 0;
    if (d->cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    auto info = QueryDevice(dev);
    if (!info.ok()) continue;
    names += fmt::format("{}{}: {} (sm_{}{}, {} SMs, {:.0f} GiB)", i ? "; " : "", i, info->name, info->sm_major,
                         info->sm_minor, info->multiprocessors, info->total_memory / double(1 << 30));
  }
  return {Verdict::kOk, "GPU", fmt::format("driver CUDA {}.{}, {} GPU{}: {}", version / 1000, version % 1000 / 10,
                                           count, count == 1 ? "" : "s", names),
          ""};
}

// NVRTC, loaded the way ks-worker finds it (the CLI itself does not link it).
Check CheckNvrtc() {
  std::vector<std::string> names = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
  for (const char* var : {"KS_CUDA_HOME", "CUDA_HOME"})
    if (const char* home = std::getenv(var); home && *home) names.push_back(std::string(home) + "/lib64/libnvrtc.so");
  names.push_back("/usr/local/cuda/lib64/libnvrtc.so");
  struct Closer {
    void operator()(void* h) const { dlclose(h); }
  };
  std::unique_ptr<void, Closer> lib;
  std::string found;
  for (const auto& n : names) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      lib.reset(h);
      found = n;
      break;
    }
  }
  if (!lib)
    return {Verdict::kFail, "NVRTC", "libnvrtc not found", "install the CUDA toolkit (13.0) or set CUDA_HOME"};
  using VersionFn = int (*)(int*, int*);
  using NumArchsFn = int (*)(int*);
  using ArchsFn = int (*)(int*);
  auto version = reinterpret_cast<VersionFn>(dlsym(lib.get(), "nvrtcVersion"));
  auto num_archs = reinterpret_cast<NumArchsFn>(dlsym(lib.get(), "nvrtcGetNumSupportedArchs"));
  auto archs = reinterpret_cast<ArchsFn>(dlsym(lib.get(), "nvrtcGetSupportedArchs"));
  int major = 0, minor = 0, n = 0;
  if (!version || version(&major, &minor) != 0)
    return {Verdict::kFail, "NVRTC", found + " has no usable nvrtcVersion", "reinstall the CUDA toolkit"};
  std::string targets;
  if (num_archs && archs && num_archs(&n) == 0 && n > 0) {
    std::vector<int> list(n);
    archs(list.data());
    for (int a : list) targets += fmt::format(" sm_{}", a);
    // Arch-specific targets (wgmma, setmaxnreg, tcgen05) exist from compute capability 9.0 on.
    for (int a : list)
      if (a >= 90) targets += fmt::format(" sm_{}a", a);
  }
  std::string worker;
  auto w = FindWorker("");
  if (!w.ok())
    return {Verdict::kFail, "NVRTC", fmt::format("{}.{} ({}); {}", major, minor, found, w.status().message()),
            "install ks-worker next to kernelsearch (scripts/package_device.sh does)"};
  return {Verdict::kOk, "NVRTC", fmt::format("{}.{} ({}), targets:{}; ks-worker {}", major, minor, found, targets, *w),
          ""};
}

Check CheckPython(const std::string& python) {
  auto info = ResolvePython(python);
  if (!info.ok())
    return {Verdict::kFail, "python + torch", info.status().message(),
            "install torch for a python3 and name it with --python or $KS_PYTHON (Debian: apt install python3-torch)"};
  std::string detail = fmt::format("{} with torch {}, {}", info->python, info->torch_version,
                                   info->cuda ? "CUDA: " + info->device : std::string("no CUDA"));
  if (!info->cuda)
    return {Verdict::kWarn, "python + torch", detail,
            "fine for the model side and problem checks; references and timings need a torch that sees the GPU"};
  return {Verdict::kOk, "python + torch", detail, ""};
}

Check CheckCache() {
  const std::string dir = DefaultReferenceCacheDir();
  auto cap = DefaultCacheCap();
  if (!cap.ok()) return {Verdict::kFail, "reference cache", cap.status().message(), "fix $KS_CACHE_CAP (e.g. 20G)"};
  auto usage = ReadCacheUsage(dir);
  if (!usage.ok()) return {Verdict::kFail, "reference cache", usage.status().message(), "check $KS_CACHE_DIR"};
  std::filesystem::path probe = dir;
  while (!probe.empty() && !std::filesystem::exists(probe)) probe = probe.parent_path();
  auto free_bytes = FreeDiskBytes(probe.empty() ? "/" : probe.string());
  std::string detail = fmt::format("{}: {} entries, {} of {} cap", dir, usage->entries.size(),
                                   HumanBytes(usage->entry_bytes), HumanBytes(*cap));
  if (!free_bytes.ok()) return {Verdict::kWarn, "reference cache", detail, free_bytes.status().message()};
  detail += ", " + HumanBytes(*free_bytes) + " free on its disk";
  if (*free_bytes < (uint64_t{2} << 30))
    return {Verdict::kWarn, "reference cache", detail,
            "less than 2 GiB free: references of larger problems will not fit (`kernelsearch cache clear`, or "
            "--cache-dir on a larger disk)"};
  return {Verdict::kOk, "reference cache", detail, ""};
}

Check CheckStore(const std::string& flag) {
  const std::string path = flag.empty() ? store::DefaultDbPath() : flag;
  if (!std::filesystem::exists(path))
    return {Verdict::kOk, "lineage store", path + " (not created yet: the first search creates it)", ""};
  store::LineageStore::Options o;
  o.must_exist = true;
  auto opened = store::LineageStore::Open(path, o);
  if (!opened.ok())
    return {Verdict::kFail, "lineage store", opened.status().message(), "check the file and its folder's permissions"};
  auto version = (*opened)->SchemaVersion();
  auto history = (*opened)->History(0);
  return {Verdict::kOk, "lineage store",
          fmt::format("{} (schema {}, {} searches)", path, version.ok() ? *version : -1,
                      history.ok() ? history->size() : 0),
          ""};
}

// Nsight Compute, for hardware counters of kernels.
Check CheckNcu() {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream ss(path);
    for (std::string d; std::getline(ss, d, ':');) dirs.push_back(d);
  }
  dirs.push_back("/usr/local/cuda/bin");
  for (const auto& d : dirs) {
    std::string ncu = d + "/ncu";
    if (::access(ncu.c_str(), X_OK) == 0) return {Verdict::kOk, "Nsight Compute", ncu, ""};
  }
  return {Verdict::kWarn, "Nsight Compute", "ncu not found on PATH or in /usr/local/cuda/bin",
          "kernels are still judged and timed; for hardware counters install Nsight Compute (part of the CUDA "
          "toolkit) where the GPU is"};
}

Check CheckModelFlags(const LlmFlags& flags) {
  if (flags.config.spec.empty())
    return {Verdict::kWarn, "model", "not checked", "pass --model SPEC to send it one small request"};
  auto summary = CheckModel(flags);
  if (!summary.ok())
    return {Verdict::kFail, "model", summary.status().message(),
            "see `kernelsearch llm check --help`: the key variable (--api-key-env), the base URL, the model name"};
  return {Verdict::kOk, "model", *summary, ""};
}

struct DoctorFlags {
  std::string python;
  std::string db;
  LlmFlags llm;
};

int RunDoctor(const DoctorFlags& f) {
  std::vector<Check> checks = {CheckGpu(),   CheckNvrtc(),       CheckPython(f.python), CheckCache(),
                               CheckStore(f.db), CheckNcu(), CheckModelFlags(f.llm)};
  int failed = 0;
  for (const auto& c : checks) {
    const char* tag = c.verdict == Verdict::kOk ? "ok  " : c.verdict == Verdict::kWarn ? "warn" : "FAIL";
    std::printf("%s  %-16s %s\n", tag, c.what.c_str(), c.detail.c_str());
    if (!c.todo.empty() && c.verdict != Verdict::kOk) std::printf("      %-16s -> %s\n", "", c.todo.c_str());
    if (c.verdict == Verdict::kFail) ++failed;
  }
  return failed > 0 ? kExitFailed : kExitOk;
}

}  // namespace

void RegisterDoctorCommand(CLI::App& app) {
  auto* f = new DoctorFlags();  // lives as long as the process: CLI11 binds to it
  auto* sub = app.add_subcommand("doctor", "check what this machine can do (GPU, NVRTC, python + torch, cache, "
                                           "store, Nsight Compute, the model), one line per check with what to do");
  AddPythonOption(sub, &f->python);
  sub->add_option("--db", f->db, "lineage store (default $KS_DB or ~/.local/share/kernelsearch/lineage.db)");
  AddLlmOptions(sub, &f->llm, /*require_model=*/false);
  sub->footer("Exit status: 0 every check ok or a warning, 1 a check failed (a machine without a GPU fails the GPU "
              "check and is still a good model side).");
  SetAction(sub, [f] { return RunDoctor(*f); });
}

}  // namespace ks::cli
