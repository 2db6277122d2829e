// `kernelsearch report`: a search rendered as one self-contained HTML page that
// opens without a network: the best speedup over eager and torch.compile per
// round (a line chart), every candidate's time as points per round (a scatter),
// the lineage tree (parent -> child, coloured by status, the best path drawn
// thick), the ideas with their outcomes, each candidate's code and evaluation
// one click away, and the roofline fraction.
//
// Charts and the tree are drawn by Apache ECharts (third_party/echarts, Apache
// 2.0), compiled into this library and inlined into every page, so that the
// page has no external reference. The page sets `data-ks-rendered` on <body>
// once both charts have drawn (what tests and scripts/report_screenshot.sh wait for).
//
// Pure functions over the store; thread-safe as the store is.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "store/lineage_store.h"

namespace ks {

// "42" is search 42; anything else names a problem (name or file path), whose
// newest search is meant. NotFound when neither exists.
StatusOr<int64_t> ResolveReportTarget(store::LineageStore* store, const std::string& search_or_problem);

// The data the page draws, as JSON (also useful on its own).
StatusOr<nlohmann::json> ReportData(store::LineageStore* store, int64_t search_id);

// The whole page.
StatusOr<std::string> RenderReportHtml(store::LineageStore* store, int64_t search_id);

// The charting library inlined into the page (minified ECharts).
std::string_view EchartsSource();

}  // namespace ks
