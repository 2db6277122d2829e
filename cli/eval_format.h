// Human-readable rendering of evaluations, shared by eval, show and the search's progress.
#pragma once

#include <string>

#include "evaluator/evaluation.h"

namespace ks::cli {

void PrintEvaluation(const Evaluation& e);
// What held beyond the get_inputs() sets: a summary line and one line per check.
void PrintRobustness(const Robustness& r);
// "correct", or "correct (specialised)" for a candidate a shifted input set broke.
std::string StatusText(const Evaluation& e);
void PrintBatchHeader();
void PrintBatchRow(const std::string& name, const std::string& status, const Evaluation* e, const std::string& message);

}  // namespace ks::cli
