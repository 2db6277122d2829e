// kernelsearch cache list|clear [--cache-dir D] [--json]: the reference cache
// (evaluator/reference/reference_cache.h) shown and emptied; cache kept|release:
// the references kept on the GPU between commands (kept_reference.h).
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "evaluator/reference/kept_reference.h"
#include "evaluator/reference/reference_cache.h"

namespace ks::cli {
namespace {

struct CacheArgs {
  CacheFlags flags;
  bool json = false;
  std::string problem;  // cache release: only this problem's ("" = all)
};

std::string When(std::time_t t) {
  char buf[32];
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

int RunList(const CacheArgs& a) {
  auto where = ResolveCacheFlags(a.flags);
  if (!where.ok()) return ReportError(where.status());
  const auto& [dir, cap] = *where;
  auto u = ReadCacheUsage(dir);
  if (!u.ok()) return ReportError(u.status());
  auto free_disk = FreeDiskBytes(dir);
  if (a.json) {
    nlohmann::json entries = nlohmann::json::array();
    for (auto it = u->entries.rbegin(); it != u->entries.rend(); ++it)
      entries.push_back({{"name", it->name}, {"path", it->path}, {"bytes", it->bytes}, {"sets", it->sets}, {"shifted_sets", it->shifted_sets},
                         {"timed", it->timed}, {"last_used", When(it->last_used) + "Z"}});
    nlohmann::json j = {{"dir", dir}, {"cap_bytes", cap}, {"bytes", u->entry_bytes}, {"entries", entries},
                        {"temp_dirs", u->temp_dirs}, {"temp_bytes", u->temp_bytes}};
    if (free_disk.ok()) j["free_disk_bytes"] = *free_disk;
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("cache  %s\nused   %s of a %s cap in %zu entr%s%s\n", dir.c_str(), HumanBytes(u->entry_bytes).c_str(),
              HumanBytes(cap).c_str(), u->entries.size(), u->entries.size() == 1 ? "y" : "ies",
              free_disk.ok() ? (", " + HumanBytes(*free_disk) + " free on its disk").c_str() : "");
  if (u->temp_dirs)
    std::printf("temp   %d run%s in progress or killed, %s\n", u->temp_dirs, u->temp_dirs == 1 ? "" : "s",
                HumanBytes(u->temp_bytes).c_str());
  if (u->entries.empty()) return kExitOk;
  std::printf("\n%-20s %10s %5s %7s %6s  %s\n", "last used (UTC)", "size", "sets", "shifted", "timed", "entry");
  for (auto it = u->entries.rbegin(); it != u->entries.rend(); ++it)  // most recent first
    std::printf("%-20s %10s %5d %7d %6s  %s\n", When(it->last_used).c_str(), HumanBytes(it->bytes).c_str(), it->sets,
                it->shifted_sets, it->timed ? "yes" : "no", it->name.c_str());
  return kExitOk;
}

int RunClear(const CacheArgs& a) {
  auto where = ResolveCacheFlags(a.flags);
  if (!where.ok()) return ReportError(where.status());
  int removed = 0;
  auto freed = ClearReferenceCache(where->first, &removed);
  if (!freed.ok()) return ReportError(freed.status());
  if (a.json)
    std::printf("%s\n", nlohmann::json{{"dir", where->first}, {"removed", removed}, {"freed_bytes", *freed}}.dump().c_str());
  else
    std::printf("removed %d entr%s, %s freed from %s\n", removed, removed == 1 ? "y" : "ies",
                HumanBytes(*freed).c_str(), where->first.c_str());
  return kExitOk;
}

nlohmann::json KeptJson(const KeptStatus& k) {
  nlohmann::json j = {{"problem", k.problem}, {"pid", k.pid},       {"socket", k.socket},
                      {"gpu_bytes", k.gpu_bytes}, {"pci_bus_id", k.pci_bus_id}, {"leases", k.leases},
                      {"leases_served", k.leases_served}, {"keep_s", k.keep_s}, {"idle_s", k.idle_s},
                      {"stopping", k.stopping}};
  j["expires_in_s"] = k.expires_in_s ? nlohmann::json(*k.expires_in_s) : nlohmann::json(nullptr);
  return j;
}

int RunKept(const CacheArgs& a) {
  auto where = ResolveCacheFlags(a.flags);
  if (!where.ok()) return ReportError(where.status());
  auto kept = ListKeptReferences(where->first);
  if (!kept.ok()) return ReportError(kept.status());
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& k : *kept) list.push_back(KeptJson(k));
    std::printf("%s\n", nlohmann::json{{"dir", where->first}, {"kept", list}}.dump(2).c_str());
    return kExitOk;
  }
  if (kept->empty()) {
    std::printf("no reference is kept on a GPU (eval --keep-reference keeps one)\n");
    return kExitOk;
  }
  std::printf("%-8s %10s %-14s %6s %7s %-22s %s\n", "pid", "GPU memory", "GPU (bus id)", "leases", "served",
              "until", "problem");
  for (const auto& k : *kept) {
    char until[64];
    if (k.stopping) std::snprintf(until, sizeof until, "stopping");
    else if (!k.expires_in_s) std::snprintf(until, sizeof until, "in use");
    else std::snprintf(until, sizeof until, "%.0f s idle from now", *k.expires_in_s);
    std::printf("%-8d %10s %-14s %6d %7d %-22s %s\n", static_cast<int>(k.pid), HumanBytes(k.gpu_bytes).c_str(),
                k.pci_bus_id.c_str(), k.leases, k.leases_served, until, k.problem.c_str());
  }
  return kExitOk;
}

int RunRelease(const CacheArgs& a) {
  auto where = ResolveCacheFlags(a.flags);
  if (!where.ok()) return ReportError(where.status());
  auto stopped = StopKeptReferences(where->first, a.problem);
  if (!stopped.ok()) return ReportError(stopped.status());
  if (a.json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& k : *stopped) list.push_back(KeptJson(k));
    std::printf("%s\n", nlohmann::json{{"dir", where->first}, {"released", list}}.dump().c_str());
    return kExitOk;
  }
  if (stopped->empty())
    std::printf("no reference%s is kept on a GPU\n", a.problem.empty() ? "" : (" of " + a.problem).c_str());
  for (const auto& k : *stopped)
    std::printf("released %s (pid %d, %s)%s\n", k.problem.c_str(), static_cast<int>(k.pid),
                HumanBytes(k.gpu_bytes).c_str(),
                k.leases > 0 ? (": it ends when its " + std::to_string(k.leases) + " open lease(s) end").c_str() : "");
  return kExitOk;
}

}  // namespace

void RegisterCacheCommands(CLI::App& app) {
  CLI::App* cache = app.add_subcommand("cache", "show or empty the reference cache (input sets, reference outputs, timings)");
  cache->require_subcommand(1);
  auto list_args = std::make_shared<CacheArgs>();
  CLI::App* list = cache->add_subcommand("list", "the cache's entries, most recently used first, with sizes and the cap");
  AddCacheOptions(list, &list_args->flags);
  list->add_flag("--json", list_args->json, "print JSON");
  SetAction(list, [list_args] { return RunList(*list_args); });
  auto clear_args = std::make_shared<CacheArgs>();
  CLI::App* clear = cache->add_subcommand(
      "clear", "remove every entry and the leftovers of killed runs (measured GPU peaks in peaks/ are kept)");
  AddCacheOptions(clear, &clear_args->flags);
  clear->add_flag("--json", clear_args->json, "print JSON");
  SetAction(clear, [clear_args] { return RunClear(*clear_args); });
  auto kept_args = std::make_shared<CacheArgs>();
  CLI::App* kept = cache->add_subcommand(
      "kept", "the references kept on a GPU between commands (eval --keep-reference): memory, leases, time left");
  AddCacheOptions(kept, &kept_args->flags);
  kept->add_flag("--json", kept_args->json, "print JSON");
  SetAction(kept, [kept_args] { return RunKept(*kept_args); });
  auto release_args = std::make_shared<CacheArgs>();
  CLI::App* release = cache->add_subcommand(
      "release", "free the GPU memory of kept references now (each ends once the commands using it end)");
  release->add_option("problem", release_args->problem, "only this problem file's (path or name; default: all)");
  AddCacheOptions(release, &release_args->flags);
  release->add_flag("--json", release_args->json, "print JSON");
  SetAction(release, [release_args] { return RunRelease(*release_args); });
}

}  // namespace ks::cli
