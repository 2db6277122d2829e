// Datasheet figures for the GPUs people search on (prompts/gpu_datasheet.json,
// data, not code): what the prompts state about a GPU named with `--gpu` before
// any evaluation has measured it, so that the first round (the kernel that
// matters most) is written for the right machine. Marked "datasheet" in
// GpuFacts::source and in the prompts; measured figures replace them as soon
// as the GPU side reports (Orchestrator loads them from the store).
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "search/prompts.h"

namespace ks {

// The facts for the GPU `name` names (a driver name such as "NVIDIA H100 80GB
// HBM3", or a short one such as "H100"), with `name` kept as given; nullopt
// when the table has no such GPU. Matching: the first entry all of whose
// "match" words are words of `name` (case-insensitive; words split at anything
// but letters and digits). An error only when the data file is missing or damaged.
StatusOr<std::optional<GpuFacts>> DatasheetGpuFacts(const std::string& name);

// The same from a table given as JSON text (tests).
StatusOr<std::optional<GpuFacts>> DatasheetGpuFactsFrom(const std::string& json_text, const std::string& name);

}  // namespace ks
