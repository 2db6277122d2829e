// Conversions between the lineage store's rows and the gRPC messages, and the
// id format of the API (store ids as decimal strings). Pure functions.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "evaluator/signature.h"
#include "proto/kernelsearch.pb.h"
#include "search/search_config.h"
#include "store/lineage_store.h"

namespace ks::server {

namespace pb = ::kernelsearch::v1;

std::string IdToString(int64_t id);
// InvalidArgument naming `what` unless `id` is a positive decimal number.
StatusOr<int64_t> ParseId(const std::string& what, const std::string& id);

pb::SearchState ToSearchState(store::SearchStatus s);
bool IsTerminal(store::SearchStatus s);

void FillSignature(const Signature& sig, pb::Signature* out);

// The API's config (validated) as the orchestrator's, with the server's model,
// and back (for SearchInfo).
SearchConfig ToSearchConfig(const pb::SearchConfig& c, const SearchConfig& server_base);
pb::SearchConfig FromSearchConfig(const SearchConfig& c);

void FillSearchInfo(const store::SearchSummary& s, pb::SearchInfo* out);
void FillCandidateSummary(const store::CandidateRow& c, pb::CandidateSummary* out);

}  // namespace ks::server
