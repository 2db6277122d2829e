// The Python side of the export gpu tests: tests/export/check_module.py loads
// an exported module, builds the problem's Model and ModelNew with the same
// weights, and compares them (torch.allclose) at each shape given. Prints
// EXPORT_MATCHES or EXPORT_DIFFERS. argv: module dir, JSON list of input shapes,
// atol, rtol. tests/export/compile_module.py (issue 34) runs the module
// compiled, under CUDA graphs and in training steps; prints a JSON line per
// check and EXPORT_COMPILES or EXPORT_COMPILE_FAILED. argv: module dir, JSON
// list of input shapes.
#pragma once

#include "tests/testing/paths.h"

#include <string>

namespace ks::testing {

inline std::string ExportCheckScript() { return ks::testing::SourceDir() + "/tests/export/check_module.py"; }
inline std::string ExportCompileScript() { return ks::testing::SourceDir() + "/tests/export/compile_module.py"; }

}  // namespace ks::testing
