#include "evaluator/problem.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cctype>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/reference_cache.h"

namespace ks {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string ExeDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  return fs::path(std::string(buf, n)).parent_path().string();
}

// The last `max_lines` lines of `text`, at most `max_chars` characters.
std::string Tail(const std::string& text, size_t max_lines = 15, size_t max_chars = 2000) {
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

// Child environment for every python run: no .pyc files written into the
// source tree or an installed share/ directory.
std::map<std::string, std::string> PythonEnv() { return {{"PYTHONDONTWRITEBYTECODE", "1"}}; }

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

// ---- Running the bridge ----

// Maps the bridge's error kinds to status codes: problem defects are the user's
// input (InvalidArgument); a missing torch or GPU is the environment.
Code CodeForKind(const std::string& kind) {
  if (kind == "no_torch" || kind == "device_error") return Code::kFailedPrecondition;
  if (kind == "out_of_memory" || kind == "disk_full") return Code::kResourceExhausted;
  if (kind == "internal") return Code::kInternal;
  return Code::kInvalidArgument;
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
// full probe (which imports torch): the first whose torch can be found. A signature then costs one torch import, not two.
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

// The bridge's {"error": ...} answer as a Status, or OkStatus for any other answer.
Status BridgeErrorStatus(const json& j, const std::string& file, const BridgeOptions& opts) {
  if (!(j.is_object() && j.contains("error") && j["error"].is_object())) return Status::Ok();
  const json& e = j["error"];
  std::string message = e.value("message", file + ": reference bridge error");
  std::string detail = e.value("detail", "");
  if (opts.verbose && !detail.empty()) message += "\n" + detail;
  return Status(CodeForKind(e.value("kind", "")), message);
}

std::vector<std::string> BridgeArgv(const std::string& python, const std::string& bridge,
                                    const std::vector<std::string>& args) {
  std::vector<std::string> argv = {python, bridge};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// "FILE: the reference bridge failed (WHY):\n<the tail of its stderr>".
Status BridgeFailed(const std::string& file, const std::string& why, const std::string& stderr_text) {
  std::string err = Tail(stderr_text);
  return Internal(file + ": the reference bridge failed (" + why + ")" + (err.empty() ? "" : ":\n" + err));
}

// A bridge whose caller was killed would go on writing gigabytes into a
// temporary directory nobody will rename, or hold GPU memory: it dies with its parent.
int DieWithParent() { return prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 ? 0 : 126; }

StatusOr<json> RunBridge(const std::string& file, std::vector<std::string> args, const BridgeOptions& opts) {
  KS_ASSIGN_OR_RETURN(std::string python, BridgeInterpreter(opts.python));
  KS_ASSIGN_OR_RETURN(std::string bridge, FindDataFile("reference/bridge.py"));
  SubprocessOptions o;
  o.argv = BridgeArgv(python, bridge, args);
  o.timeout_s = opts.timeout_s;
  o.env = PythonEnv();
  o.in_child = DieWithParent;
  KS_ASSIGN_OR_RETURN(SubprocessResult r, RunSubprocess(o));
  if (r.timed_out)
    return DeadlineExceeded(file + ": the reference bridge timed out after " + std::to_string(int(opts.timeout_s)) +
                            " s (raise the timeout for large problems on CPU)");
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  KS_RETURN_IF_ERROR(BridgeErrorStatus(j, file, opts));
  if (!r.Succeeded() || !j.is_object()) {
    std::string why = r.Describe();
    if (r.term_signal == SIGKILL) why += " (out of memory?)";
    return BridgeFailed(file, why, r.err);
  }
  return j;
}

// Removes a directory tree when it goes out of scope, unless released.
class ScopedDirRemover {
 public:
  explicit ScopedDirRemover(fs::path p) : path_(std::move(p)) {}
  ~ScopedDirRemover() {
    if (path_.empty()) return;
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  ScopedDirRemover(const ScopedDirRemover&) = delete;
  ScopedDirRemover& operator=(const ScopedDirRemover&) = delete;
  void Release() { path_.clear(); }

 private:
  fs::path path_;
};

// Length-prefixed fields, so that no two different field lists hash alike.
void AddKeyField(std::string& key, const std::string& name, const std::string& value) {
  key += name + ":" + std::to_string(value.size()) + ":" + value + "\n";
}

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// How many input sets a reference may have, and the disk it will take.
struct SetFit {
  int sets = 0;
  uint64_t disk_bytes = 0;  // for `sets` sets
  std::string why;          // when sets < asked: the limit that bound it, with figures
};

// Disk: parameters once, inputs and outputs per set. Device (GpuEvaluator's
// layout): the arena (every set's inputs, parameters, outputs) and the pristine
// copy (inputs and parameters again), plus one reference copy of the outputs per set.
// (A resident reference's rule is fit_resident in bridge.py, which decides it.)
// `shifted` of the `asked` sets are distribution-shifted ones, taken last (as
// PrepareReference shares the room): each may carry its own copy of the
// float32 parameters (transforms.py), on disk and twice in the arena.
SetFit FitSets(const Signature& sig, int asked, uint64_t cap, uint64_t disk_available, uint64_t device_budget,
               int shifted = 0) {
  uint64_t in = 0, params = 0, out = 0, own = 0;
  for (const auto& t : sig.inputs) if (!t.is_scalar) in += t.bytes();
  for (const auto& t : sig.parameters) if (!t.is_scalar) params += t.bytes();
  for (const auto& t : sig.parameters)
    if (!t.is_scalar && (t.dtype == DType::kFloat32 || t.dtype == DType::kFloat64)) own += t.bytes();
  for (const auto& t : sig.outputs) if (!t.is_scalar) out += t.bytes();
  const int judging = asked - shifted;
  auto shifted_in = [&](int k) -> uint64_t { return std::clamp(k - std::max(std::min(judging, 2), k - shifted), 0, shifted); };
  auto disk = [&](int k) { return params + uint64_t(k) * (in + out) + shifted_in(k) * own; };
  auto device = [&](int k) { return 2 * params + out + uint64_t(k) * (2 * in + out) + 2 * shifted_in(k) * own; };
  const uint64_t disk_limit = std::min(cap, disk_available);
  SetFit f;
  for (int k = asked; k >= 1; --k) {
    bool disk_ok = disk(k) <= disk_limit, device_ok = device_budget == 0 || device(k) <= device_budget;
    if (disk_ok && device_ok) { f.sets = k; break; }
  }
  f.disk_bytes = disk(std::max(f.sets, 1));
  if (f.sets < asked) {
    const int k = std::max(f.sets + 1, 1);  // the first count that did not fit
    if (disk(k) > disk_limit)
      f.why = std::to_string(k) + " set(s) need " + HumanBytes(disk(k)) + " on disk (" + HumanBytes(in + out) +
              " per set), but the cache " + (cap <= disk_available ? "cap is " + HumanBytes(cap) + " (--cache-cap, $KS_CACHE_CAP)"
                                                                   : "may use only " + HumanBytes(disk_available) + " (free disk plus its own entries)");
    else
      f.why = std::to_string(k) + " set(s) need " + HumanBytes(device(k)) + " of GPU memory (" +
              HumanBytes(2 * in + out) + " per set: inputs, their pristine copy, reference outputs), but " +
              HumanBytes(device_budget) + " is free";
  }
  return f;
}

// Distribution-shifted sets the bridge may add (one per transform in transforms.py).
constexpr int kTransformSets = 4;

uint64_t ResidentMinBytes(const ReferenceOptions& opts) {
  if (opts.resident_min_bytes) return *opts.resident_min_bytes;
  if (std::string v = Env("KS_RESIDENT_MIN_BYTES"); !v.empty()) {
    char* end = nullptr;
    unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    if (end && *end == '\0') return n;
  }
  return uint64_t{1} << 30;
}

}  // namespace

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

// ---- Signature and check ----

StatusOr<Signature> LoadProblemSignature(const std::string& file, const BridgeOptions& opts) {
  KS_ASSIGN_OR_RETURN(json j, RunBridge(file, {"signature", file}, opts));
  auto sig = SignatureFromJson(j);
  if (!sig.ok()) return Internal(file + ": the reference bridge returned a bad signature: " + sig.status().message());
  return sig;
}

StatusOr<std::vector<std::string>> CheckProblem(const std::string& file, const BridgeOptions& opts,
                                                const std::string& device, uint64_t seed,
                                                std::vector<std::string>* notes) {
  KS_ASSIGN_OR_RETURN(json j, RunBridge(file, {"check", file, "--device", device, "--seed", std::to_string(seed)}, opts));
  if (!j.contains("warnings") || !j["warnings"].is_array())
    return Internal(file + ": the reference bridge's check answer has no warnings list");
  std::vector<std::string> out;
  for (const auto& w : j["warnings"]) out.push_back(w.get<std::string>());
  if (notes && j.contains("notes") && j["notes"].is_array())
    for (const auto& n : j["notes"]) notes->push_back(n.get<std::string>());
  return out;
}

// ---- Reference data ----

StatusOr<std::string> ReferenceData::FilePath(int set, const std::string& name) const {
  if (set < 0 || set >= static_cast<int>(sets.size()))
    return NotFound(dir + ": no input set " + std::to_string(set) + " (there are " + std::to_string(sets.size()) + ")");
  auto it = sets[set].files.find(name);
  if (it == sets[set].files.end()) return NotFound(dir + ": set " + std::to_string(set) + " has no tensor '" + name + "'");
  return it->second;
}

int ReferenceData::JudgingSets() const {
  int n = 0;
  while (n < static_cast<int>(sets.size()) && sets[n].transform.empty()) ++n;
  return n;
}

std::string DefaultReferenceCacheDir() {
  if (std::string d = Env("KS_CACHE_DIR"); !d.empty()) return d;
  if (std::string d = Env("XDG_CACHE_HOME"); !d.empty()) return (fs::path(d) / "kernelsearch" / "reference").string();
  std::string home = Env("HOME");
  if (home.empty()) home = "/tmp";
  return (fs::path(home) / ".cache" / "kernelsearch" / "reference").string();
}

namespace {

// A JSON array of strings under `key` (anything else: empty).
std::vector<std::string> StringList(const json& j, const char* key) {
  std::vector<std::string> out;
  if (j.is_object() && j.contains(key) && j[key].is_array())
    for (const auto& v : j[key])
      if (v.is_string()) out.push_back(v.get<std::string>());
  return out;
}

// A set's own parameters must be parameters of the signature, each once, and
// only a shifted set has them: the judging sets share one copy.
Status CheckOwnParameters(const Signature& sig, const ReferenceSet& set, const std::string& where) {
  std::set<std::string> seen;
  for (const std::string& name : set.own_parameters) {
    bool known = false;
    for (const auto& p : sig.parameters) known = known || (p.name == name && !p.is_scalar);
    if (!known || !seen.insert(name).second)
      return InvalidArgument(where + ": set with seed " + std::to_string(set.seed) + " names '" + name +
                             "' as its own parameter, which is not a tensor parameter of the signature (or twice)");
  }
  if (!set.own_parameters.empty() && set.transform.empty())
    return InvalidArgument(where + ": a get_inputs() set with parameters of its own");
  return Status::Ok();
}

// The parts of a manifest (written by the bridge) common to both kinds of
// reference: the signature, device, timings, warnings, phases and scalars.
// `where` names it in errors.
StatusOr<ReferenceData> ReferenceFromManifest(const json& j, const std::string& where) {
  if (!j.is_object() || !j.contains("signature") || !j.contains("sets") || !j["sets"].is_array())
    return InvalidArgument(where + ": not a reference manifest");
  ReferenceData d;
  auto sig = SignatureFromJson(j["signature"]);
  if (!sig.ok()) return sig.status().WithContext(where);
  d.signature = std::move(sig).value();
  d.device = j.value("device", "");
  d.torch_version = j.value("torch", "");
  if (j.contains("timing") && j["timing"].is_object()) {
    const json& t = j["timing"];
    if (t.contains("eager") && t["eager"].is_object()) d.eager = TimingFromJson(t["eager"]);
    if (t.contains("compiled") && t["compiled"].is_object()) d.compiled = TimingFromJson(t["compiled"]);
  }
  if (j.contains("warnings") && j["warnings"].is_array())
    for (const auto& w : j["warnings"])
      if (w.is_string()) d.warnings.push_back(w.get<std::string>());
  if (j.contains("notes") && j["notes"].is_array())
    for (const auto& n : j["notes"])
      if (n.is_string()) d.notes.push_back(n.get<std::string>());
  if (j.contains("degenerate") && j["degenerate"].is_array())
    for (const auto& w : j["degenerate"])
      if (w.is_string()) d.degenerate.push_back(w.get<std::string>());
  if (j.contains("phases") && j["phases"].is_array())
    for (const auto& ph : j["phases"])
      if (ph.is_array() && ph.size() == 2 && ph[0].is_string() && ph[1].is_number())
        d.phases.emplace_back("bridge: " + ph[0].get<std::string>(), ph[1].get<double>());
  if (j.contains("scalars") && j["scalars"].is_object())
    for (const auto& [k, v] : j["scalars"].items())
      if (v.is_number()) d.scalars[k] = v.get<double>();
  if (j.contains("timing") && j["timing"].is_object() && j["timing"].contains("eager_fp32") &&
      j["timing"]["eager_fp32"].is_object())
    d.eager_fp32 = TimingFromJson(j["timing"]["eager_fp32"]);
  if (j.contains("default_precision") && j["default_precision"].is_object() &&
      j["default_precision"].contains("errors") && j["default_precision"]["errors"].is_object())
    for (const auto& [name, e] : j["default_precision"]["errors"].items())
      if (e.is_object())
        d.default_precision_error[name] = {e.value("rms", 0.0), e.value("rel_norm", 0.0), e.value("max_abs", 0.0)};
  if (j.contains("shape_variants") && j["shape_variants"].is_number_integer())
    d.shape_variant_count = std::max(0, j["shape_variants"].get<int>());
  if (j.contains("transforms") && j["transforms"].is_array())
    for (const auto& t : j["transforms"]) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) continue;
      InputTransform x;
      x.name = t["name"].get<std::string>();
      x.set = t.contains("set") && t["set"].is_number_integer() ? t["set"].get<int>() : -1;
      x.note = t.value("note", "");
      if (t.contains("reference_error") && t["reference_error"].is_object())
        for (const auto& [name, e] : t["reference_error"].items())
          if (e.is_object()) x.reference_error[name] = {e.value("rms", 0.0), e.value("rel_norm", 0.0)};
      x.parameters = StringList(t, "parameters");
      d.transforms.push_back(std::move(x));
    }
  return d;
}

// A set's "transform" (transforms.py); the get_inputs() sets must all come
// first, and a transform's set must say it is that transform's.
Status CheckTransformOrder(const ReferenceData& d, const std::string& where) {
  bool shifted = false;
  for (const auto& s : d.sets) {
    if (!s.transform.empty()) shifted = true;
    else if (shifted) return InvalidArgument(where + ": a get_inputs() set after a distribution-shifted one");
  }
  for (const auto& t : d.transforms)
    if (t.set >= 0 && (t.set >= static_cast<int>(d.sets.size()) || d.sets[t.set].transform != t.name))
      return InvalidArgument(where + ": transform '" + t.name + "' names input set " + std::to_string(t.set) +
                             ", which is not its set");
  return Status::Ok();
}

// Every tensor of the signature must be present in a set, or a consumer would
// fail later, far from the cause.
template <typename Map>
Status CheckSetComplete(const Signature& sig, const Map& tensors, uint64_t seed, const std::string& where) {
  for (const auto* list : {&sig.inputs, &sig.parameters, &sig.outputs})
    for (const auto& t : *list)
      if (!t.is_scalar && !tensors.count(t.name))
        return InvalidArgument(where + ": set with seed " + std::to_string(seed) + " lacks '" + t.name + "'");
  return Status::Ok();
}

}  // namespace

StatusOr<ReferenceData> LoadReferenceDir(const std::string& dir_in) {
  const fs::path dir = fs::absolute(dir_in).lexically_normal();
  const std::string manifest_path = (dir / "manifest.json").string();
  KS_ASSIGN_OR_RETURN(std::string text, ReadFile(manifest_path, 64u << 20));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  KS_ASSIGN_OR_RETURN(ReferenceData d, ReferenceFromManifest(j, manifest_path));
  d.dir = dir.string();
  for (const auto& s : j["sets"]) {
    ReferenceSet set;
    set.seed = s.value("seed", uint64_t{0});
    if (!s.contains("files") || !s["files"].is_object())
      return InvalidArgument(manifest_path + ": a set has no 'files'");
    for (const auto& [name, rel] : s["files"].items()) {
      const TensorSpec* spec = d.signature.Find(name);
      if (!spec || spec->is_scalar)
        return InvalidArgument(manifest_path + ": file for '" + name + "', which is not a tensor of the signature");
      fs::path p = (dir / rel.get<std::string>()).lexically_normal();
      std::error_code ec;
      uintmax_t size = fs::file_size(p, ec);
      if (ec) return InvalidArgument(manifest_path + ": " + p.string() + ": " + ec.message());
      if (static_cast<int64_t>(size) != spec->bytes())
        return InvalidArgument(p.string() + ": " + std::to_string(size) + " bytes, expected " +
                               std::to_string(spec->bytes()) + " for '" + name + "'");
      set.files[name] = p.string();
    }
    KS_RETURN_IF_ERROR(CheckSetComplete(d.signature, set.files, set.seed, manifest_path));
    set.transform = s.value("transform", "");
    set.own_parameters = StringList(s, "parameters");
    KS_RETURN_IF_ERROR(CheckOwnParameters(d.signature, set, manifest_path));
    d.sets.push_back(std::move(set));
  }
  if (d.sets.empty()) return InvalidArgument(manifest_path + ": no input sets");
  KS_RETURN_IF_ERROR(CheckTransformOrder(d, manifest_path));
  return d;
}

// ---- Resident references ----

ResidentReference::~ResidentReference() {
  if (!bridge_.running()) return;
  // Closing stdin is the bridge's signal to exit; give it a moment to free
  // its GPU memory cleanly, then make sure.
  bridge_.CloseStdin();
  for (int i = 0; i < 50 && !bridge_.TryReap(); ++i) usleep(20 * 1000);
  if (bridge_.running()) bridge_.Kill();
}

StatusOr<ResidentTensor> ResidentReference::At(int set, const std::string& name) const {
  if (set < 0 || set >= static_cast<int>(sets_.size()))
    return NotFound("resident reference: no input set " + std::to_string(set) + " (there are " +
                    std::to_string(sets_.size()) + ")");
  auto it = sets_[set].find(name);
  if (it == sets_[set].end()) return NotFound("resident reference: set " + std::to_string(set) + " has no tensor '" + name + "'");
  return it->second;
}

bool ResidentReference::Alive() { return bridge_.running() && !bridge_.TryReap(); }

namespace {

// One line from fd (the bridge's JSON answer), waiting at most timeout_s.
StatusOr<std::string> ReadLine(int fd, double timeout_s, size_t max_bytes) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  char c;
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return DeadlineExceeded("no answer");
    Status st = ReadExact(fd, &c, 1, left);
    if (!st.ok()) return st;
    if (c == '\n') return line;
    line.push_back(c);
    if (line.size() > max_bytes) return Internal("an answer line longer than " + std::to_string(max_bytes) + " bytes");
  }
}

// A bridge process started with `bridge.py reference ... --then-files` that
// answered {"resident": false, "signature": ...} and waits for the request to
// write the reference's files (one python start for the signature and the
// reference). Ends the bridge (closing its stdin, then SIGKILL) and removes
// its stderr file when it goes out of scope.
class WaitingBridge {
 public:
  WaitingBridge(ChildProcess child, std::string err_path) : child_(std::move(child)), err_path_(std::move(err_path)) {}
  ~WaitingBridge() {
    if (child_.running()) {
      child_.CloseStdin();
      for (int i = 0; i < 25 && !child_.TryReap(); ++i) usleep(20 * 1000);
      if (child_.running()) child_.Kill();
    }
    unlink(err_path_.c_str());
  }
  WaitingBridge(const WaitingBridge&) = delete;
  WaitingBridge& operator=(const WaitingBridge&) = delete;

  // Sends the request, waits for the manifest (at most timeout_s) and for the
  // bridge to exit.
  StatusOr<json> WriteFiles(const std::string& file, const json& request, const BridgeOptions& opts) {
    const std::string line = request.dump() + "\n";
    Status sent = WriteAll(child_.stdin_fd(), line.data(), line.size());
    child_.CloseStdin();
    auto answer = sent.ok() ? ReadLine(child_.stdout_fd(), opts.timeout_s, 256u << 20) : StatusOr<std::string>(sent);
    if (!answer.ok() && answer.status().code() == Code::kDeadlineExceeded) {
      child_.Kill();
      return DeadlineExceeded(file + ": the reference bridge timed out after " + std::to_string(int(opts.timeout_s)) +
                              " s (raise the timeout for large problems on CPU)");
    }
    json j = answer.ok() ? json::parse(*answer, nullptr, /*allow_exceptions=*/false) : json();
    // The bridge has answered (or died): it exits by itself.
    std::optional<std::string> how;
    for (int i = 0; i < 500 && !(how = child_.TryReap()); ++i) usleep(10 * 1000);
    const bool killed_by_us = !how;
    if (killed_by_us) how = child_.Kill();
    KS_RETURN_IF_ERROR(BridgeErrorStatus(j, file, opts));
    if (!answer.ok() || !j.is_object()) {
      auto text = ReadFile(err_path_, 1u << 20);
      std::string why = (answer.ok() ? std::string("an answer that is not JSON") : answer.status().message()) + ", " + *how;
      if (!killed_by_us && how->find("signal 9") != std::string::npos) why += " (out of memory?)";
      return BridgeFailed(file, why, text.ok() ? *text : "");
    }
    return j;
  }

 private:
  ChildProcess child_;
  std::string err_path_;
};

// bridge.py reference --resident and/or --then-files: the bridge infers the
// sizes, then either computes the reference on the GPU and keeps it (its
// manifest names each tensor's IPC handle), or answers {"resident": false,
// "signature": ...}. Returns the data and the bridge's answer; in the second
// case data without `resident`, and, with --then-files, the bridge waiting
// for the request to write the files in *waiting.
StatusOr<std::pair<ReferenceData, json>> StartBridge(const std::string& file, const std::vector<std::string>& args,
                                                     const BridgeOptions& opts,
                                                     std::unique_ptr<WaitingBridge>* waiting) {
  KS_ASSIGN_OR_RETURN(std::string python, BridgeInterpreter(opts.python));
  KS_ASSIGN_OR_RETURN(std::string bridge, FindDataFile("reference/bridge.py"));
  auto env = PythonEnv();
  // Expandable segments are mapped memory without an IPC handle.
  env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False";
  char tmpl[] = "/tmp/ks-bridge-XXXXXX";
  int fd = mkstemp(tmpl);
  if (fd < 0) return PosixError("creating a file for the bridge's messages", errno);
  close(fd);
  std::string err_path = tmpl;
  struct Unlink {
    std::string p;
    ~Unlink() { if (!p.empty()) unlink(p.c_str()); }
  } unlink_err{err_path};
  KS_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Start(BridgeArgv(python, bridge, args), env, err_path,
                                                              DieWithParent));
  auto line = ReadLine(child.stdout_fd(), opts.timeout_s, 256u << 20);
  auto failure = [&](const std::string& why) {
    std::string how = child.Kill();
    auto text = ReadFile(err_path, 1u << 20);
    return BridgeFailed(file, why + (how.empty() ? "" : ", " + how), text.ok() ? *text : "");
  };
  if (!line.ok()) {
    if (line.status().code() == Code::kDeadlineExceeded)
      return DeadlineExceeded(file + ": the reference bridge timed out after " + std::to_string(int(opts.timeout_s)) + " s");
    return failure(line.status().message());
  }
  json j = json::parse(*line, nullptr, /*allow_exceptions=*/false);
  KS_RETURN_IF_ERROR(BridgeErrorStatus(j, file, opts));
  if (!j.is_object()) return failure("an answer that is not JSON");
  // Not kept on the GPU: the answer is the signature; the bridge has ended or waits for the files' request.
  if (j.contains("resident") && j["resident"].is_boolean() && !j["resident"].get<bool>()) {
    if (waiting) {
      unlink_err.p.clear();  // the waiting bridge removes it
      *waiting = std::make_unique<WaitingBridge>(std::move(child), err_path);
    }
    return std::make_pair(ReferenceData{}, std::move(j));
  }
  const std::string where = file + " (resident reference)";
  KS_ASSIGN_OR_RETURN(ReferenceData d, ReferenceFromManifest(j, where));
  std::vector<std::map<std::string, ResidentTensor>> sets;
  for (const auto& s : j["sets"]) {
    ReferenceSet set;
    set.seed = s.value("seed", uint64_t{0});
    if (!s.contains("ipc") || !s["ipc"].is_object()) return InvalidArgument(where + ": a set has no 'ipc'");
    std::map<std::string, ResidentTensor> tensors;
    for (const auto& [name, loc] : s["ipc"].items()) {
      const TensorSpec* spec = d.signature.Find(name);
      if (!spec || spec->is_scalar) return InvalidArgument(where + ": '" + name + "' is not a tensor of the signature");
      ResidentTensor t;
      auto handle = Base64Decode(loc.value("handle", ""));
      if (!handle.ok()) return handle.status().WithContext(where);
      t.handle = *handle;
      t.offset = loc.value("offset", uint64_t{0});
      t.bytes = loc.value("bytes", uint64_t{0});
      if (static_cast<int64_t>(t.bytes) != spec->bytes() || (t.bytes > 0 && t.handle.size() != 64))
        return InvalidArgument(where + ": '" + name + "' has " + std::to_string(t.bytes) + " bytes, expected " +
                               std::to_string(spec->bytes()));
      tensors[name] = std::move(t);
    }
    KS_RETURN_IF_ERROR(CheckSetComplete(d.signature, tensors, set.seed, where));
    set.transform = s.value("transform", "");
    set.own_parameters = StringList(s, "parameters");
    KS_RETURN_IF_ERROR(CheckOwnParameters(d.signature, set, where));
    d.sets.push_back(std::move(set));
    sets.push_back(std::move(tensors));
  }
  if (d.sets.empty()) return InvalidArgument(where + ": no input sets");
  KS_RETURN_IF_ERROR(CheckTransformOrder(d, where));
  d.resident = std::make_shared<ResidentReference>(std::move(child), std::move(sets));
  return std::make_pair(std::move(d), std::move(j));
}

// The manifest of a resident reference as a cache entry: no tensors (nothing
// is written), the timings and what else the bridge said. A second
// evaluation of the problem reads its timings instead of timing again.
Status WriteTimingEntry(const fs::path& cache, const fs::path& final_dir, const std::string& stem, json manifest) {
  for (auto& s : manifest["sets"]) {
    s.erase("ipc");
    s["files"] = json::object();
  }
  manifest["resident"] = true;
  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = cache / (".tmp-" + stem + "-" + std::to_string(getpid()) + "-t" + std::to_string(counter++));
  std::error_code ec;
  fs::create_directories(tmp, ec);
  if (ec) return PosixError(tmp.string(), ec.value());
  KS_RETURN_IF_ERROR(WriteFile((tmp / "manifest.json").string(), manifest.dump(1)));
  fs::remove_all(final_dir, ec);
  if (rename(tmp.c_str(), final_dir.c_str()) != 0) {
    int err = errno;
    fs::remove_all(tmp, ec);
    return PosixError("renaming " + tmp.string() + " to " + final_dir.string(), err);
  }
  return Status::Ok();
}

}  // namespace

namespace {
StatusOr<ReferenceData> PrepareOneReference(const std::string& file, const ReferenceOptions& opts);

// The shapes of a variant's inputs, for messages: "x [7, 1000], w [3]".
std::string InputShapes(const Signature& sig) {
  std::string out;
  for (const auto& t : sig.inputs) {
    if (t.is_scalar) continue;
    out += (out.empty() ? "" : ", ") + t.name + " [";
    for (size_t i = 0; i < t.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(t.shape[i]);
    out += "]";
  }
  return out;
}
}  // namespace

std::string ShapeVariantName(const ReferenceData& variant) { return "at " + InputShapes(variant.signature); }

StatusOr<ReferenceData> PrepareReference(const std::string& file, const ReferenceOptions& opts) {
  KS_ASSIGN_OR_RETURN(ReferenceData d, PrepareOneReference(file, opts));
  if (opts.shape_variant >= 0) return d;
  for (int i = 0; i < d.shape_variant_count; ++i) {
    ReferenceOptions vo = opts;
    vo.shape_variant = i;
    vo.sets = 2;       // correctness only: two sets tell a kernel that ignores its inputs
    vo.time = false;   // never timed at other shapes
    const std::string which = file + ": get_inputs_variants()[" + std::to_string(i) + "]";
    auto v = PrepareOneReference(file, vo);
    if (!v.ok()) return v.status().WithContext(which);
    // The same inputs, parameters and outputs by name and dtype; only shapes may differ.
    auto same = [](const std::vector<TensorSpec>& a, const std::vector<TensorSpec>& b) {
      if (a.size() != b.size()) return false;
      for (size_t k = 0; k < a.size(); ++k)
        if (a[k].name != b[k].name || a[k].dtype != b[k].dtype || a[k].is_scalar != b[k].is_scalar) return false;
      return true;
    };
    if (!same(v->signature.inputs, d.signature.inputs) || !same(v->signature.outputs, d.signature.outputs))
      return InvalidArgument(which + " has other inputs or outputs (names, dtypes) than get_inputs(); only shapes "
                             "may differ");
    for (size_t k = 0; k < d.signature.parameters.size(); ++k)
      if (v->signature.parameters[k].shape != d.signature.parameters[k].shape)
        return InvalidArgument(which + ": the parameters' shapes change with the inputs; only inputs may");
    d.shape_variants.push_back(std::move(v).value());
  }
  return d;
}

namespace {
StatusOr<ReferenceData> PrepareOneReference(const std::string& file, const ReferenceOptions& opts) {
  const auto started = std::chrono::steady_clock::now();
  if (opts.sets < 1) return InvalidArgument("the number of input sets must be at least 1");
  if (opts.device != "auto" && opts.device != "cuda" && opts.device != "cpu")
    return InvalidArgument("device must be auto, cuda or cpu, not '" + opts.device + "'");
  KS_ASSIGN_OR_RETURN(std::string problem_bytes, ReadFile(file));
  // The interpreter and the key's facts. With the device named, the quick
  // probe (no torch import) is enough; "auto" asks torch itself whether it
  // can use the GPU (a driver too old for its CUDA says no only there).
  PythonInfo py;
  std::optional<PythonInfo> quick;
  if (opts.device != "auto") {
    if (auto python = BridgeInterpreter(opts.bridge.python); python.ok())
      if (auto q = QuickProbe(*python); q.ok()) quick = *q;
  }
  if (quick) {
    py = *quick;
  } else {
    KS_ASSIGN_OR_RETURN(py, ResolvePython(opts.bridge.python));
  }
  KS_ASSIGN_OR_RETURN(std::string bridge_path, FindDataFile("reference/bridge.py"));
  KS_ASSIGN_OR_RETURN(std::string bridge_bytes, ReadFile(bridge_path));
  // timing.py is part of the method whose results are cached.
  KS_ASSIGN_OR_RETURN(std::string timing_path, FindDataFile("reference/timing.py"));
  KS_ASSIGN_OR_RETURN(std::string timing_bytes, ReadFile(timing_path));
  // So is transforms.py: the distribution-shifted sets are part of the entry.
  KS_ASSIGN_OR_RETURN(std::string transforms_path, FindDataFile("reference/transforms.py"));
  KS_ASSIGN_OR_RETURN(std::string transforms_bytes, ReadFile(transforms_path));

  if (opts.device == "cuda" && !py.cuda)
    return FailedPrecondition("--device cuda: torch " + py.torch_version + " in " + py.python + " sees no CUDA device");
  const bool on_cuda = opts.device == "cuda" || (opts.device == "auto" && py.cuda);
  // The GPU model is part of the key: reference outputs (TF32, algorithm
  // choices) and timings differ between devices.
  const std::string device_kind = on_cuda ? "cuda:" + py.device : "cpu";

  auto key_for = [&](bool timed, const std::string& kind = "") {
    std::string key = "kernelsearch-reference-v1\n";
    if (!kind.empty()) AddKeyField(key, "kind", kind);
    AddKeyField(key, "problem", problem_bytes);
    AddKeyField(key, "sets", std::to_string(opts.sets));
    AddKeyField(key, "seed", std::to_string(opts.seed));
    AddKeyField(key, "device", device_kind);
    AddKeyField(key, "bridge", bridge_bytes);
    AddKeyField(key, "timing", timing_bytes);
    AddKeyField(key, "transforms", transforms_bytes);
    AddKeyField(key, "torch", py.torch_version);
    AddKeyField(key, "timed", timed && on_cuda ? "1" : "0");
    if (opts.shape_variant >= 0) AddKeyField(key, "shape variant", std::to_string(opts.shape_variant));
    return Sha256Hex(key).substr(0, 32);
  };
  const std::string stem = fs::path(file).stem().string();
  const fs::path cache = opts.cache_dir.empty() ? fs::path(DefaultReferenceCacheDir()) : fs::path(opts.cache_dir);
  const fs::path final_dir = cache / (stem + "-" + key_for(opts.time));

  // Entries come from the cache with the file path of whoever made them; report this caller's.
  auto adopt = [&](ReferenceData d) {
    d.signature.file = file;
    d.sets_requested = opts.sets;
    return d;
  };
  std::error_code ec;
  if (!opts.refresh) {
    std::vector<fs::path> usable = {final_dir};
    if (!opts.time) usable.push_back(cache / (stem + "-" + key_for(true)));
    for (const auto& dir : usable) {
      if (!fs::exists(dir / "manifest.json", ec)) continue;
      auto d = LoadReferenceDir(dir.string());
      if (d.ok()) {
        d->from_cache = true;
        d->phases = {{"cache lookup", Since(started)}};
        TouchCacheEntry(dir.string());
        return adopt(std::move(d).value());
      }
      // A damaged entry (truncated file, edited manifest) is recomputed, not trusted.
      fs::remove_all(dir, ec);
    }
  }
  // A final directory without a manifest is not an entry (someone removed the
  // manifest by hand); it would only make the rename below fail.
  if (fs::exists(final_dir, ec) && !fs::exists(final_dir / "manifest.json", ec)) fs::remove_all(final_dir, ec);

  fs::create_directories(cache, ec);
  if (ec) return PosixError(cache.string(), ec.value());

  // How many sets fit, from the sizes alone (shape inference: seconds, nothing computed).
  uint64_t cap = opts.cache_cap;
  if (cap == 0) {
    KS_ASSIGN_OR_RETURN(cap, DefaultCacheCap());
  }
  auto mark = std::chrono::steady_clock::now();
  // One bridge process infers the sizes (shape inference, nothing computed)
  // and then either keeps the reference on the GPU (a problem of
  // min_bytes or more, on a GPU) or, once this process has sized the cache
  // entry and made room for it, writes it to files: one torch import.
  const uint64_t min_bytes = ResidentMinBytes(opts);
  const bool may_stay = on_cuda && min_bytes != UINT64_MAX;
  // A resident reference caches only its timings; a second evaluation reads them.
  const fs::path timing_dir = cache / (stem + "-" + key_for(true, "resident timing"));
  std::optional<json> cached;
  if (may_stay && opts.time && !opts.refresh) {
    if (auto text = ReadFile((timing_dir / "manifest.json").string(), 64u << 20); text.ok()) {
      json t = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (ManifestHasTiming(t)) cached = t;
    }
  }
  std::vector<std::string> args = {"reference", file, "--then-files", "--sets", std::to_string(opts.sets),
                                   "--seed", std::to_string(opts.seed), "--device", on_cuda ? "cuda" : "cpu"};
  if (opts.shape_variant >= 0) {
    // Another shape: its own reference, without distribution-shifted sets.
    for (const std::string& a : {std::string("--variant"), std::to_string(opts.shape_variant),
                                 std::string("--transform-sets"), std::string("0")})
      args.push_back(a);
  }
  if (may_stay) {
    // Kept with the sets that fit the device budget (fewer than 2: ResourceExhausted naming the figures).
    for (const std::string& a : {std::string("--resident"), std::string("--resident-min-bytes"),
                                 std::to_string(min_bytes), std::string("--device-budget"),
                                 std::to_string(opts.device_budget)})
      args.push_back(a);
    if (opts.time && !cached) args.push_back("--time");
  } else if (opts.time && on_cuda) {
    args.push_back("--time");  // timing to come: the bridge starts torch.compile's warm-up at once
  }
  std::unique_ptr<WaitingBridge> waiting;
  KS_ASSIGN_OR_RETURN(auto made, StartBridge(file, args, opts.bridge, &waiting));
  const double signature_s = Since(mark);
  if (made.first.resident) {
    ReferenceData d = std::move(made.first);
    d.phases.insert(d.phases.begin(),
                    {"bridge process until the reference is on the GPU (phases below; sizes by shape inference)",
                     signature_s});
    if (cached) {
      auto from = ReferenceFromManifest(*cached, timing_dir.string());
      if (from.ok()) {
        d.eager = from->eager;
        d.compiled = from->compiled;
        d.eager_fp32 = from->eager_fp32;
        d.phases.emplace_back("eager and torch.compile timing: from the cache", 0);
        TouchCacheEntry(timing_dir.string());
      }
    } else if (opts.time && d.eager) {
      // Only the manifest (kilobytes) is cached; a failure to cache costs a re-timing later, nothing else.
      std::vector<std::string> evicted;
      if (MakeRoom(cache.string(), 1 << 20, cap, "", &evicted).ok() &&
          WriteTimingEntry(cache, timing_dir, stem, std::move(made.second)).ok())
        d.evicted = std::move(evicted);
    }
    return adopt(std::move(d));
  }
  if (!waiting) return Internal(file + ": the reference bridge ended after the signature");
  auto parsed = SignatureFromJson(made.second["signature"]);
  if (!parsed.ok()) return Internal(file + ": the reference bridge returned a bad signature: " + parsed.status().message());
  const Signature& sig = *parsed;
  KS_ASSIGN_OR_RETURN(uint64_t free_disk, FreeDiskBytes(cache.string()));
  KS_ASSIGN_OR_RETURN(CacheUsage usage, ReadCacheUsage(cache.string()));
  const SetFit plain = FitSets(sig, opts.sets, cap, free_disk + usage.entry_bytes, opts.device_budget);
  if (plain.sets < std::min(opts.sets, 2)) return ResourceExhausted(file + ": " + plain.why);
  // The distribution-shifted sets (transforms.py) share the room: where it is
  // short, judging sets beyond two make way for them (a problem at KernelBench's
  // sizes otherwise keeps none, and those are the problems users export).
  const int shifted_max = opts.shape_variant >= 0 ? 0 : kTransformSets;  // none at another shape
  const SetFit all =
      FitSets(sig, opts.sets + shifted_max, cap, free_disk + usage.entry_bytes, opts.device_budget, shifted_max);
  SetFit fit = plain;
  fit.sets = std::min(opts.sets, std::max(std::min(opts.sets, 2), all.sets - shifted_max));
  const int transform_room = std::clamp(all.sets - fit.sets, 0, shifted_max);
  fit.disk_bytes = std::max(plain.disk_bytes, all.disk_bytes);
  std::vector<std::string> warnings;
  if (fit.sets < opts.sets)
    warnings.push_back("using " + std::to_string(fit.sets) + " of the " + std::to_string(opts.sets) +
                       " input sets asked for" +
                       (fit.sets < plain.sets ? " (and " + std::to_string(transform_room) +
                                                    " distribution-shifted set(s) in the room of the others)"
                                              : std::string()) +
                       ": " + (plain.why.empty() ? all.why : plain.why));
  std::vector<std::string> evicted;
  KS_RETURN_IF_ERROR(MakeRoom(cache.string(), fit.disk_bytes, cap, "", &evicted).WithContext(file));

  static std::atomic<uint64_t> counter{0};
  const fs::path tmp = cache / (".tmp-" + stem + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  ScopedDirRemover remove_tmp(tmp);
  mark = std::chrono::steady_clock::now();
  KS_ASSIGN_OR_RETURN(json manifest,
                      waiting->WriteFiles(file, json{{"out", tmp.string()}, {"sets", fit.sets}, {"time", opts.time},
                                                     {"transform_sets", transform_room}},
                                          opts.bridge));
  const double bridge_s = Since(mark);
  (void)manifest;  // read back from disk below, the same way a cache hit is

  if (opts.refresh) fs::remove_all(final_dir, ec);
  if (rename(tmp.c_str(), final_dir.c_str()) != 0) {
    int err = errno;
    // Another process finished the same entry first; its result is as good as ours.
    if (!((err == ENOTEMPTY || err == EEXIST) && fs::exists(final_dir / "manifest.json", ec)))
      return PosixError("renaming " + tmp.string() + " to " + final_dir.string(), err);
  } else {
    remove_tmp.Release();
  }
  KS_ASSIGN_OR_RETURN(ReferenceData d, LoadReferenceDir(final_dir.string()));
  d.warnings.insert(d.warnings.begin(), warnings.begin(), warnings.end());
  d.evicted = std::move(evicted);
  d.phases.insert(d.phases.begin(),
                  {{"signature for the sizes (the bridge process: torch import, shape inference)", signature_s},
                   {"the same bridge process after the sizes (phases below)", bridge_s}});
  return adopt(std::move(d));
}

}  // namespace

StatusOr<std::string> ReadTensorFile(const std::string& path, const TensorSpec& spec) {
  if (spec.is_scalar) return InvalidArgument("'" + spec.name + "' is a scalar; it has no tensor file");
  const size_t want = static_cast<size_t>(spec.bytes());
  KS_ASSIGN_OR_RETURN(std::string data, ReadFile(path, want + 1));
  if (data.size() != want)
    return InvalidArgument(path + ": " + std::to_string(data.size()) + " bytes, expected " + std::to_string(want) +
                           " for '" + spec.name + "' (" + DTypeName(spec.dtype) + ")");
  return data;
}

// ---- Measured peaks ----

double DevicePeaks::For(const std::string& compute_class) const {
  auto it = tflops.find(compute_class);
  return it == tflops.end() ? 0 : it->second;
}

std::string ComputeClassFor(const Signature& signature) {
  for (const auto& o : signature.outputs) {
    if (o.is_scalar || !IsFloating(o.dtype)) continue;
    switch (o.dtype) {
      case DType::kFloat32: return "fp32";
      case DType::kFloat16: return "fp16";
      case DType::kBFloat16: return "bf16";
      case DType::kFloat64: return "fp64";
      default: break;
    }
  }
  return "";
}

namespace {

// Bridge output or cache file -> DevicePeaks; every class present must be a
// positive finite number.
StatusOr<DevicePeaks> PeaksFromJson(const json& j, const std::string& what) {
  if (!j.is_object() || !j.contains("tflops") || !j["tflops"].is_object() || j["tflops"].empty())
    return Internal(what + ": no \"tflops\" object");
  DevicePeaks p;
  p.device = j.value("device", "");
  p.torch_version = j.value("torch", "");
  p.n = j.value("n", 0);
  for (const auto& [k, v] : j["tflops"].items()) {
    if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
      return Internal(what + ": tflops." + k + " is not a positive number");
    p.tflops[k] = v.get<double>();
  }
  return p;
}

std::string CacheFileName(const std::string& device_name) {
  std::string out;
  for (char c : device_name) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.') ? c : '_';
  return (out.empty() ? "device" : out) + ".json";
}

}  // namespace

StatusOr<DevicePeaks> MeasureDevicePeaks(const PeaksOptions& opts) {
  if (opts.device_index < 0) return InvalidArgument("the device index must be >= 0");
  const fs::path dir = opts.cache_dir.empty() ? fs::path(DefaultReferenceCacheDir()) / "peaks" : fs::path(opts.cache_dir);
  const std::string key = opts.device_name.empty() ? "cuda" + std::to_string(opts.device_index) : opts.device_name;
  const fs::path file = dir / CacheFileName(key);
  std::error_code ec;
  if (!opts.refresh && fs::exists(file, ec)) {
    auto text = ReadFile(file.string(), 1 << 20);
    if (text.ok()) {
      json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      auto p = PeaksFromJson(j, file.string());
      if (p.ok() && (opts.device_name.empty() || p->device == opts.device_name)) {
        p->from_cache = true;
        return p;
      }
    }
    // Damaged or for another device: measured again below and overwritten.
  }
  KS_ASSIGN_OR_RETURN(json j, RunBridge("peaks", {"peaks", "--index", std::to_string(opts.device_index), "--n",
                                                  std::to_string(opts.n), "--runs", std::to_string(opts.runs)},
                                        opts.bridge));
  KS_ASSIGN_OR_RETURN(DevicePeaks p, PeaksFromJson(j, "bridge.py peaks"));
  if (!opts.device_name.empty() && p.device != opts.device_name)
    return Internal("bridge.py peaks measured CUDA device " + std::to_string(opts.device_index) + " as '" + p.device +
                    "', but the driver calls it '" + opts.device_name +
                    "' (do torch and the driver number devices differently? check CUDA_DEVICE_ORDER)");
  fs::create_directories(dir, ec);
  if (ec) return PosixError(dir.string(), ec.value());
  KS_RETURN_IF_ERROR(WriteFile(file.string(), j.dump(1) + "\n"));
  return p;
}

}  // namespace ks
