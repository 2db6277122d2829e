#include "cli/cli.h"
namespace ks::cli {
void RegisterProblemCommands(CLI::App& app) {}
}  // namespace ks::cli
