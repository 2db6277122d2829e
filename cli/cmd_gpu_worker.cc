// kernelsearch gpu-worker: evaluates the candidates of a `kernelsearch serve`
// on this node's GPUs (server/gpu_worker.h), pulling them over the
// authenticated gRPC API under expiring leases. SIGTERM or SIGINT (Slurm's
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
  std::string evaluator;
  std::string python;
  std::string name;
  double lease_s = 0;
  int batch = 1;
  double idle_poll_s = 2;
  double exit_when_idle_s = 0;
  bool quiet = false;
};

int RunGpuWorker(const GpuWorkerFlags& f) {
  // Blocked in every thread created from here on; this one takes them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  server::GpuWorkerOptions o;
  auto client = ResolveConnFlags(f.conn);
  if (!client.ok()) return ReportError(client.status());
  o.client = *client;
  o.client.timeout_s = std::min(o.client.timeout_s, 60.0);  // lease calls are short; a hung server is retried
  o.evaluator.spec = f.evaluator.empty() ? "gpu" : f.evaluator;
  o.evaluator.python = f.python;
  o.evaluator.gpus = f.gpus.empty() ? "all" : f.gpus;
  if (o.evaluator.spec == "gpu") {
    std::string why;
    if (!GpuAvailable(&why)) return ReportError(FailedPrecondition("gpu-worker needs a GPU: " + why));
  }
  auto devices = ResolveGpus(o.evaluator);
  if (!devices.ok()) return ReportError(devices.status());
  o.devices = *devices;
  o.name = f.name;
  o.lease_s = f.lease_s;
  o.batch = f.batch;
  o.idle_poll_s = f.idle_poll_s;
  o.exit_when_idle_s = f.exit_when_idle_s;
  o.quiet = f.quiet;
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
  sub->add_option("--evaluator", f->evaluator, "gpu (default), or fake[:FILE] for tests (scripted_evaluator.h)");
  AddPythonOption(sub, &f->python);
  sub->add_option("--name", f->name, "worker name in the server's log and store (default host/pid[/slurm-JOB])");
  sub->add_option("--lease-seconds", f->lease_s,
                  "lease length asked for (default: the server's, 60 s); renewed every third of it while evaluating");
  sub->add_option("--batch", f->batch, "candidates leased per GPU at a time (the evaluator compiles them together)")
      ->capture_default_str();
  sub->add_option("--poll", f->idle_poll_s, "seconds between lease calls while nothing is pending")
      ->capture_default_str();
  sub->add_option("--exit-when-idle", f->exit_when_idle_s,
                  "exit after this many seconds with nothing to do (0: run until SIGTERM)")
      ->capture_default_str();
  sub->add_flag("--quiet", f->quiet, "no log lines on stderr");
  sub->footer("Exit status: 0 stopped by SIGTERM/SIGINT or idle; 2 bad arguments; 3 no GPU, or the server refused "
              "the token.");
  SetAction(sub, [f] { return RunGpuWorker(*f); });
}

}  // namespace ks::cli
