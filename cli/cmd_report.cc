// kernelsearch report SEARCH_ID|PROBLEM --out report.html: a search as one
// self-contained HTML page (search/report.h).
#include <cstdio>

#include "cli/cli.h"
#include "common/files.h"
#include "search/report.h"
#include "store/lineage_store.h"

namespace ks::cli {
namespace {

struct ReportFlags {
  std::string target;
  std::string out;
  std::string db;
  bool json = false;
};

int RunReport(const ReportFlags& f) {
  store::LineageStore::Options o;
  o.must_exist = true;
  auto store = store::LineageStore::Open(f.db.empty() ? store::DefaultDbPath() : f.db, o);
  if (!store.ok()) return ReportError(store.status());
  auto id = ResolveReportTarget(store->get(), f.target);
  if (!id.ok()) return ReportError(id.status());
  if (f.json) {
    auto data = ReportData(store->get(), *id);
    if (!data.ok()) return ReportError(data.status());
    std::string text = data->dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (f.out.empty()) {
      std::fputs(text.c_str(), stdout);
      return kExitOk;
    }
    if (Status st = WriteFile(f.out, text); !st.ok()) return ReportError(st);
    return kExitOk;
  }
  if (f.out.empty()) return ReportError(InvalidArgument("report: --out FILE.html is required (or --json)"));
  auto html = RenderReportHtml(store->get(), *id);
  if (!html.ok()) return ReportError(html.status());
  if (Status st = WriteFile(f.out, *html); !st.ok()) return ReportError(st);
  std::printf("wrote %s: search %lld (%zu bytes; open it in a browser, no network needed)\n", f.out.c_str(),
              static_cast<long long>(*id), html->size());
  return kExitOk;
}

}  // namespace

void RegisterReportCommand(CLI::App& app) {
  auto* f = new ReportFlags();  // lives as long as the process: CLI11 binds to it
  auto* sub = app.add_subcommand("report", "a search as one self-contained HTML page (plots, lineage tree, code)");
  sub->add_option("search", f->target, "search id, or a problem name/path (its newest search)")->required();
  sub->add_option("--out", f->out, "the .html file to write");
  sub->add_option("--db", f->db, "lineage store (default $KS_DB or ~/.local/share/kernelsearch/lineage.db)");
  sub->add_flag("--json", f->json, "the page's data as JSON instead (to stdout, or --out)");
  SetAction(sub, [f] { return RunReport(*f); });
}

}  // namespace ks::cli
