#include "cli/cli.h"
namespace ks::cli {
void RegisterCompileCommand(CLI::App& app) {}
}  // namespace ks::cli
