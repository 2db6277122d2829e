// Running the reference bridge (bridge.py) and reading its answers: a run to
// its end (signature, check, peaks), a bridge that waits to write a
// reference's files, and one that keeps a resident reference on the GPU.
#include <sys/prctl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/files.h"
#include "common/subprocess.h"
#include "evaluator/reference/bridge_internal.h"
#include "evaluator/problem.h"

namespace ks {
using nlohmann::json;
using namespace bridge_internal;

namespace {

// Maps the bridge's error kinds to status codes: problem defects are the user's
// input (InvalidArgument); a missing torch or GPU is the environment.
Code CodeForKind(const std::string& kind) {
  if (kind == "no_torch" || kind == "device_error") return Code::kFailedPrecondition;
  if (kind == "out_of_memory" || kind == "disk_full") return Code::kResourceExhausted;
  if (kind == "internal") return Code::kInternal;
  return Code::kInvalidArgument;
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

// A kept bridge outlives its caller (ks_bridge/keeper.py ends it): it runs as
// the caller's grandchild in a session of its own, so that no signal to the
// caller's process group reaches it and nobody need reap it. Async-signal-safe.
int DetachFromParent() {
  pid_t p = fork();
  if (p < 0) return 126;
  if (p > 0) _exit(0);
  return setsid() < 0 ? 126 : 0;
}

}  // namespace

namespace bridge_internal {

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

WaitingBridge::~WaitingBridge() {
  if (child_.running()) {
    child_.CloseStdin();
    for (int i = 0; i < 25 && !child_.TryReap(); ++i) usleep(20 * 1000);
    if (child_.running()) child_.Kill();
  }
  unlink(err_path_.c_str());
}

StatusOr<json> WaitingBridge::WriteFiles(const std::string& file, const json& request, const BridgeOptions& opts) {
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

StatusOr<ResidentManifest> ParseResidentManifest(const json& j, const std::string& where) {
  KS_ASSIGN_OR_RETURN(ReferenceData d, ReferenceFromManifest(j, where));
  ResidentManifest m;
  for (const auto& s : j["sets"]) {
    ReferenceSet set;
    set.seed = s.value("seed", uint64_t{0});
    if (!s.contains("ipc") || !s["ipc"].is_object()) return InvalidArgument(where + ": a set has no 'ipc'");
    std::map<std::string, ResidentTensor> tensors;
    std::map<std::string, ResidentTensor> bounds;  // out@level: not part of CheckSetComplete
    for (const auto& [name, loc] : s["ipc"].items()) {
      auto key = SetTensorKey(d.signature, name);
      if (!key.ok()) return key.status().WithContext(where);
      ResidentTensor t;
      auto handle = Base64Decode(loc.value("handle", ""));
      if (!handle.ok()) return handle.status().WithContext(where);
      t.handle = *handle;
      t.offset = loc.value("offset", uint64_t{0});
      t.bytes = loc.value("bytes", uint64_t{0});
      if (static_cast<int64_t>(t.bytes) != key->second || (t.bytes > 0 && t.handle.size() != 64))
        return InvalidArgument(where + ": '" + name + "' has " + std::to_string(t.bytes) + " bytes, expected " +
                               std::to_string(key->second));
      (name.find('@') == std::string::npos ? tensors : bounds)[name] = std::move(t);
    }
    KS_RETURN_IF_ERROR(CheckSetComplete(d.signature, tensors, set.seed, where));
    tensors.merge(bounds);
    KS_RETURN_IF_ERROR(ReadSetFacts(s, d.signature, where, &set));
    d.sets.push_back(std::move(set));
    m.tensors.push_back(std::move(tensors));
  }
  if (d.sets.empty()) return InvalidArgument(where + ": no input sets");
  KS_RETURN_IF_ERROR(CheckTransformOrder(d, where));
  m.pci_bus_id = j.value("pci_bus_id", "");
  m.data = std::move(d);
  return m;
}

KeptInfo KeptInfoFromManifest(const json& j) {
  KeptInfo k;
  const json kept = j.value("kept", json::object());
  k.pid = j.value("pid", 0);
  if (kept.is_object()) {
    k.socket = kept.value("socket", "");
    k.declined = kept.value("declined", "");
    k.keep_s = kept.value("keep_s", 0.0);
    k.gpu_bytes = kept.value("gpu_bytes", uint64_t{0});
  }
  return k;
}

StatusOr<std::pair<ReferenceData, json>> StartBridge(const std::string& file, const std::vector<std::string>& args,
                                                     const BridgeOptions& opts,
                                                     std::unique_ptr<WaitingBridge>* waiting,
                                                     const std::string& kept_log) {
  KS_ASSIGN_OR_RETURN(std::string python, BridgeInterpreter(opts.python));
  KS_ASSIGN_OR_RETURN(std::string bridge, FindDataFile("reference/bridge.py"));
  auto env = PythonEnv();
  // Expandable segments are mapped memory without an IPC handle.
  env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False";
  const bool keep = !kept_log.empty();
  std::string err_path = kept_log;  // a kept bridge's log outlives this command
  if (!keep) {
    char tmpl[] = "/tmp/ks-bridge-XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd < 0) return PosixError("creating a file for the bridge's messages", errno);
    close(fd);
    err_path = tmpl;
  }
  struct Unlink {
    std::string p;
    ~Unlink() { if (!p.empty()) unlink(p.c_str()); }
  } unlink_err{keep ? "" : err_path};
  KS_ASSIGN_OR_RETURN(ChildProcess child, ChildProcess::Start(BridgeArgv(python, bridge, args), env, err_path,
                                                              keep ? DetachFromParent : DieWithParent));
  auto line = ReadLine(child.stdout_fd(), opts.timeout_s, 256u << 20);
  auto failure = [&](const std::string& why) {
    std::string how = keep ? "" : child.Kill();  // a kept bridge ends itself once its stdin closes
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
  KS_ASSIGN_OR_RETURN(ResidentManifest m, ParseResidentManifest(j, where));
  if (keep) {
    // The bridge is our grandchild (DetachFromParent): the child between
    // exited at once. Our lease is its stdin.
    for (int i = 0; i < 100 && child.running() && !child.TryReap(); ++i) usleep(10 * 1000);
    UniqueFd lease = child.TakeStdin();
    m.data.resident = std::make_shared<ResidentReference>(std::move(lease), KeptInfoFromManifest(j),
                                                          std::move(m.tensors), m.pci_bus_id);
  } else {
    m.data.resident = std::make_shared<ResidentReference>(std::move(child), std::move(m.tensors), m.pci_bus_id);
  }
  return std::make_pair(std::move(m.data), std::move(j));
}

}  // namespace bridge_internal

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

// ---- Resident references ----

ResidentReference::~ResidentReference() {
  lease_.reset();  // a kept bridge: our lease ends, it waits for the next command
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

bool ResidentReference::Alive() {
  if (lease_.valid()) return kept_->pid > 0 && kill(kept_->pid, 0) == 0;
  return bridge_.running() && !bridge_.TryReap();
}

}  // namespace ks
