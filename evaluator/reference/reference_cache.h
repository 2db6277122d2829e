// The on-disk reference cache (DESIGN.md: "what is cached on disk is bounded and
// evicted"). One directory holds complete entries (a directory per problem and
// settings, complete once its manifest.json exists, see PrepareReference in
// evaluator/problem.h), temporary directories of bridge runs in progress
// (".tmp-<stem>-<pid>-<n>"), and peaks/ (measured GPU peaks, small, never
// evicted).
//
// Bounded: PrepareReference makes room for a new entry by removing the least
// recently used complete entries until the cache stays under its cap, and
// removes temporary directories whose process is gone (a killed run). An
// entry's last use is its manifest's modification time, refreshed on every
// cache hit.
//
// Thread-safety: functions are stateless; concurrent processes may share a
// cache directory (an entry removed under a reader is recomputed by it).
#pragma once

#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace ks {

// The default cap when neither --cache-cap nor $KS_CACHE_CAP says otherwise.
constexpr uint64_t kDefaultCacheCapBytes = uint64_t{20} << 30;

struct CacheEntry {
  std::string path;        // absolute directory
  std::string name;        // directory name: "<problem stem>-<key>"
  uint64_t bytes = 0;      // every file under it
  std::time_t last_used = 0;
  int64_t last_used_ns = 0; // the same, finer: entries made within one second still have an order
  int sets = 0;            // input sets it holds (get_inputs()'s)
  int shifted_sets = 0;    // and distribution-shifted sets (evaluator/reference/transforms.py)
  bool timed = false;      // holds eager / torch.compile timings
};

struct CacheUsage {
  std::vector<CacheEntry> entries;  // least recently used first
  uint64_t entry_bytes = 0;         // sum over entries
  uint64_t temp_bytes = 0;          // temporary directories of runs in progress
  int temp_dirs = 0;
};

// "20G", "512M", "1.5GiB", "1000000" (bytes) -> bytes. InvalidArgument otherwise.
StatusOr<uint64_t> ParseByteSize(const std::string& text);

// $KS_CACHE_CAP parsed, else kDefaultCacheCapBytes. A bad value is an error
// naming the variable.
StatusOr<uint64_t> DefaultCacheCap();

// Lists a cache directory (an absent one is empty).
StatusOr<CacheUsage> ReadCacheUsage(const std::string& dir);

// Marks an entry as used now (its manifest's mtime).
void TouchCacheEntry(const std::string& entry_dir);

// Whether a reference manifest holds PyTorch timings (an eager median at least).
bool ManifestHasTiming(const nlohmann::json& manifest);

// Removes temporary directories left by runs whose process no longer exists
// (killed bridge runs); returns how many were removed.
int RemoveStaleTempDirs(const std::string& dir);

// Removes least recently used entries (never `keep`) until the entries plus
// `incoming` bytes fit under `cap` and the file system has `incoming` bytes
// free. `evicted` receives the names removed. ResourceExhausted, saying why,
// when even an empty cache would not make room.
Status MakeRoom(const std::string& dir, uint64_t incoming, uint64_t cap, const std::string& keep,
                std::vector<std::string>* evicted);

// Removes every entry and every stale temporary directory (peaks/ stays).
// Returns the bytes freed.
StatusOr<uint64_t> ClearReferenceCache(const std::string& dir, int* removed);

// Free bytes on the file system holding `path` (or its nearest existing parent).
StatusOr<uint64_t> FreeDiskBytes(const std::string& path);

// "1.5 GiB", "12.0 MiB", "512 B".
std::string HumanBytes(uint64_t bytes);

}  // namespace ks
