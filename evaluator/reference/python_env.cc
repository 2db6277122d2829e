// Finding a python with torch for the reference bridge (the probe, cached
// per interpreter) and the bundled data files (problem.h).
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/reference/bridge_internal.h"
#include "evaluator/problem.h"

namespace ks {
namespace fs = std::filesystem;
using nlohmann::json;

namespace bridge_internal {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string Tail(const std::string& text, size_t max_lines, size_t max_chars) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  size_t pos = t.size();
  for (size_t i = 0; i < max_lines && pos > 0; ++i) {
    size_t nl = t.rfind('\n', pos - 1);
    if (nl == std::string::npos) { pos = 0; break; }
    pos = nl;
  }
  std::string tail = t.substr(pos == 0 ? 0 : pos + 1);
  if (tail.size() > max_chars) tail = "..." + tail.substr(tail.size() - max_chars);
  return tail;
}

std::string LastLine(const std::string& text) { return Tail(text, 1, 300); }

std::map<std::string, std::string> PythonEnv() { return {{"PYTHONDONTWRITEBYTECODE", "1"}}; }

}  // namespace bridge_internal

using namespace bridge_internal;

namespace {

std::string ExeDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  return fs::path(std::string(buf, n)).parent_path().string();
}


// ---- Python probe ----

struct Probe {
  bool ok = false;
  PythonInfo info;
  std::string why;  // when !ok: the reason, one line
};

Probe RunProbe(const std::string& python) {
  Probe p;
  p.info.python = python;
  auto script = FindDataFile("reference/probe.py");
  if (!script.ok()) {
    p.why = script.status().message();
    return p;
  }
  SubprocessOptions o;
  o.argv = {python, *script};
  o.timeout_s = 120;  // importing torch and initialising CUDA on a cold machine
  o.env = PythonEnv();
  auto r = RunSubprocess(o);
  if (!r.ok()) {
    p.why = r.status().message();
    return p;
  }
  if (!r->Succeeded()) {
    std::string last = LastLine(r->err);
    p.why = r->Describe() + (last.empty() ? "" : ": " + last);
    return p;
  }
  json j = json::parse(LastLine(r->out), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("torch")) {
    p.why = "unexpected probe output: " + LastLine(r->out);
    return p;
  }
  p.info.torch_version = j.value("torch", "");
  p.info.cuda = j.value("cuda", false);
  p.info.device = j.value("device", "cpu");
  p.ok = true;
  return p;
}

// One probe per interpreter per process: importing torch costs seconds.
Probe CachedProbe(const std::string& python) {
  static std::mutex mu;
  static std::map<std::string, Probe> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(python);
    if (it != cache.end()) return it->second;
  }
  Probe p = RunProbe(python);  // outside the lock: slow, and a duplicate probe is harmless
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(python, std::move(p)).first->second;
}

// Whether `python` has torch installed, found without importing it (importing
// torch costs a second or more; the bridge imports it anyway and says clearly
// when it cannot). Cached per interpreter.
bool HasTorchInstalled(const std::string& python) {
  static std::mutex mu;
  static std::map<std::string, bool> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(python); it != cache.end()) return it->second;
  }
  SubprocessOptions o;
  auto script = FindDataFile("reference/probe.py");
  if (!script.ok()) return false;
  o.argv = {python, *script, "--installed"};
  o.timeout_s = 60;
  o.env = PythonEnv();
  auto r = RunSubprocess(o);
  bool has = r.ok() && r->Succeeded();
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(python, has).first->second;
}

// The interpreter that runs the bridge, in ResolvePython's order, without the

}  // namespace

namespace bridge_internal {

StatusOr<std::string> BridgeInterpreter(const std::string& explicit_python) {
  std::string chosen = !explicit_python.empty() ? explicit_python : Env("KS_PYTHON");
  if (!chosen.empty()) {
    if (HasTorchInstalled(chosen)) return chosen;
    // Not a python, or one without torch: the full probe says which and why.
    KS_ASSIGN_OR_RETURN(PythonInfo py, ResolvePython(explicit_python));
    return py.python;
  }
  std::vector<std::string> candidates;
  if (auto p = FindOnPath("python3")) candidates.push_back(*p);
  if (candidates.empty() || candidates[0] != "/usr/bin/python3") candidates.push_back("/usr/bin/python3");
  for (const auto& c : candidates)
    if (HasTorchInstalled(c)) return c;
  // None has torch: the full probe's message lists every interpreter and why.
  KS_ASSIGN_OR_RETURN(PythonInfo py, ResolvePython(""));
  return py.python;
}

// probe.py --quick: the facts the reference cache's key needs (torch's
// version, device 0's name) without importing torch or starting CUDA in
// torch: a tenth of a second instead of seconds, on every evaluation.
// Cached per interpreter; NotFound when that python has no torch.
StatusOr<PythonInfo> QuickProbe(const std::string& python) {
  static std::mutex mu;
  static std::map<std::string, StatusOr<PythonInfo>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = cache.find(python); it != cache.end()) return it->second;
  }
  StatusOr<PythonInfo> info = [&]() -> StatusOr<PythonInfo> {
    KS_ASSIGN_OR_RETURN(std::string script, FindDataFile("reference/probe.py"));
    SubprocessOptions o;
    o.argv = {python, script, "--quick"};
    o.timeout_s = 60;
    o.env = PythonEnv();
    KS_ASSIGN_OR_RETURN(SubprocessResult r, RunSubprocess(o));
    json j = json::parse(LastLine(r.out), nullptr, /*allow_exceptions=*/false);
    if (!r.Succeeded() || !j.is_object() || !j.contains("torch"))
      return NotFound(python + " probe.py --quick: " + r.Describe() + " " + LastLine(r.err));
    PythonInfo p;
    p.python = python;
    p.torch_version = j.value("torch", "");
    p.cuda = j.value("cuda", false);
    p.device = j.value("device", "cpu");
    return p;
  }();
  std::lock_guard<std::mutex> lock(mu);
  return cache.emplace(python, std::move(info)).first->second;
}

}  // namespace bridge_internal

void WarmReferenceProbe(const BridgeOptions& opts) {
  if (auto python = bridge_internal::BridgeInterpreter(opts.python); python.ok())
    (void)bridge_internal::QuickProbe(*python);
}

// ---- Data files ----

StatusOr<std::string> FindDataFile(const std::string& relative) {
  std::vector<fs::path> tried;
  if (std::string d = Env("KS_DATA_DIR"); !d.empty()) {
    // An explicit data directory is the only one looked at: mixing files from
    // two trees would be confusing to debug.
    tried.push_back(fs::path(d) / relative);
  } else {
    if (std::string exe = ExeDir(); !exe.empty())
      tried.push_back(fs::path(exe).parent_path() / "share" / "kernelsearch" / relative);
    // The source tree keeps the reference bridge with the evaluator code.
    std::string in_source = relative.rfind("reference/", 0) == 0 ? "evaluator/" + relative : relative;
    tried.push_back(fs::path(KS_SOURCE_DIR) / in_source);
  }
  std::string list;
  for (const auto& p : tried) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) return fs::absolute(p).lexically_normal().string();
    list += (list.empty() ? "" : ", ") + p.string();
  }
  return NotFound("data file '" + relative + "' not found; tried " + list +
                  (Env("KS_DATA_DIR").empty() ? "" : " (KS_DATA_DIR is set)"));
}

// ---- Python ----

StatusOr<PythonInfo> ResolvePython(const std::string& explicit_python) {
  auto from = [](const std::string& python, const std::string& source) -> StatusOr<PythonInfo> {
    Probe p = CachedProbe(python);
    if (!p.ok) return FailedPrecondition(source + " " + python + " cannot import torch: " + p.why);
    return p.info;
  };
  if (!explicit_python.empty()) return from(explicit_python, "--python");
  if (std::string env = Env("KS_PYTHON"); !env.empty()) return from(env, "KS_PYTHON=");

  std::vector<std::string> candidates;
  if (auto p = FindOnPath("python3")) candidates.push_back(*p);
  if (candidates.empty() || candidates[0] != "/usr/bin/python3") candidates.push_back("/usr/bin/python3");
  std::string tried;
  for (const auto& c : candidates) {
    Probe p = CachedProbe(c);
    if (p.ok) return p.info;
    tried += (tried.empty() ? "" : "; ") + c + " (" + p.why + ")";
  }
  return FailedPrecondition("no python3 with torch found; tried " + tried + "; set KS_PYTHON or pass --python");
}

}  // namespace ks
