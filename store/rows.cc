// Row readers of the lineage store (store_sql.h).
#include "store/store_sql.h"

namespace ks::store::internal {

StatusOr<CandidateKind> ParseKind(const std::string& s) {
  if (s == "seed") return CandidateKind::kSeed;
  if (s == "primary") return CandidateKind::kPrimary;
  if (s == "repair") return CandidateKind::kRepair;
  return Internal("unknown candidate kind in the store: " + s);
}

StatusOr<CandidateRow> ReadCandidate(const Stmt& s) {
  CandidateRow c;
  c.id = s.Int(0);
  c.search_id = s.Int(1);
  c.round = static_cast<int>(s.Int(2));
  c.idea_id = s.OptInt(3);
  c.parent_candidate = s.OptInt(4);
  c.source = s.Text(5);
  c.plan_json = s.Text(6);
  c.content_hash = s.Text(7);
  c.evaluated = s.Text(8) == "evaluated";
  c.raw_response = s.Text(9);
  KS_ASSIGN_OR_RETURN(c.kind, ParseKind(s.Text(10)));
  c.branch = static_cast<int>(s.Int(11));
  c.repair_depth = static_cast<int>(s.Int(12));
  c.repair_attempted = s.Int(13) != 0;
  c.slot_key = s.Text(14);
  c.created = s.Text(15);
  if (!s.IsNull(16)) {
    EvaluationRow e;
    e.candidate_id = s.Int(16);
    auto st = ParseEvalStatus(s.Text(17));
    if (!st.ok()) return st.status().WithContext("evaluation of candidate " + std::to_string(c.id));
    e.status = *st;
    e.evaluation_json = s.Text(18);
    e.median_ms = s.OptReal(19);
    e.speedup_eager = s.OptReal(20);
    e.speedup_compile = s.OptReal(21);
    e.reused_from = s.OptInt(22);
    e.created = s.Text(23);
    c.evaluation = std::move(e);
  }
  return c;
}

StatusOr<std::vector<CandidateRow>> ReadCandidates(Stmt& s) {
  std::vector<CandidateRow> out;
  for (;;) {
    KS_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return out;
    KS_ASSIGN_OR_RETURN(CandidateRow c, ReadCandidate(s));
    out.push_back(std::move(c));
  }
}

StatusOr<SearchRow> ReadSearch(const Stmt& s) {
  SearchRow r;
  r.id = s.Int(0);
  r.problem_id = s.Int(1);
  r.config_json = s.Text(2);
  KS_ASSIGN_OR_RETURN(r.status, ParseSearchStatus(s.Text(3)));
  r.stop_reason = s.Text(4);
  r.created = s.Text(5);
  r.updated = s.Text(6);
  r.best_candidate = s.OptInt(7);
  r.elapsed_s = s.Real(8);
  return r;
}

IdeaRow ReadIdea(const Stmt& s) {
  IdeaRow i;
  i.id = s.Int(0);
  i.search_id = s.Int(1);
  i.round = static_cast<int>(s.Int(2));
  i.parent_candidate = s.OptInt(3);
  i.text = s.Text(4);
  i.slot_key = s.Text(5);
  i.created = s.Text(6);
  return i;
}

ProblemRow ReadProblem(const Stmt& s) {
  ProblemRow p;
  p.id = s.Int(0);
  p.name = s.Text(1);
  p.file_path = s.Text(2);
  p.source = s.Text(3);
  p.signature_json = s.Text(4);
  p.sha256 = s.Text(5);
  p.created = s.Text(6);
  return p;
}

LlmCallRow ReadLlmCall(const Stmt& s) {
  LlmCallRow r;
  r.id = s.Int(0);
  r.search_id = s.Int(1);
  r.slot_key = s.Text(2);
  r.prompt_sha256 = s.Text(3);
  r.record.role = s.Text(4);
  r.record.backend = s.Text(5);
  r.record.model = s.Text(6);
  r.record.system = s.Text(7);
  r.record.prompt = s.Text(8);
  r.record.response = s.Text(9);
  r.record.tokens_in = s.Int(10);
  r.record.tokens_out = s.Int(11);
  r.record.latency_s = s.Real(12);
  r.record.cost_usd = s.Real(13);
  r.record.error = s.Text(14);
  r.record.finish_reason = s.Text(15);
  r.record.attempts = static_cast<int>(s.Int(16));
  r.created = s.Text(17);
  return r;
}

}  // namespace ks::store::internal
