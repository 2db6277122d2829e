// Preparing a problem's reference (problem.h: PrepareReference): the cache
// key, a cache hit, how many input sets fit the disk and the GPU, and then
// either a resident reference or a new cache entry the bridge writes. One
// bridge process answers the sizes and then computes the reference.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "evaluator/reference/bridge_internal.h"
#include "evaluator/reference/kept_reference.h"
#include "evaluator/problem.h"
#include "evaluator/reference/reference_cache.h"

namespace ks {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace bridge_internal;

namespace {

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
// layout): the arena (one set's inputs, the parameters, the outputs), the
// pristine copy (every set's inputs, the parameters), and one reference copy
// of the outputs per set.
// (A resident reference's rule is fit_resident in reference/ks_bridge/resident.py, which decides it.)
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
  auto device = [&](int k) { return 2 * params + in + out + uint64_t(k) * (in + out) + 2 * shifted_in(k) * own; };
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
              HumanBytes(in + out) + " per set: the inputs' pristine copy and the reference outputs, beside " +
              HumanBytes(in + out + 2 * params) + " for the candidate's buffers), but " +
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

// Every module of a Python package directory, in name order, as
// length-prefixed name and content fields appended to *out.
Status AppendPackageBytes(const fs::path& dir, std::string* out) {
  std::vector<fs::path> modules;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.path().extension() == ".py") modules.push_back(entry.path());
  if (ec) return PosixError(dir.string(), ec.value());
  std::sort(modules.begin(), modules.end());
  for (const auto& m : modules) {
    KS_ASSIGN_OR_RETURN(std::string bytes, ReadFile(m.string()));
    AddKeyField(*out, m.filename().string(), bytes);
  }
  return Status::Ok();
}

StatusOr<KeyFacts> ReadKeyFacts(const std::string& file, const ReferenceOptions& opts) {
  KeyFacts k;
  KS_ASSIGN_OR_RETURN(k.problem_bytes, ReadFile(file));
  // The interpreter and the key's facts. With the device named, the quick
  // probe (no torch import) is enough; "auto" asks torch itself whether it
  // can use the GPU (a driver too old for its CUDA says no only there).
  std::optional<PythonInfo> quick;
  if (opts.device != "auto") {
    if (auto python = BridgeInterpreter(opts.bridge.python); python.ok())
      if (auto q = QuickProbe(*python); q.ok()) quick = *q;
  }
  if (quick) {
    k.py = *quick;
  } else {
    KS_ASSIGN_OR_RETURN(k.py, ResolvePython(opts.bridge.python));
  }
  KS_ASSIGN_OR_RETURN(std::string bridge_path, FindDataFile("reference/bridge.py"));
  KS_ASSIGN_OR_RETURN(k.bridge_bytes, ReadFile(bridge_path));
  // The bridge's package (ks_bridge/, one module per concern) is the method too.
  KS_RETURN_IF_ERROR(AppendPackageBytes(fs::path(bridge_path).parent_path() / "ks_bridge", &k.bridge_bytes));
  // timing.py is part of the method whose results are cached.
  KS_ASSIGN_OR_RETURN(std::string timing_path, FindDataFile("reference/timing.py"));
  KS_ASSIGN_OR_RETURN(k.timing_bytes, ReadFile(timing_path));
  // So is transforms.py: the distribution-shifted sets are part of the entry.
  KS_ASSIGN_OR_RETURN(std::string transforms_path, FindDataFile("reference/transforms.py"));
  KS_ASSIGN_OR_RETURN(k.transforms_bytes, ReadFile(transforms_path));

  if (opts.device == "cuda" && !k.py.cuda)
    return FailedPrecondition("--device cuda: torch " + k.py.torch_version + " in " + k.py.python +
                              " sees no CUDA device");
  k.on_cuda = opts.device == "cuda" || (opts.device == "auto" && k.py.cuda);
  // The GPU model is part of the key: reference outputs (TF32, algorithm
  // choices) and timings differ between devices.
  k.device_kind = k.on_cuda ? "cuda:" + k.py.device : "cpu";
  return k;
}

}  // namespace

std::string bridge_internal::TimingLevel(const ReferenceOptions& opts) {
  const std::string level = CanonicalContract(opts.precision);
  return level == "high" || level == "medium" ? level : "";
}

std::string bridge_internal::KeyHash(const KeyFacts& k, const ReferenceOptions& opts, bool timed,
                                     const std::string& kind) {
  std::string key = "kernelsearch-reference-v1\n";
  if (!kind.empty()) AddKeyField(key, "kind", kind);
  AddKeyField(key, "problem", k.problem_bytes);
  AddKeyField(key, "sets", std::to_string(opts.sets));
  AddKeyField(key, "seed", std::to_string(opts.seed));
  if (opts.practice_sets > 0) {  // fields only where there are any: other entries keep their keys
    AddKeyField(key, "practice sets", std::to_string(opts.practice_sets));
    AddKeyField(key, "practice seed", std::to_string(opts.practice_seed));
  }
  AddKeyField(key, "device", k.device_kind);
  AddKeyField(key, "bridge", k.bridge_bytes);
  AddKeyField(key, "timing", k.timing_bytes);
  AddKeyField(key, "transforms", k.transforms_bytes);
  AddKeyField(key, "torch", k.py.torch_version);
  AddKeyField(key, "timed", timed && k.on_cuda ? "1" : "0");
  if (opts.shape_variant >= 0) AddKeyField(key, "shape variant", std::to_string(opts.shape_variant));
  // Only where the timings differ: the entries of highest and kernelbench stay valid.
  if (const std::string level = TimingLevel(opts); timed && k.on_cuda && !level.empty())
    AddKeyField(key, "timing precision", level);
  return Sha256Hex(key).substr(0, 32);
}

namespace {

// Where a reference's cache entries live, and the cache's cap.
struct EntryPlace {
  fs::path cache;
  std::string stem;     // the problem file's name without .py
  fs::path final_dir;   // the entry for these options
  fs::path timing_dir;  // a resident reference's timings
  uint64_t cap = 0;
};

// A cache hit: the entry for these options or, untimed, the timed one. A
// damaged entry (truncated file, edited manifest) is removed: recomputed, not
// trusted.
std::optional<ReferenceData> FromCache(const std::vector<fs::path>& usable,
                                       std::chrono::steady_clock::time_point started) {
  std::error_code ec;
  for (const auto& dir : usable) {
    if (!fs::exists(dir / "manifest.json", ec)) continue;
    auto d = LoadReferenceDir(dir.string());
    if (d.ok()) {
      d->from_cache = true;
      d->phases = {{"cache lookup", Since(started)}};
      TouchCacheEntry(dir.string());
      return std::move(d).value();
    }
    fs::remove_all(dir, ec);
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> bridge_internal::ReferenceArgs(const std::string& file, const ReferenceOptions& opts,
                                                        bool on_cuda, uint64_t min_bytes, bool may_stay,
                                                        const std::string& cached_manifest,
                                                        const std::string& kept_socket) {
  std::vector<std::string> args = {"reference", file, "--then-files", "--sets", std::to_string(opts.sets),
                                   "--seed", std::to_string(opts.seed), "--device", on_cuda ? "cuda" : "cpu"};
  if (opts.practice_sets > 0)
    for (const std::string& a : {std::string("--practice-sets"), std::to_string(opts.practice_sets),
                                 std::string("--practice-seed"), std::to_string(opts.practice_seed)})
      args.push_back(a);
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
    if (opts.time && cached_manifest.empty()) args.push_back("--time");
    if (!cached_manifest.empty()) {
      args.push_back("--signature-from");
      args.push_back(cached_manifest);
    }
    if (opts.keep_s > 0 && !kept_socket.empty()) {
      // Stays after this command, for the next to lease (kept_reference.h).
      for (const std::string& a : {std::string("--keep"), std::to_string(opts.keep_s), std::string("--keep-socket"),
                                   kept_socket})
        args.push_back(a);
    }
  } else if (opts.time && on_cuda) {
    args.push_back("--time");  // timing to come: the bridge starts torch.compile's warm-up at once
  }
  if (const std::string level = TimingLevel(opts); opts.time && on_cuda && !level.empty()) {
    args.push_back("--precision");  // eager and torch.compile (the helper too) timed under it
    args.push_back(level);
  }
  return args;
}

namespace {

// A reference the bridge keeps on the GPU: its timings from the cache when
// they were there, else its fresh timings cached (only the manifest, kilobytes).
ReferenceData FinishResident(ReferenceData d, json answer, double signature_s, const std::optional<json>& cached,
                             const EntryPlace& place, const ReferenceOptions& opts) {
  const auto& kept = d.resident->kept();
  if (kept && kept->leased)
    d.phases = {{"kept reference leased (bridge pid " + std::to_string(kept->pid) + ", its tensors checked)",
                 signature_s}};
  else
    d.phases.insert(d.phases.begin(),
                    {"bridge process until the reference is on the GPU (phases below; sizes by shape inference)",
                     signature_s});
  if (cached) {
    auto from = ReferenceFromManifest(*cached, place.timing_dir.string());
    if (from.ok()) {
      d.eager = from->eager;
      d.compiled = from->compiled;
      d.eager_fp32 = from->eager_fp32;
      d.timing_precision = from->timing_precision;
      d.phases.emplace_back("eager and torch.compile timing: from the cache", 0);
      TouchCacheEntry(place.timing_dir.string());
    }
  } else if (opts.time && d.eager) {
    // A failure to cache costs a re-timing later, nothing else.
    std::vector<std::string> evicted;
    if (MakeRoom(place.cache.string(), 1 << 20, place.cap, "", &evicted).ok() &&
        WriteTimingEntry(place.cache, place.timing_dir, place.stem, std::move(answer)).ok())
      d.evicted = std::move(evicted);
  }
  return d;
}

// How many sets a new entry gets: judging sets and distribution-shifted ones,
// the disk they take, and a warning when fewer than asked.
struct EntryFit {
  SetFit fit;
  int transform_room = 0;
  std::vector<std::string> warnings;
};

StatusOr<EntryFit> FitEntry(const std::string& file, const Signature& sig, const ReferenceOptions& opts,
                            const EntryPlace& place) {
  KS_ASSIGN_OR_RETURN(uint64_t free_disk, FreeDiskBytes(place.cache.string()));
  KS_ASSIGN_OR_RETURN(CacheUsage usage, ReadCacheUsage(place.cache.string()));
  const uint64_t room = free_disk + usage.entry_bytes;
  // Practice sets (an agent's) are kept whole, like the first two judging sets.
  const int practice = std::max(opts.practice_sets, 0);
  const SetFit plain = FitSets(sig, opts.sets + practice, place.cap, room, opts.device_budget);
  if (plain.sets < std::min(opts.sets, 2) + practice) return ResourceExhausted(file + ": " + plain.why);
  // The distribution-shifted sets (transforms.py) share the room: where it is
  // short, judging sets beyond two make way for them (a problem at KernelBench's
  // sizes otherwise keeps none, and those are the problems users export).
  const int shifted_max = opts.shape_variant >= 0 ? 0 : kTransformSets;  // none at another shape
  const SetFit all =
      FitSets(sig, opts.sets + practice + shifted_max, place.cap, room, opts.device_budget, shifted_max);
  EntryFit e;
  e.fit = plain;
  e.fit.sets = std::min(opts.sets, std::max(std::min(opts.sets, 2), all.sets - practice - shifted_max));
  e.transform_room = std::clamp(all.sets - practice - e.fit.sets, 0, shifted_max);
  e.fit.disk_bytes = std::max(plain.disk_bytes, all.disk_bytes);
  if (e.fit.sets < opts.sets)
    e.warnings.push_back("using " + std::to_string(e.fit.sets) + " of the " + std::to_string(opts.sets) +
                         " input sets asked for" +
                         (e.fit.sets + practice < plain.sets ? " (and " + std::to_string(e.transform_room) +
                                                        " distribution-shifted set(s) in the room of the others)"
                                                  : std::string()) +
                         ": " + (plain.why.empty() ? all.why : plain.why));
  return e;
}

// A new cache entry: the waiting bridge writes the sets that fit into a
// private directory, renamed into place (a concurrent maker's entry is as good).
StatusOr<ReferenceData> WriteEntry(const std::string& file, const ReferenceOptions& opts, const EntryPlace& place,
                                   const json& answer, WaitingBridge& waiting, double signature_s) {
  auto parsed = SignatureFromJson(answer.value("signature", json()));
  if (!parsed.ok()) return Internal(file + ": the reference bridge returned a bad signature: " + parsed.status().message());
  KS_ASSIGN_OR_RETURN(EntryFit fit, FitEntry(file, *parsed, opts, place));
  std::vector<std::string> evicted;
  KS_RETURN_IF_ERROR(MakeRoom(place.cache.string(), fit.fit.disk_bytes, place.cap, "", &evicted).WithContext(file));

  static std::atomic<uint64_t> counter{0};
  const fs::path tmp =
      place.cache / (".tmp-" + place.stem + "-" + std::to_string(getpid()) + "-" + std::to_string(counter++));
  ScopedDirRemover remove_tmp(tmp);
  const auto mark = std::chrono::steady_clock::now();
  KS_ASSIGN_OR_RETURN(json manifest, waiting.WriteFiles(file,
                                                        json{{"out", tmp.string()},
                                                             {"sets", fit.fit.sets},
                                                             {"time", opts.time},
                                                             {"transform_sets", fit.transform_room}},
                                                        opts.bridge));
  const double bridge_s = Since(mark);
  (void)manifest;  // read back from disk below, the same way a cache hit is

  std::error_code ec;
  if (opts.refresh) fs::remove_all(place.final_dir, ec);
  if (rename(tmp.c_str(), place.final_dir.c_str()) != 0) {
    int err = errno;
    // Another process finished the same entry first; its result is as good as ours.
    if (!((err == ENOTEMPTY || err == EEXIST) && fs::exists(place.final_dir / "manifest.json", ec)))
      return PosixError("renaming " + tmp.string() + " to " + place.final_dir.string(), err);
  } else {
    remove_tmp.Release();
  }
  KS_ASSIGN_OR_RETURN(ReferenceData d, LoadReferenceDir(place.final_dir.string()));
  d.warnings.insert(d.warnings.begin(), fit.warnings.begin(), fit.warnings.end());
  d.evicted = std::move(evicted);
  d.phases.insert(d.phases.begin(),
                  {{"signature for the sizes (the bridge process: torch import, shape inference)", signature_s},
                   {"the same bridge process after the sizes (phases below)", bridge_s}});
  return d;
}

// A kept reference's key kind: the GPUs this process sees are part of it (a
// reference kept on another GPU would be copied across, not mapped).
std::string KeptKind() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return std::string("kept resident|") + (visible ? visible : "");
}

// A resident reference's cached timings, when there are any to use.
std::optional<json> CachedTimings(const EntryPlace& place, const ReferenceOptions& opts, bool may_stay) {
  if (!(may_stay && opts.time && !opts.refresh)) return std::nullopt;
  auto text = ReadFile((place.timing_dir / "manifest.json").string(), 64u << 20);
  if (!text.ok()) return std::nullopt;
  json t = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!ManifestHasTiming(t)) return std::nullopt;
  return t;
}

StatusOr<ReferenceData> PrepareOneReference(const std::string& file, const ReferenceOptions& opts) {
  const auto started = std::chrono::steady_clock::now();
  if (opts.sets < 1) return InvalidArgument("the number of input sets must be at least 1");
  if (opts.device != "auto" && opts.device != "cuda" && opts.device != "cpu")
    return InvalidArgument("device must be auto, cuda or cpu, not '" + opts.device + "'");
  KS_ASSIGN_OR_RETURN(KeyFacts key, ReadKeyFacts(file, opts));
  EntryPlace place;
  place.stem = fs::path(file).stem().string();
  place.cache = opts.cache_dir.empty() ? fs::path(DefaultReferenceCacheDir()) : fs::path(opts.cache_dir);
  place.final_dir = place.cache / (place.stem + "-" + KeyHash(key, opts, opts.time));
  // A resident reference caches only its timings; a second evaluation reads them.
  place.timing_dir = place.cache / (place.stem + "-" + KeyHash(key, opts, true, "resident timing"));

  // Entries come from the cache with the file path of whoever made them; report this caller's.
  auto adopt = [&](ReferenceData d) {
    d.signature.file = file;
    d.sets_requested = opts.sets;
    return d;
  };
  std::error_code ec;
  if (!opts.refresh) {
    std::vector<fs::path> usable = {place.final_dir};
    if (!opts.time) usable.push_back(place.cache / (place.stem + "-" + KeyHash(key, opts, true)));
    if (auto hit = FromCache(usable, started)) return adopt(std::move(*hit));
  }
  // A final directory without a manifest is not an entry (someone removed the
  // manifest by hand); it would only make the rename below fail.
  if (fs::exists(place.final_dir, ec) && !fs::exists(place.final_dir / "manifest.json", ec))
    fs::remove_all(place.final_dir, ec);

  fs::create_directories(place.cache, ec);
  if (ec) return PosixError(place.cache.string(), ec.value());
  place.cap = opts.cache_cap;
  if (place.cap == 0) {
    KS_ASSIGN_OR_RETURN(place.cap, DefaultCacheCap());
  }
  // One bridge process infers the sizes (shape inference, nothing computed)
  // and then either keeps the reference on the GPU (a problem of
  // min_bytes or more, on a GPU) or, once this process has sized the cache
  // entry and made room for it, writes it to files: one torch import.
  const auto mark = std::chrono::steady_clock::now();
  const uint64_t min_bytes = ResidentMinBytes(opts);
  const bool may_stay = key.on_cuda && min_bytes != UINT64_MAX;
  const std::optional<json> cached = CachedTimings(place, opts, may_stay);
  std::string kept_socket;
  if (may_stay && opts.keep_s > 0) {
    // The reference may stay for the next command (kept_reference.h); one an
    // earlier command kept is leased here, unless asked to compute afresh.
    KS_ASSIGN_OR_RETURN(kept_socket, KeptSocketPath(place.cache.string(), place.stem,
                                                    KeyHash(key, opts, opts.time, KeptKind())));
    if (opts.refresh) {
      (void)StopKeptReferenceAt(kept_socket);
    } else if (auto leased = LeaseKeptReference(kept_socket, file, opts.bridge.timeout_s); leased.ok()) {
      return adopt(FinishResident(std::move(leased->first), std::move(leased->second), Since(mark), cached, place,
                                  opts));
    }
  }
  std::unique_ptr<WaitingBridge> waiting;
  const std::string cached_manifest = cached ? (place.timing_dir / "manifest.json").string() : "";
  const std::string kept_log = kept_socket.empty() ? "" : kept_socket.substr(0, kept_socket.size() - 5) + ".log";
  KS_ASSIGN_OR_RETURN(auto made, StartBridge(file, ReferenceArgs(file, opts, key.on_cuda, min_bytes, may_stay,
                                                                 cached_manifest, kept_socket),
                                             opts.bridge, &waiting, kept_log));
  const double signature_s = Since(mark);
  if (made.first.resident)
    return adopt(FinishResident(std::move(made.first), std::move(made.second), signature_s, cached, place, opts));
  if (!waiting) return Internal(file + ": the reference bridge ended after the signature");
  KS_ASSIGN_OR_RETURN(ReferenceData d, WriteEntry(file, opts, place, made.second, *waiting, signature_s));
  return adopt(std::move(d));
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
    vo.practice_sets = 0;  // the agent practices at get_inputs()'s shapes
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

}  // namespace ks
