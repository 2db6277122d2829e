// Reads a candidate out of free text: a model's reply or a user's markdown file
// holding a ```cuda block and a ```json launch-plan block. Tolerant of prose,
// extra blocks and fence variants; says precisely what is missing.
#pragma once

#include <string>

#include "common/status.h"
#include "evaluator/evaluation.h"

namespace ks {

// The last cuda/cu/c++/cpp block that declares an extern "C" __global__ kernel (or
// the last such block), and the last ```json block that parses as an object with
// "launches" (or a bare JSON object with "launches" outside fences).
// InvalidArgument naming what is missing ("no ```cuda block", "no launch-plan
// JSON block", "launch-plan block is not valid JSON: ...").
StatusOr<Candidate> ParseCandidateMarkdown(const std::string& text);

// Loads a candidate from files: a .md file (parsed as above), or a .cu file with
// the plan in plan_path (or, when plan_path is empty, next to it as the same
// stem with .json).
StatusOr<Candidate> LoadCandidateFiles(const std::string& path, const std::string& plan_path);

}  // namespace ks
