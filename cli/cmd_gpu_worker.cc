// kernelsearch gpu-worker: evaluates the candidates of a `kernelsearch serve`
// on this node's GPUs (server/gpu_worker.h), and runs the tool calls of the
// server's agents, pulling them over the authenticated gRPC API under
// expiring leases. SIGTERM or SIGINT (Slurm's
// scancel, a pod's deletion) stops it: the leases it holds go back to the
// server at once, so their candidates move to another worker.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "cli/cli.h"
#include "cli/conn_flags.h"
#include "evaluator/cuda_driver.h"
#include "search/evaluator_factory.h"
#include "server/gpu_worker.h"

namespace ks::cli {
namespace {

struct GpuWorkerFlags {
  ConnFlags conn;
  std::string gpus;
  server::GpuWorkerOptions worker;  // the flags bind to its fields
};

int RunGpuWorker(const GpuWorkerFlags& f) {
  // Blocked in every thread created from here on; this one takes them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  server::GpuWorkerOptions o = f.worker;
  auto client = ResolveConnFlags(f.conn);
  if (!client.ok()) return ReportError(client.status());
  o.client = *client;
  o.client.timeout_s = std::min(o.client.timeout_s, 60.0);  // lease calls are short; a hung server is retried
  if (o.evaluator.spec.empty()) o.evaluator.spec = "gpu";
  o.evaluator.gpus = f.gpus.empty() ? "all" : f.gpus;
  if (o.evaluator.spec == "gpu") {
    std::string why;
    if (!GpuAvailable(&why)) return ReportError(FailedPrecondition("gpu-worker needs a GPU: " + why));
  }
  auto devices = ResolveGpus(o.evaluator);
  if (!devices.ok()) return ReportError(devices.status());
  o.devices = *devices;
  server::GpuWorker worker(o);

  std::atomic<bool> done{false};
  Status result;
  std::thread runner([&] {
    result = worker.Run();
    done = true;
  });
  const timespec tick{0, 200 * 1000 * 1000};
  while (!done) {
    int sig = sigtimedwait(&sigs, nullptr, &tick);
    if (sig != SIGTERM && sig != SIGINT) continue;
    int released = worker.Stop();
    std::fprintf(stderr, "gpu-worker: %s, gave %d lease(s) back; stopping\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                 released);
    // An evaluation in flight is not waited for long: its lease is already back.
    for (int i = 0; i < 25 && !done; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!done) {
      std::fflush(nullptr);
      std::_Exit(kExitOk);  // evaluator subprocesses die with us (PR_SET_PDEATHSIG)
    }
  }
  runner.join();
  if (!result.ok()) return ReportError(result);
  return kExitOk;
}

}  // namespace

void RegisterGpuWorkerCommand(CLI::App& app) {
  auto* f = new GpuWorkerFlags();  // lives as long as the process: CLI11 binds to it
  CLI::App* sub = app.add_subcommand(
      "gpu-worker", "Evaluate the candidates of a `kernelsearch serve` on this node's GPUs (Slurm, Kubernetes)");
  AddConnOptions(sub, &f->conn);
  sub->add_option("--gpus", f->gpus, "GPUs to evaluate on: all (default) or a list such as 0,1; one thread each");
  sub->add_option("--evaluator", f->worker.evaluator.spec,
                  "gpu (default), or fake[:FILE] for tests (scripted_evaluator.h)");
  AddPythonOption(sub, &f->worker.evaluator.python);
  sub->add_option("--name", f->worker.name, "worker name in the server's log and store (default host/pid[/slurm-JOB])");
  sub->add_option("--lease-seconds", f->worker.lease_s,
                  "lease length asked for (default: the server's, 60 s); renewed every third of it while evaluating");
  sub->add_option("--batch", f->worker.batch,
                  "candidates leased per GPU at a time (the evaluator compiles them together)")
      ->capture_default_str();
  sub->add_option("--poll", f->worker.idle_poll_s, "seconds between lease calls while nothing is pending")
      ->capture_default_str();
  sub->add_option("--exit-when-idle", f->worker.exit_when_idle_s,
                  "exit after this many seconds with nothing to do (0: run until SIGTERM)")
      ->capture_default_str();
  sub->add_flag("--quiet", f->worker.quiet, "no log lines on stderr");
  sub->footer("Exit status: 0 stopped by SIGTERM/SIGINT or idle; 2 bad arguments; 3 no GPU, or the server refused "
              "the token.");
  SetAction(sub, [f] { return RunGpuWorker(*f); });
}

}  // namespace ks::cli
