// kernelsearch cache list|clear [--cache-dir D] [--json]: the reference cache
// (evaluator/reference/reference_cache.h) shown and emptied.
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "evaluator/reference/reference_cache.h"

namespace ks::cli {
namespace {

struct CacheArgs {
  CacheFlags flags;
  bool json = false;
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
}

}  // namespace ks::cli
