// Hardware counters of a candidate (evaluator/profile/counters.h): one more run of it,
// in a second sandboxed worker started under Nsight Compute.
//
// Why a second worker and one more run: ncu profiles a process it starts, so
// the counters come from a worker launched under it; the run itself is
// RunOnce, the same preparation (poisoned outputs, junk scratch, restored
// globals, flushed L2) and the same verification as every judged run. A
// candidate that detects the profiler (its replays, its timing) and behaves
// differently gains nothing: its status and time come from its ordinary runs,
// and a profiled run that is not correct only drops its counters.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/files.h"
#include "evaluator/gpu_evaluator.h"
#include "evaluator/worker/worker_protocol.h"

namespace ks {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// ncu replays each launch once per pass of its metrics (tens of passes, each
// restoring the memory the launch writes): the profiled run's time limit is
// this many times an ordinary run's.
constexpr double kProfiledRunTimeoutScale = 60;
// After the profiled worker exits, ncu still writes its table.
constexpr double kNcuExitWaitS = 60;

// A temporary file that the sandboxed worker (nobody, when we are root) may
// write: ncu's table and the profiled worker's stderr. Removed when done.
class TempFile {
 public:
  explicit TempFile(const char* pattern, int suffix_len) : path_(pattern) {
    int fd = mkstemps(path_.data(), suffix_len);
    if (fd < 0) {
      path_.clear();
      return;
    }
    fchmod(fd, 0666);
    close(fd);
  }
  ~TempFile() {
    if (!path_.empty()) unlink(path_.c_str());
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Waits for `p` to exit; kills its process group (ncu and the worker it
// started) when it does not within `seconds`.
void WaitOrKill(ChildProcess& p, double seconds) {
  auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  while (Clock::now() < deadline) {
    if (p.TryReap()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  p.Kill();  // the process group Spawn made for it: ncu and the worker it started
}

// ncu's table or messages; "" when it wrote none.
std::string ReadText(const std::string& path) {
  auto text = ReadFile(path, 16u << 20);
  return text.ok() ? *text : "";
}

}  // namespace

std::vector<CounterReport> GpuEvaluator::ReadCounters(const std::vector<Candidate>& candidates) {
  std::vector<CounterReport> out;
  if (Status st = ctx_.MakeCurrent(); !st.ok()) {
    for (size_t i = 0; i < candidates.size(); ++i) out.push_back({{}, "the evaluator's GPU context: " + st.message(), 0});
    return out;
  }
  const std::string ncu = FindNcu();
  if (ncu.empty() && counters_unavailable_.empty())
    counters_unavailable_ = getenv("KS_NCU") ? "KS_NCU=none: hardware counters are turned off"
                                             : "no Nsight Compute (ncu) on PATH or in $CUDA_HOME/bin or /usr/local/cuda/bin";
  for (const auto& c : candidates) {
    if (!counters_unavailable_.empty()) {
      out.push_back(CounterReport{{}, counters_unavailable_, 0});
      continue;
    }
    auto t0 = Clock::now();
    CounterReport r = CountersOf(c, ncu);
    r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    out.push_back(std::move(r));
  }
  return out;
}

CounterReport GpuEvaluator::CountersOf(const Candidate& candidate, const std::string& ncu) {
  CounterReport rep;
  CompileOptions co;
  co.arch = arch_;
  co.worker_path = opts_.worker_path;
  co.timeout_s = opts_.compile_timeout_s;
  auto compiled = CompileCandidate(candidate.source, co);
  if (!compiled.ok() || !compiled->ok) {
    rep.note = "not profiled: it did not compile again (" +
               (compiled.ok() ? compiled->message : compiled.status().message()) + ")";
    return rep;
  }
  PlanLimits limits;
  if (info_.shared_per_block_optin > 0) limits.max_shared_bytes_per_block = info_.shared_per_block_optin;
  auto plan = ResolvePlan(candidate.plan_json, ref_.signature, compiled->kernels, limits);
  if (!plan.ok()) {
    rep.note = "not profiled: " + plan.status().message();
    return rep;
  }
  std::vector<std::string> kernels;
  for (const auto& l : plan->launches) kernels.push_back(l.kernel);

  TempFile table("/tmp/ks-ncu-XXXXXX.csv", 4), worker_log("/tmp/ks-ncu-worker-XXXXXX.log", 4);
  if (table.path().empty() || worker_log.path().empty()) {
    rep.note = "not profiled: no temporary file in /tmp";
    return rep;
  }
  std::vector<std::string> prefix =
      NcuCommand(ncu, table.path(), kernels, static_cast<int>(kernels.size()), {}, ncu_extra_metrics_);
  auto profiled = worker_.Launch(prefix, worker_log.path(), WorkerInit());
  if (!profiled.ok()) {
    std::string log = ReadText(table.path()) + ReadText(worker_log.path());
    if (ncu_extra_metrics_ && NcuRefusedAMetric(log)) {
      ncu_extra_metrics_ = false;  // as below: the sections alone, once more
      return CountersOf(candidate, ncu);
    }
    // ncu that cannot start a worker here will not start the next one either.
    std::string why = NcuFailureReason(log);
    counters_unavailable_ = "ncu could not run the worker: " + (why.empty() ? profiled.status().message() : why);
    rep.note = counters_unavailable_;
    return rep;
  }
  auto load_failed = [&](const std::string& why) {
    WaitOrKill(*profiled, 0);
    rep.note = "not profiled: loading it under ncu: " + why;
    return rep;
  };
  if (Status s = SendMessage(profiled->stdin_fd(), wire::ToJson(BuildLoadRequest(*plan, *compiled))); !s.ok())
    return load_failed(s.message());
  auto reply = ReceiveMessage(profiled->stdout_fd(), 120);
  if (!reply.ok()) return load_failed(reply.status().message());
  if (auto err = wire::ErrorOf(*reply)) return load_failed(err->message.empty() ? "load failed" : err->message);

  // The profiled run: the ordinary worker (idle, its module loaded) stands
  // aside while RunOnce prepares, runs and verifies an input set (a practice set when practising) in the other.
  RunResult run;
  {
    // The profiled worker's end is no restart of the ordinary one (StandIn).
    WorkerClient::StandIn stand_in(&worker_, &*profiled);
    run_timeout_scale_ = kProfiledRunTimeoutScale;
    run = RunOnce(CheckedSets().front());
    // Followed by the checks of every run (RunOnce: outputs, the set's inputs,
    // guards) and of every input set, as the last run of a candidate is.
    if (run.status == EvalStatus::kCorrect) CheckEveryInputSet(run);
    run_timeout_scale_ = 1;
  }
  // EOF on its stdin ends the worker; ncu then writes its table and exits.
  profiled->CloseStdin();
  WaitOrKill(*profiled, kNcuExitWaitS);
  std::string text = ReadText(table.path());

  if (run.status != EvalStatus::kCorrect) {
    rep.note = std::string("the profiled run was not correct (") + EvalStatusName(run.status) + ": " + run.message +
               "): its counters are dropped; the candidate is judged by its ordinary runs";
    return rep;
  }
  auto parsed = ParseNcuCsv(text, kernels);
  if (!parsed.ok() && ncu_extra_metrics_ && NcuRefusedAMetric(text)) {
    // This ncu or chip lacks a metric asked for by name: the sections alone, once more.
    ncu_extra_metrics_ = false;
    return CountersOf(candidate, ncu);
  }
  if (!parsed.ok()) {
    rep.note = parsed.status().message();
    // A permission or device refusal holds for every later candidate: said once, not retried.
    if (!NcuFailureReason(text).empty()) counters_unavailable_ = rep.note;
    return rep;
  }
  rep.launches = std::move(*parsed);
  if (rep.launches.size() < kernels.size())
    rep.note = "ncu reported " + std::to_string(rep.launches.size()) + " of the plan's " +
               std::to_string(kernels.size()) + " launches";
  return rep;
}

}  // namespace ks
