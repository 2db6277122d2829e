#include "evaluator/reference/reference_cache.h"

#include <signal.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <nlohmann/json.hpp>

#include "common/files.h"

namespace ks {
namespace fs = std::filesystem;

namespace {

constexpr char kTempPrefix[] = ".tmp-";

uint64_t TreeBytes(const fs::path& dir) {
  uint64_t total = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (it->is_regular_file(ec2)) total += it->file_size(ec2);
  }
  return total;
}

std::time_t ToTimeT(fs::file_time_type t) {
  // file_time_type's clock is not system_clock before C++20's clock_cast; the
  // difference of "now"s converts it well enough for an LRU order.
  auto sys = std::chrono::time_point_cast<std::chrono::system_clock::duration>(
      t - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
  return std::chrono::system_clock::to_time_t(sys);
}

// The pid in ".tmp-<stem>-<pid>-<n>", or 0 when the name is not of that form.
pid_t TempDirPid(const std::string& name) {
  if (name.rfind(kTempPrefix, 0) != 0) return 0;
  size_t last = name.rfind('-');
  if (last == std::string::npos || last == 0) return 0;
  size_t before = name.rfind('-', last - 1);
  if (before == std::string::npos) return 0;
  std::string pid = name.substr(before + 1, last - before - 1);
  if (pid.empty() || !std::all_of(pid.begin(), pid.end(), ::isdigit)) return 0;
  return static_cast<pid_t>(std::strtol(pid.c_str(), nullptr, 10));
}

bool ProcessAlive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  std::string t;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(t.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();            // "GB" -> "G"
  if (unit.size() == 2 && unit.back() == 'I') unit.pop_back();           // "GIB" -> "GI" -> "G"
  double mult = unit.empty() || unit == "B" ? 1 : unit == "K" ? 1024.0 : unit == "M" ? 1024.0 * 1024
                : unit == "G" ? 1024.0 * 1024 * 1024 : unit == "T" ? 1024.0 * 1024 * 1024 * 1024 : -1;
  if (t.empty() || end == t.c_str() || errno != 0 || mult < 0 || !std::isfinite(v) || v < 0 || v * mult > 1.8e19)
    return InvalidArgument("'" + text + "' is not a size (examples: 20G, 512M, 1.5GiB, 1000000)");
  return static_cast<uint64_t>(v * mult);
}

StatusOr<uint64_t> DefaultCacheCap() {
  const char* env = std::getenv("KS_CACHE_CAP");
  if (!env || !*env) return kDefaultCacheCapBytes;
  auto v = ParseByteSize(env);
  if (!v.ok()) return InvalidArgument("KS_CACHE_CAP: " + v.status().message());
  return v;
}

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  char buf[32];
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

StatusOr<uint64_t> FreeDiskBytes(const std::string& path) {
  fs::path p = fs::absolute(path);
  std::error_code ec;
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path()) p = p.parent_path();
  struct statvfs st;
  if (statvfs(p.c_str(), &st) != 0) return PosixError("statvfs " + p.string(), errno);
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

StatusOr<CacheUsage> ReadCacheUsage(const std::string& dir) {
  CacheUsage u;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return u;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (!it->is_directory(ec2)) continue;
    std::string name = it->path().filename().string();
    if (name == "peaks") continue;
    if (name.rfind(kTempPrefix, 0) == 0) {
      ++u.temp_dirs;
      u.temp_bytes += TreeBytes(it->path());
      continue;
    }
    fs::path manifest = it->path() / "manifest.json";
    if (!fs::exists(manifest, ec2)) continue;  // not an entry (being removed, or foreign)
    CacheEntry e;
    e.path = fs::absolute(it->path()).lexically_normal().string();
    e.name = name;
    e.bytes = TreeBytes(it->path());
    const fs::file_time_type mtime = fs::last_write_time(manifest, ec2);
    e.last_used = ToTimeT(mtime);
    e.last_used_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(mtime.time_since_epoch()).count();
    if (auto text = ReadFile(manifest.string(), 64u << 20); text.ok()) {
      auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (j.is_object()) {
        if (j.contains("sets") && j["sets"].is_array())
          for (const auto& s : j["sets"])  // get_inputs() sets and distribution-shifted ones apart
            ++(s.is_object() && s.contains("transform") ? e.shifted_sets : e.sets);
        e.timed = ManifestHasTiming(j);
      }
    }
    u.entry_bytes += e.bytes;
    u.entries.push_back(std::move(e));
  }
  if (ec) return PosixError("listing " + dir, ec.value());
  std::sort(u.entries.begin(), u.entries.end(),
            [](const CacheEntry& a, const CacheEntry& b) { return a.last_used_ns < b.last_used_ns; });
  return u;
}

bool ManifestHasTiming(const nlohmann::json& j) {
  return j.is_object() && j.contains("timing") && j["timing"].is_object() && j["timing"].contains("eager") &&
         j["timing"]["eager"].is_object();
}

void TouchCacheEntry(const std::string& entry_dir) {
  std::error_code ec;
  fs::last_write_time(fs::path(entry_dir) / "manifest.json", fs::file_time_type::clock::now(), ec);
}

int RemoveStaleTempDirs(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    pid_t pid = TempDirPid(it->path().filename().string());
    if (pid <= 0 || ProcessAlive(pid)) continue;
    std::error_code ec2;
    if (fs::remove_all(it->path(), ec2) > 0) ++removed;
  }
  return removed;
}

Status MakeRoom(const std::string& dir, uint64_t incoming, uint64_t cap, const std::string& keep,
                std::vector<std::string>* evicted) {
  if (incoming > cap)
    return ResourceExhausted("the reference needs " + HumanBytes(incoming) + " on disk, more than the cache cap of " +
                             HumanBytes(cap) + " (raise --cache-cap or $KS_CACHE_CAP, or use fewer --sets)");
  RemoveStaleTempDirs(dir);
  KS_ASSIGN_OR_RETURN(CacheUsage u, ReadCacheUsage(dir));
  KS_ASSIGN_OR_RETURN(uint64_t free_bytes, FreeDiskBytes(dir));
  uint64_t total = u.entry_bytes;
  for (const auto& e : u.entries) {  // least recently used first
    if (total + incoming <= cap && free_bytes >= incoming) break;
    if (e.path == keep) continue;
    std::error_code ec;
    fs::remove_all(e.path, ec);
    if (ec) continue;  // someone else removed it, or it is not ours to remove: skip, try the next
    total -= e.bytes;
    free_bytes += e.bytes;
    if (evicted) evicted->push_back(e.name);
  }
  if (free_bytes < incoming)
    return ResourceExhausted("the reference needs " + HumanBytes(incoming) + " on disk but the file system of " + dir +
                             " has " + HumanBytes(free_bytes) +
                             " free even after emptying the cache (free disk space, point --cache-dir elsewhere, "
                             "or use fewer --sets)");
  return Status::Ok();
}

StatusOr<uint64_t> ClearReferenceCache(const std::string& dir, int* removed) {
  int n = RemoveStaleTempDirs(dir);
  KS_ASSIGN_OR_RETURN(CacheUsage u, ReadCacheUsage(dir));
  uint64_t freed = 0;
  for (const auto& e : u.entries) {
    std::error_code ec;
    fs::remove_all(e.path, ec);
    if (ec) return PosixError("removing " + e.path, ec.value());
    freed += e.bytes;
    ++n;
  }
  if (removed) *removed = n;
  return freed;
}

}  // namespace ks
