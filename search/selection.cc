// Selection: the next round's parents (the beam) and the best kernel so far.

#include "search/search_run.h"

namespace ks {

namespace {
// A kernel a distribution-shifted input set broke (Evaluation::specialised):
// it ranks after every robust one, so that the beam and the best prefer a
// kernel that holds for the inputs a user's model will feed it.
bool Specialised(const CandidateRow& c) {
  auto j = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, /*allow_exceptions=*/false);
  return j.is_object() && j.contains("robustness") && j["robustness"].is_object() &&
         j["robustness"].value("specialised", false);
}
}  // namespace

std::vector<int64_t> SelectBeam(const std::vector<store::CandidateRow>& correct, int beam_size, uint64_t seed) {
  // Exact ties go by a seeded hash of the content, not by id, so that two runs
  // of the same search (continuous or split) choose the same kernels.
  auto tie_key = [&](const CandidateRow& c) { return Sha256Hex(std::to_string(seed) + c.content_hash); };
  std::vector<std::pair<CandidateRow, std::string>> remaining;
  for (const auto& c : correct) {
    if (!c.evaluation || c.evaluation->status != EvalStatus::kCorrect || !c.evaluation->median_ms) continue;
    remaining.emplace_back(c, tie_key(c));
  }
  std::stable_sort(remaining.begin(), remaining.end(), [](const auto& a, const auto& b) {
    if (Specialised(a.first) != Specialised(b.first)) return !Specialised(a.first);
    if (*a.first.evaluation->median_ms != *b.first.evaluation->median_ms)
      return *a.first.evaluation->median_ms < *b.first.evaluation->median_ms;
    return a.second < b.second;
  });
  std::vector<int64_t> beam;
  std::set<std::optional<int64_t>> ideas_in_beam;
  std::set<std::string> contents_in_beam;
  while (static_cast<int>(beam.size()) < beam_size && !remaining.empty()) {
    double fastest = *remaining.front().first.evaluation->median_ms;
    size_t pick = 0;
    for (size_t i = 0; i < remaining.size(); ++i) {
      if (*remaining[i].first.evaluation->median_ms > fastest * (1 + kTieTolerance)) break;
      if (Specialised(remaining[i].first) != Specialised(remaining.front().first)) break;  // never a tie
      if (!ideas_in_beam.count(remaining[i].first.idea_id)) {
        pick = i;
        break;
      }
    }
    CandidateRow chosen = remaining[pick].first;
    remaining.erase(remaining.begin() + pick);
    if (contents_in_beam.count(chosen.content_hash)) continue;  // the same kernel twice teaches nothing
    beam.push_back(chosen.id);
    ideas_in_beam.insert(chosen.idea_id);
    contents_in_beam.insert(chosen.content_hash);
  }
  return beam;
}

StatusOr<std::vector<int64_t>> Orchestrator::SearchRun::SelectBeam() {
  KS_ASSIGN_OR_RETURN(auto correct, store_->CorrectCandidates(search_id_));
  return ks::SelectBeam(correct, config_.beam, config_.seed);
}

Status Orchestrator::SearchRun::UpdateBest() {
  KS_ASSIGN_OR_RETURN(auto best, store_->BestCorrect(search_id_));
  if (!best || (best_id_ && *best_id_ == best->id)) return Status::Ok();
  best_id_ = best->id;
  std::optional<double> speedup = best->evaluation->speedup_eager;
  {
    std::lock_guard<std::mutex> lock(mu_);
    best_speedup_ = speedup;
    if (config_.target_speedup > 0 && speedup && *speedup >= config_.target_speedup && stop_reason_.empty())
      stop_reason_ = fmt::format("target speedup {:.2f}x reached", config_.target_speedup);
  }
  KS_RETURN_IF_ERROR(store_->SetBestCandidate(search_id_, best->id));
  Emit({.type = SearchEvent::Type::kNewBest, .round = best->round, .candidate_id = best->id, .speedup = speedup});
  return Status::Ok();
}

std::optional<double> Orchestrator::SearchRun::BestSpeedup() {
  std::lock_guard<std::mutex> lock(mu_);
  return best_speedup_;
}

}  // namespace ks
