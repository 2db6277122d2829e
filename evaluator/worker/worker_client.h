// The trusted side of one sandboxed ks-worker serve process (issue 35): it
// starts the worker under the sandbox (sandbox.h), initializes it, sends it
// typed requests and reads its typed replies (worker_protocol.h), and keeps
// its stderr in a log file of its own. A crash or hang ends only the worker:
// Stop kills it, counts a restart, and the owner starts another with Start.
//
// Starting is two steps so that the worker's driver initialisation (cuInit,
// the device's primary context: most of its start) overlaps the owner's own
// setup (issue 33): Spawn starts the process, which opens its context at once
// and says so (an EmptyReply, or an ErrorReply and exit); Start later sends
// the InitRequest, once the arena's IPC handle and the helper cubin exist.
// Start without a Spawn (a restart after a crash) does both.
//
// Owned by one GpuEvaluator for its whole life (the log file with it); not
// thread-safe: the evaluator's one-caller-at-a-time rule covers it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/subprocess.h"
#include "evaluator/worker/worker_protocol.h"

namespace ks {

// What came back for a request: a message (or why none came), the worker's
// ErrorReply if it refused, otherwise the reply of the request's type.
template <class Reply>
struct WorkerReply {
  Status received;                        // DeadlineExceeded: timed out; other errors: the worker is gone
  std::optional<wire::ErrorReply> error;  // the worker answered with an ErrorReply
  StatusOr<Reply> reply = Internal("no reply");  // when received without an error: the parsed reply
};

class WorkerClient {
 public:
  // worker_path: "" = FindWorker; log_cap: how much of the log TakeLog returns.
  WorkerClient(std::string worker_path, bool drop_privileges, size_t log_cap);
  ~WorkerClient();  // Close, and the log file removed
  WorkerClient(const WorkerClient&) = delete;
  WorkerClient& operator=(const WorkerClient&) = delete;

  // This client's worker process started for GPU `device`, not yet
  // initialized (its log file made on the first start). It opens the
  // device's context while the caller goes on. A no-op while one is running.
  Status Spawn(int device);
  // Waits until a spawned worker has opened its context (the GPU is then
  // this process's alone again, for measurements); FailedPrecondition, with
  // the worker's log, where it could not, and the worker killed.
  Status AwaitSpawned();
  // This client's worker initialized with `init`: the spawned one, or one
  // started now (no worker running: the first start, or after Stop).
  Status Start(const wire::InitRequest& init);
  // Starts a sandboxed worker (`prefix` before it on the command line: ncu)
  // with its stderr in log_path, and initializes it: a process apart from
  // this client's own (its heap size is recorded only for an empty prefix).
  StatusOr<ChildProcess> Launch(const std::vector<std::string>& prefix, const std::string& log_path,
                                const wire::InitRequest& init);
  // Kills the worker and counts a restart; returns how it ended (ChildProcess::Kill).
  std::string Stop();
  // Asks a running worker to quit (a short wait), then kills it. No restart counted.
  void Close();
  // The head of the worker's log since the last call (log_cap bytes), the file emptied.
  std::string TakeLog();

  template <class Request>
  Status Send(const Request& request) {
    return SendMessage(worker_.stdin_fd(), wire::ToJson(request));
  }
  template <class Reply>
  WorkerReply<Reply> Receive(double timeout_s) {
    WorkerReply<Reply> out;
    auto message = ReceiveMessage(worker_.stdout_fd(), timeout_s);
    if (!message.ok()) {
      out.received = message.status();
      return out;
    }
    out.error = wire::ErrorOf(*message);
    if (!out.error) out.reply = wire::FromJson<Reply>(*message);
    return out;
  }

  bool ready() const { return ready_; }
  int restarts() const { return restarts_; }
  uint64_t heap_bytes() const { return heap_bytes_; }

  // For its life, requests go to `stand_in` (a worker from Launch: the
  // profiled one) while this client's own worker, idle, stands aside; at its
  // end the own worker is back, its readiness and restart count as they were
  // (the stand-in's end is no restart of the own worker).
  class StandIn {
   public:
    StandIn(WorkerClient* client, ChildProcess* stand_in);
    ~StandIn();
    StandIn(const StandIn&) = delete;
    StandIn& operator=(const StandIn&) = delete;

   private:
    WorkerClient* client_;
    ChildProcess* stand_in_;
    bool ready_;
    int restarts_;
  };

 private:
  // A sandboxed `ks-worker serve --device N` process, not yet initialized.
  StatusOr<ChildProcess> SpawnProcess(const std::vector<std::string>& prefix, const std::string& log_path, int device);
  // Reads the spawned process's word on its context (see above).
  Status ReadSpawned(ChildProcess& w, const std::string& log_path);
  // Sends `init` to a spawned process whose word was read; its reply.
  StatusOr<wire::InitReply> Initialize(ChildProcess& w, const std::string& log_path, const wire::InitRequest& init);
  // Kills `w`; the "did not start" error with its log (this client's log only).
  Status FailStart(ChildProcess& w, const std::string& log_path, const std::string& why);
  Status MakeLog();

  const std::string worker_path_;
  const bool drop_privileges_;
  const size_t log_cap_;
  ChildProcess worker_;
  std::string log_path_;
  bool ready_ = false;
  bool spawned_ = false;        // worker_ runs, its word on its context not yet read (Spawn)
  bool awaiting_init_ = false;  // worker_ was spawned and has had no InitRequest yet
  int spawned_device_ = -1;
  int restarts_ = 0;
  uint64_t heap_bytes_ = 0;  // the device malloc heap the worker's context was left with
};

}  // namespace ks
