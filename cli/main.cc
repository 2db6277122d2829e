// kernelsearch's entry point: registers every subcommand, parses the command
// line and runs the chosen subcommand's action.
#include <cstdio>

#include "cli/cli.h"

int main(int argc, char** argv) {
  using namespace ks::cli;
  CLI::App app{"kernelsearch: finds fast CUDA-C kernels for PyTorch operators"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "kernelsearch 0.1.0");
  RegisterProblemCommands(app);
  RegisterCompileCommand(app);
  RegisterEvalCommand(app);
  RegisterCacheCommands(app);
  RegisterLlmCommands(app);
  RegisterSearchCommands(app);
  RegisterBrowseCommands(app);
  RegisterServeCommand(app);
  RegisterReportCommand(app);
  RegisterRemoteCommands(app);
  RegisterGpuWorkerCommand(app);
  RegisterDoctorCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kExitUsage;
  }
  // The deepest chosen subcommand with an action runs.
  CLI::App* chosen = &app;
  for (;;) {
    auto subs = chosen->get_subcommands();
    if (subs.empty()) break;
    chosen = subs.front();
  }
  for (CLI::App* a = chosen; a; a = a->get_parent()) {
    if (const Action* action = FindAction(a)) {
      try {
        return (*action)();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "kernelsearch: internal error: %s\n", e.what());
        return kExitInternal;
      }
    }
  }
  std::fprintf(stderr, "%s", chosen->help().c_str());
  return kExitUsage;
}
