// Problems (DESIGN.md, contract 1) as the C++ side sees them: the reference
// bridge (evaluator/reference/bridge.py, run with a python3 that has torch) is
// the only code that executes a problem file; this module finds that python and
// that script, runs it as a subprocess, and turns its JSON into a Signature or a
// ReferenceData (reference inputs/parameters/outputs on disk, cached, or kept
// on the GPU by a bridge process for a problem of several GB).
//
// Its files, one per concern: python_env.cc (the interpreter, data files),
// bridge_client.cc (running the bridge, resident references), problem.cc
// (reference data and manifests), reference_prep.cc (PrepareReference and its
// cache entry), peaks.cc (measured peaks); bridge_internal.h is what they share.
//
// Thread-safety: every function may be called from several threads; the python
// probe is cached per process behind a mutex. Concurrent PrepareReference calls
// for the same key (threads or processes) each compute into a private temporary
// directory; the first to rename it into place wins and the others use it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/subprocess.h"
#include "evaluator/evaluation.h"
#include "evaluator/judge/judge.h"
#include "evaluator/signature.h"

namespace ks {

// ---- Bundled data files --------------------------------------------------------

// Finds a bundled data file by its path relative to the data directory
// ("reference/bridge.py", "prompts/ideas.txt", "problems/softmax.py"). Tried in
// order: $KS_DATA_DIR/<rel>; <exe dir>/../share/kernelsearch/<rel> (installed);
// KS_SOURCE_DIR/<rel in the source tree>, where "reference/..." lives under
// "evaluator/reference/...". NotFound lists every path tried.
StatusOr<std::string> FindDataFile(const std::string& relative);

// ---- Python with torch ---------------------------------------------------------

struct PythonInfo {
  std::string python;         // the interpreter, as it will be run
  std::string torch_version;  // torch.__version__
  bool cuda = false;          // torch.cuda.is_available()
  std::string device;         // torch.cuda.get_device_name(0), or "cpu"
};

// Resolves the interpreter: `explicit_python` (a --python flag) > $KS_PYTHON >
// the first of python3 on PATH and /usr/bin/python3 that can import torch. The
// answer for each candidate is probed once per process (a subprocess that
// imports torch) and cached. FailedPrecondition when none imports torch.
StatusOr<PythonInfo> ResolvePython(const std::string& explicit_python = "");

// ---- The bridge -----------------------------------------------------------------

struct BridgeOptions {
  std::string python;      // explicit interpreter; "" = ResolvePython's order
  double timeout_s = 600;  // per bridge run; KernelBench-size problems on CPU are slow
  bool verbose = false;    // append the bridge's traceback tail to error messages
};

// Loads a problem's signature. A defective problem file (syntax error, no
// Model, get_inputs or forward raising, bad output, unsupported dtype, missing
// file) is InvalidArgument whose message names the file and the cause.
StatusOr<Signature> LoadProblemSignature(const std::string& file, const BridgeOptions& opts = {});

// Warnings about outputs that would let a wrong kernel pass (all zeros,
// constant, identical across input sets, NaN/Inf), from `bridge.py check`
// (two input sets on `device`: "auto", "cuda" or "cpu"). Empty when none.
// `notes`, when given, receives what is not a refusal but weakens the test:
// outputs mostly within atol of zero (with the share), almost constant outputs.
StatusOr<std::vector<std::string>> CheckProblem(const std::string& file, const BridgeOptions& opts = {},
                                                const std::string& device = "auto", uint64_t seed = 42,
                                                std::vector<std::string>* notes = nullptr);

// ---- Reference data ---------------------------------------------------------------

struct ReferenceOptions {
  BridgeOptions bridge;
  int sets = 3;                 // input sets; set i uses seed + 1 + i, the model uses seed
  uint64_t seed = 42;
  std::string device = "auto";  // "auto" (cuda when torch sees one), "cuda" or "cpu"
  bool time = false;            // also time eager and torch.compile (CUDA only)
  std::string cache_dir;        // "" = DefaultReferenceCacheDir()
  uint64_t cache_cap = 0;       // bytes the cache may hold; 0 = DefaultCacheCap() ($KS_CACHE_CAP or 20 GiB)
  bool refresh = false;         // recompute even when a complete entry exists
  // Device memory the evaluator may fill with the input sets, their pristine
  // copies and the reference outputs (the caller measures it; 0 = no limit).
  // With the cache cap, it bounds the sets actually prepared (at least 2).
  uint64_t device_budget = 0;
  // Where the reference lives on a GPU (device cuda):
  //  - files (the bounded disk cache above) for small problems;
  //  - resident, for problems whose sets hold at least resident_min_bytes:
  //    the bridge computes on the GPU and keeps inputs, parameters and outputs
  //    there, and the evaluator maps them (CUDA IPC). Nothing multi-GB is
  //    written; only the manifest with the timings is cached (a second
  //    evaluation skips timing eager and torch.compile).
  // The default is $KS_RESIDENT_MIN_BYTES, else 1 GiB; 0 = always resident
  // on a GPU; UINT64_MAX = never.
  std::optional<uint64_t> resident_min_bytes;
  // Seconds a resident reference stays on the GPU after this command, for the
  // next command of the same problem and options to lease instead of
  // computing it again (`--keep-reference`, evaluator/reference/kept_reference.h);
  // 0 = it ends with this command. A kept reference is leased here when one is
  // alive (refresh asks it to stop and computes a new one).
  double keep_s = 0;
  // Other shapes (issue 27): >= 0 prepares the reference of the problem's
  // get_inputs_variants()[shape_variant] instead of get_inputs() (no
  // distribution-shifted sets). -1, the default, prepares get_inputs()'s and
  // then one reference per variant the problem declares (ReferenceData::shape_variants).
  int shape_variant = -1;
  // An agent's practice sets (search/agent.h): practice_sets more get_inputs()
  // sets after the judging ones, from seeds practice_seed + 1, ... (never
  // judged: ReferenceSet::practice). Always kept; where the device or the
  // cache is short, judging sets beyond two and shifted sets make way.
  int practice_sets = 0;
  uint64_t practice_seed = 0;
  // The precision contract judged under (judge.h names; an alias is taken as
  // its canonical name). Under "high" and "medium" eager and torch.compile are
  // timed with torch.set_float32_matmul_precision(that) and cuDNN TF32 on
  // (bridge.py reference --precision), a cache entry of their own; under
  // "highest" and "kernelbench" at PyTorch's defaults.
  std::string precision = "highest";
};

// A tensor of a resident reference: where it lives in the bridge process's
// device memory (the CUDA IPC handle of its allocation, base64, and its offset).
struct ResidentTensor {
  std::string handle;  // 64 raw bytes of a CUipcMemHandle; empty when bytes == 0
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// A kept resident reference (ReferenceOptions::keep_s, `--keep-reference`):
// the bridge outlives the command and later commands lease it
// (evaluator/reference/kept_reference.h).
struct KeptInfo {
  pid_t pid = 0;          // the bridge's
  std::string socket;     // where it is served; "" when it is not kept (see declined)
  std::string declined;   // why it does not stay: another bridge serves this reference
  double keep_s = 0;      // it exits this long after its last lease ends
  uint64_t gpu_bytes = 0; // GPU memory it holds (torch's reserved bytes)
  bool leased = false;    // this command leased it from a bridge an earlier one started
};

// The bridge process holding a resident reference (bridge.py reference
// --resident). It holds the tensors until this object dies (closing its stdin
// ends it; it is killed if it does not). A kept bridge (KeptInfo) is not ours
// to end: this object holds a lease (its stdin, or a connection to its
// socket), and ending the lease leaves the bridge waiting for the next
// command. Shared by every copy of the ReferenceData that names it; whoever
// maps its tensors must unmap them first.
class ResidentReference {
 public:
  ResidentReference(ChildProcess bridge, std::vector<std::map<std::string, ResidentTensor>> sets,
                    std::string pci_bus_id = "")
      : bridge_(std::move(bridge)), sets_(std::move(sets)), pci_bus_id_(std::move(pci_bus_id)) {}
  ResidentReference(UniqueFd lease, KeptInfo kept, std::vector<std::map<std::string, ResidentTensor>> sets,
                    std::string pci_bus_id)
      : lease_(std::move(lease)), kept_(std::move(kept)), sets_(std::move(sets)), pci_bus_id_(std::move(pci_bus_id)) {}
  ~ResidentReference();
  ResidentReference(const ResidentReference&) = delete;
  ResidentReference& operator=(const ResidentReference&) = delete;

  // Tensor `name` of input set `set` (parameters are named in every set).
  StatusOr<ResidentTensor> At(int set, const std::string& name) const;
  // Whether the bridge still runs (it must, while its tensors are mapped).
  bool Alive();
  pid_t pid() const { return lease_.valid() ? kept_->pid : bridge_.pid(); }
  // The PCI bus id of the GPU holding the tensors ("" when the bridge did not
  // say). Device ordinals differ between processes; bus ids do not.
  const std::string& pci_bus_id() const { return pci_bus_id_; }
  // Set for a bridge started with keep_s (pid, socket or why it declined).
  const std::optional<KeptInfo>& kept() const { return kept_; }

 private:
  ChildProcess bridge_;
  UniqueFd lease_;  // a kept bridge: our lease on it
  std::optional<KeptInfo> kept_;
  std::vector<std::map<std::string, ResidentTensor>> sets_;
  std::string pci_bus_id_;
};

// One input set: every tensor's name (inputs, parameters, outputs) -> absolute
// path of its raw little-endian contiguous bytes.
struct ReferenceSet {
  uint64_t seed = 0;
  std::map<std::string, std::string> files;
  // "" for a get_inputs() set; else the distribution shift its inputs had
  // (evaluator/reference/transforms.py: "scale_up", "scale_down",
  // "sign_flip", "outliers"). These sets come after every get_inputs() set.
  std::string transform;
  // The parameters this set has its own copy of (a shifted set whose
  // transform changed the model's float32 parameters too); every other
  // parameter is the one all sets share. The evaluator gives these their
  // own arena buffers for runs on this set.
  std::vector<std::string> own_parameters;
  // What its reference outputs are (issue 36): "float64" (the model run in
  // float64, cast to each output's dtype: the truth), or "float32" (PyTorch's
  // own output, where the float64 run was skipped; truth_note says why).
  std::string truth = "float32";
  std::string truth_note;
  // An agent's practice set (ReferenceOptions::practice_sets): drawn from
  // other seeds, after the judging sets; the judge never runs on it.
  bool practice = false;
  // PyTorch's own float32 output against float64 on this set, by output
  // (where truth is float64); and, in `files` or the resident tensors under
  // BoundKey(output, level), the per-block bound arrays (judge.h).
  std::map<std::string, PyTorchError> pytorch_error;
  bool OwnsParameter(const std::string& name) const {
    for (const auto& p : own_parameters)
      if (p == name) return true;
    return false;
  }
};

// One distribution shift of the inputs (evaluator/reference/transforms.py) as
// the bridge prepared it for a problem: the input set it made, or why none
// (dropped because the reference is not finite there, left out by the
// problem's INPUT_TRANSFORMS, no room).
struct InputTransform {
  std::string name;
  int set = -1;      // index into ReferenceData::sets; -1: not checked (note says why)
  std::string note;  // what the transform does, or why it was not checked
  // PyTorch's own float32 rounding on this set, by output, where measured
  // (as Signature::reference_error for set 0): a shifted set rounds otherwise.
  std::map<std::string, ReferenceError> reference_error;
  // The parameters it changed as well (ReferenceSet::own_parameters); empty
  // when they were kept, and the note says why.
  std::vector<std::string> parameters;
};

// A complete reference directory, read back from its manifest.json. Plain data;
// the directory lives in the cache and is never modified once complete.
struct ReferenceData {
  Signature signature;
  std::string dir;                       // absolute
  std::vector<ReferenceSet> sets;
  std::string device;                    // GPU name, or "cpu"
  std::string torch_version;
  std::optional<TimingStats> eager;      // only when timed on CUDA
  std::optional<TimingStats> compiled;   // also absent when torch.compile failed
  std::vector<std::string> warnings;     // degenerate outputs, timing problems
  // The warnings that say the reference cannot tell a right kernel from a wrong
  // one (outputs all zero, constant, independent of the inputs, NaN): a search
  // stops on them unless told otherwise (search/search_setup.h).
  std::vector<std::string> degenerate;
  // What is not a warning but a user may want to know (--verbose): outputs the
  // element-wise tolerance barely tests, why PyTorch's float32 rounding was not
  // measured (the float64 run skipped or failed; Signature::reference_error).
  std::vector<std::string> notes;
  std::map<std::string, double> scalars; // scalar inputs by name
  // Every transform the bridge knows, in the order they are checked; empty
  // for a reference made before they existed.
  std::vector<InputTransform> transforms;
  // The precision contract: the reference runs in full fp32 (TF32 off), while
  // PyTorch's defaults (which eager and compiled are timed with) compute cuDNN
  // convolutions in TF32. By float32 output, how far the defaults are from the
  // reference on input set 0 ({"rms", "rel_norm", "max_abs"}); empty where
  // they give the same bits (no TF32 path here), and the baselines are one.
  struct PrecisionError {
    double rms = 0, rel_norm = 0, max_abs = 0;
  };
  std::map<std::string, PrecisionError> default_precision_error;
  std::optional<TimingStats> eager_fp32;  // eager with TF32 off; only where the defaults differ
  // What eager and torch.compile were timed under (the manifest's
  // "timing_precision"): "high" or "medium" (ReferenceOptions::precision),
  // "default" for PyTorch's defaults, "" for a manifest without it (defaults too).
  std::string timing_precision;
  // Other shapes: how many input lists the problem's get_inputs_variants()
  // returns (0 without one, as in KernelBench), and, for a reference of
  // get_inputs(), the reference of each (two sets each, untimed): a candidate
  // is also judged at those shapes through the same plan expressions.
  int shape_variant_count = 0;
  std::vector<ReferenceData> shape_variants;
  bool from_cache = false;               // true when an existing entry was reused
  int sets_requested = 0;                // ReferenceOptions::sets; sets.size() may be fewer (see warnings)
  std::vector<std::string> evicted;      // cache entries removed to make room for this one
  // Wall seconds per phase of preparing it, in order: this process's
  // ("signature", "bridge process") and the bridge's own (model build, input
  // generation, forward, writing files, eager and torch.compile timing). Empty
  // phases of the bridge on a cache hit: only "cache lookup".
  std::vector<std::pair<std::string, double>> phases;
  // Set when the reference is resident on the GPU (ReferenceOptions): the
  // tensors are in this bridge process, not in files (dir is empty).
  std::shared_ptr<ResidentReference> resident;

  // Absolute path of tensor `name` in input set `set`.
  StatusOr<std::string> FilePath(int set, const std::string& name) const;
  // The get_inputs() sets: the first JudgingSets() of `sets` (the others are
  // practice sets, then distribution-shifted ones, ReferenceSet::transform).
  int JudgingSets() const;
  // The indexes of the practice sets (ReferenceSet::practice), in order.
  std::vector<int> PracticeSets() const;
};

// $KS_CACHE_DIR, else $XDG_CACHE_HOME/kernelsearch/reference, else
// ~/.cache/kernelsearch/reference.
std::string DefaultReferenceCacheDir();

// Finds the bridge's interpreter and its torch version (probe.py --quick, no
// torch import), as PrepareReference will on a GPU; the answers are kept for
// this process, so a caller may run this while it does other work first.
void WarmReferenceProbe(const BridgeOptions& opts);

// The reference for (problem bytes, sets, seed, device, the bridge's bytes (bridge.py,
// ks_bridge/, timing.py, transforms.py), torch
// version): reused from the cache when a complete entry exists, otherwise
// computed by the bridge into a temporary directory that is renamed into place.
// An untimed request also reuses a timed entry.
// Bounded (evaluator/reference/reference_cache.h): before computing, the sizes are read
// from the signature (shape inference, nothing computed); when K sets do not
// fit the cache cap, the free disk or opts.device_budget, as many as fit are
// prepared (a warning says so), and fewer than 2 is ResourceExhausted saying
// which limit and by how much; least recently used entries are evicted to
// make room, and temporary directories of killed runs are removed.
StatusOr<ReferenceData> PrepareReference(const std::string& file, const ReferenceOptions& opts = {});

// "at x [7, 1000]": which other shape a variant reference is, for messages.
std::string ShapeVariantName(const ReferenceData& variant);

// Reads a reference directory's manifest.json and checks that every file it
// names exists with the size its signature implies (a truncated cache entry is
// an error, not a silently short tensor).
StatusOr<ReferenceData> LoadReferenceDir(const std::string& dir);

// ---- Measured peaks ---------------------------------------------------------------

// The dense-matmul TFLOP/s a GPU really reaches (bridge.py peaks, cuBLAS through
// torch), by compute class: "fp32" (TF32 off), "tf32", "bf16", "fp16". The
// evaluator's compute floor is a problem's FLOPS over one of these.
struct DevicePeaks {
  std::string device;                    // GPU name, as the driver reports it
  std::string torch_version;
  std::map<std::string, double> tflops;  // class -> TFLOP/s, every value > 0
  int n = 0;                             // matmul size measured (n x n x n)
  bool from_cache = false;

  // The peak of `compute_class`, 0 when it was not measured.
  double For(const std::string& compute_class) const;
};

struct PeaksOptions {
  BridgeOptions bridge;
  int device_index = 0;          // CUDA ordinal, as torch and the driver number devices
  std::string device_name;       // the driver's name for it: the cache key and a check on the bridge
  std::string cache_dir;         // "" = DefaultReferenceCacheDir()/peaks
  bool refresh = false;          // measure again even when cached
  int n = 8192;
  int runs = 10;
};

// The peaks of one GPU, measured once (seconds) and then read from
// <cache_dir>/<device name>.json. A damaged cache file is measured again.
// FailedPrecondition when torch sees no GPU.
StatusOr<DevicePeaks> MeasureDevicePeaks(const PeaksOptions& opts);

// The class whose peak bounds a problem's compute: that of its outputs' dtype
// (float32 -> "fp32": torch's reference runs matmuls without TF32; float16 ->
// "fp16"; bfloat16 -> "bf16"; float64 -> "fp64", never measured). A problem
// with mixed output dtypes takes its first floating output. "" when no output
// is floating point.
std::string ComputeClassFor(const Signature& signature);

// Reads one tensor file into memory, checking its size against `spec`. For CPU
// tests and small cases; large tensors go to the GPU without this copy.
StatusOr<std::string> ReadTensorFile(const std::string& path, const TensorSpec& spec);

}  // namespace ks
