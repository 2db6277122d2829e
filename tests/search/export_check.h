// The Python side of the export gpu tests: tests/export/check_module.py loads
// an exported module, builds the problem's Model and ModelNew with the same
// weights, and compares them (torch.allclose) at each shape given. Prints
// EXPORT_MATCHES or EXPORT_DIFFERS. argv: module dir, JSON list of input shapes,
// atol, rtol.
#pragma once

#include "tests/test_paths.h"

#include <string>

namespace ks::testing {

inline std::string ExportCheckScript() { return ks::testing::SourceDir() + "/tests/export/check_module.py"; }

}  // namespace ks::testing
