// Internal to the problem module (problem.h), shared by its files, one per
// concern: python_env.cc (finding python with torch, data files),
// bridge_client.cc (running bridge.py and reading its answers, resident
// references), problem.cc (reference data and manifests), reference_prep.cc
// (preparing a reference and its cache entry) and peaks.cc (measured peaks).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/subprocess.h"
#include "evaluator/problem.h"

namespace ks::bridge_internal {

// $name, or "" when unset.
std::string Env(const char* name);

// The last `max_lines` lines of `text`, at most `max_chars` characters.
std::string Tail(const std::string& text, size_t max_lines = 15, size_t max_chars = 2000);
std::string LastLine(const std::string& text);

// Child environment for every python run: no .pyc files written into the
// source tree or an installed share/ directory.
std::map<std::string, std::string> PythonEnv();

// The interpreter that runs the bridge, in ResolvePython's order, without the
// full probe (which imports torch): the first whose torch can be found.
StatusOr<std::string> BridgeInterpreter(const std::string& explicit_python);

// probe.py --quick: torch's version and device 0's name without importing
// torch. Cached per interpreter; NotFound when that python has no torch.
StatusOr<PythonInfo> QuickProbe(const std::string& python);

// One line from fd (a bridge's JSON answer), waiting at most timeout_s; an
// error past max_bytes.
StatusOr<std::string> ReadLine(int fd, double timeout_s, size_t max_bytes);

// Runs `bridge.py ARGS...` to its end and returns its JSON answer; the
// bridge's {"error": ...} becomes a Status with the code its kind names.
StatusOr<nlohmann::json> RunBridge(const std::string& file, std::vector<std::string> args, const BridgeOptions& opts);

// A bridge process started with `bridge.py reference ... --then-files` that
// answered {"resident": false, "signature": ...} and waits for the request to
// write the reference's files (one python start for the signature and the
// reference). Ends the bridge (closing its stdin, then SIGKILL) and removes
// its stderr file when it goes out of scope.
class WaitingBridge {
 public:
  WaitingBridge(ChildProcess child, std::string err_path) : child_(std::move(child)), err_path_(std::move(err_path)) {}
  ~WaitingBridge();
  WaitingBridge(const WaitingBridge&) = delete;
  WaitingBridge& operator=(const WaitingBridge&) = delete;

  // Sends the request, waits for the manifest (at most timeout_s) and for the
  // bridge to exit.
  StatusOr<nlohmann::json> WriteFiles(const std::string& file, const nlohmann::json& request,
                                      const BridgeOptions& opts);

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
// `kept_log` non-empty: args ask the bridge to stay (--keep): it is started
// detached from this process, its messages go to kept_log, and the resident
// reference holds a lease on it (its stdin) instead of the process.
StatusOr<std::pair<ReferenceData, nlohmann::json>> StartBridge(const std::string& file,
                                                               const std::vector<std::string>& args,
                                                               const BridgeOptions& opts,
                                                               std::unique_ptr<WaitingBridge>* waiting,
                                                               const std::string& kept_log = "");

// A resident reference's manifest (a bridge's answer, or a kept bridge's
// answer to a lease): the data without `resident`, each set's tensors by IPC
// handle, and the bus id of the GPU they live on.
struct ResidentManifest {
  ReferenceData data;
  std::vector<std::map<std::string, ResidentTensor>> tensors;
  std::string pci_bus_id;
};
StatusOr<ResidentManifest> ParseResidentManifest(const nlohmann::json& j, const std::string& where);

// A kept bridge's manifest entries ("pid", and "kept": socket, keep_s,
// gpu_bytes, or declined).
KeptInfo KeptInfoFromManifest(const nlohmann::json& j);

// The parts of a manifest (written by the bridge) common to both kinds of
// reference: the signature, device, timings, warnings, phases and scalars.
// `where` names it in errors.
StatusOr<ReferenceData> ReferenceFromManifest(const nlohmann::json& j, const std::string& where);

// A set's "transform" (transforms.py); the get_inputs() sets must all come
// first, and a transform's set must say it is that transform's.
Status CheckTransformOrder(const ReferenceData& d, const std::string& where);

// A JSON array of strings under `key` (anything else: empty).
std::vector<std::string> StringList(const nlohmann::json& j, const char* key);

// A set's own parameters must be parameters of the signature, each once, and
// only a shifted set has them: the judging sets share one copy.
Status CheckOwnParameters(const Signature& sig, const ReferenceSet& set, const std::string& where);
// A set's tensor key: a tensor of the signature, or an output's bound array
// ("out@highest", judge.h BoundKey). Its spec, and the bytes it must have; or why not.
StatusOr<std::pair<const TensorSpec*, int64_t>> SetTensorKey(const Signature& sig, const std::string& key);
// The float64 truth of a set and PyTorch's own error there (issue 36), from
// the manifest's set entry: truth, truth_note, pytorch_error.
void ReadSetJudging(const nlohmann::json& s, ReferenceSet* set);
// What every manifest's set entry says beyond its tensors (files or IPC
// handles): ReadSetJudging's, its transform, whether it is a practice set and
// its own parameters (checked against the signature).
Status ReadSetFacts(const nlohmann::json& s, const Signature& sig, const std::string& where, ReferenceSet* set);

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

// The level eager and torch.compile are timed under (bridge.py reference
// --precision): "high" or "medium" where ReferenceOptions::precision is that
// contract (or an alias of it), "" for PyTorch's defaults (highest, kernelbench).
std::string TimingLevel(const ReferenceOptions& opts);

// What a reference cache entry's key is made of (reference_prep.cc): the
// problem, the method (the bridge and the modules whose results it caches),
// torch and the device.
struct KeyFacts {
  std::string problem_bytes;
  std::string bridge_bytes;
  std::string timing_bytes;
  std::string transforms_bytes;
  PythonInfo py;
  bool on_cuda = false;
  std::string device_kind;  // "cuda:<GPU model>" or "cpu"
};

// The hash in an entry's directory name; `kind` tells apart entries that are
// not a reference (a resident reference's timings). TimingLevel is part of it
// only where it changes the entry: timed on a GPU under high or medium (the
// keys of highest and kernelbench, and every untimed one, are as before).
std::string KeyHash(const KeyFacts& k, const ReferenceOptions& opts, bool timed, const std::string& kind = "");

// bridge.py reference's arguments: the sets, and what the bridge may do after
// the sizes (keep the reference on the GPU, time it, and under which level).
// `cached_manifest`: a resident reference's cached manifest ("" = none): its
// timings are used (no --time) and its signature too (--signature-from: no
// shape inference, no FLOP count, seconds of torch imports saved).
// `kept_socket`: with opts.keep_s, where the bridge is to stay (--keep).
std::vector<std::string> ReferenceArgs(const std::string& file, const ReferenceOptions& opts, bool on_cuda,
                                       uint64_t min_bytes, bool may_stay, const std::string& cached_manifest,
                                       const std::string& kept_socket = "");

}  // namespace ks::bridge_internal
