// The sandboxed worker's process: start, initialization, stop, its log.
#include "evaluator/worker/worker_client.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <utility>

#include "common/files.h"
#include "common/unique_fd.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/worker/sandbox.h"

namespace ks {

WorkerClient::WorkerClient(std::string worker_path, bool drop_privileges, size_t log_cap)
    : worker_path_(std::move(worker_path)), drop_privileges_(drop_privileges), log_cap_(log_cap) {}

WorkerClient::~WorkerClient() {
  Close();
  if (!log_path_.empty()) unlink(log_path_.c_str());
}

void WorkerClient::Close() {
  spawned_ = awaiting_init_ = false;
  if (!worker_.running()) return;
  (void)Send(wire::QuitRequest{});
  (void)ReceiveMessage(worker_.stdout_fd(), 2);
  worker_.Kill();
}

Status WorkerClient::MakeLog() {
  if (!log_path_.empty()) return Status::Ok();
  char tmpl[] = "/tmp/ks-worker-XXXXXX.log";
  int fd = mkstemps(tmpl, 4);
  if (fd < 0) return PosixError("creating the worker log", errno);
  close(fd);
  log_path_ = tmpl;
  return Status::Ok();
}

Status WorkerClient::Spawn(int device) {
  if (worker_.running()) return Status::Ok();
  ready_ = false;
  KS_RETURN_IF_ERROR(MakeLog());
  KS_ASSIGN_OR_RETURN(worker_, SpawnProcess({}, log_path_, device));
  spawned_ = true;
  awaiting_init_ = true;
  spawned_device_ = device;
  return Status::Ok();
}

Status WorkerClient::AwaitSpawned() {
  if (!spawned_) return Status::Ok();
  spawned_ = false;
  return ReadSpawned(worker_, log_path_);
}

Status WorkerClient::Start(const wire::InitRequest& init) {
  ready_ = false;
  // Only a process spawned for this device and not yet initialized is kept;
  // any other is replaced, as a start always did.
  if (worker_.running() && !(awaiting_init_ && spawned_device_ == init.device)) {
    spawned_ = false;
    worker_.Kill();
  }
  KS_RETURN_IF_ERROR(Spawn(init.device));
  KS_RETURN_IF_ERROR(AwaitSpawned());
  awaiting_init_ = false;
  KS_ASSIGN_OR_RETURN(wire::InitReply started, Initialize(worker_, log_path_, init));
  heap_bytes_ = started.heap_bytes;
  ready_ = true;
  return Status::Ok();
}

StatusOr<ChildProcess> WorkerClient::Launch(const std::vector<std::string>& prefix, const std::string& log_path,
                                            const wire::InitRequest& init) {
  KS_ASSIGN_OR_RETURN(ChildProcess w, SpawnProcess(prefix, log_path, init.device));
  KS_RETURN_IF_ERROR(ReadSpawned(w, log_path));
  KS_ASSIGN_OR_RETURN(wire::InitReply started, Initialize(w, log_path, init));
  if (prefix.empty()) heap_bytes_ = started.heap_bytes;
  return w;
}

StatusOr<ChildProcess> WorkerClient::SpawnProcess(const std::vector<std::string>& prefix, const std::string& log_path,
                                                  int device) {
  KS_ASSIGN_OR_RETURN(std::string worker, FindWorker(worker_path_));
  SandboxLimits limits;
  limits.drop_privileges = drop_privileges_;
  // Diagnostics: KS_WORKER_SANDBOX=keepuser,nonetns,dumpable relaxes single steps.
  if (const char* v = getenv("KS_WORKER_SANDBOX")) {
    std::string s = v;
    if (s.find("keepuser") != std::string::npos) limits.drop_privileges = false;
    if (s.find("nonetns") != std::string::npos) limits.new_network_namespace = false;
    if (s.find("dumpable") != std::string::npos) limits.keep_dumpable = true;
  }
  std::vector<std::string> argv = prefix;
  argv.push_back(worker);
  argv.push_back("serve");
  // The device on the command line: the worker opens its context before it
  // reads anything (worker_serve.cc), while the evaluator still prepares.
  argv.push_back("--device");
  argv.push_back(std::to_string(device));
  // A profiler in front (ncu) keeps its settings under $HOME: one it may write
  // when it runs as nobody.
  std::map<std::string, std::string> env;
  if (!prefix.empty()) env["HOME"] = "/tmp";
  return ChildProcess::Start(argv, env, log_path, [limits] { return ApplySandbox(limits); });
}

Status WorkerClient::ReadSpawned(ChildProcess& w, const std::string& log_path) {
  auto word = ReceiveMessage(w.stdout_fd(), 120);
  std::optional<wire::ErrorReply> refused = word.ok() ? wire::ErrorOf(*word) : std::nullopt;
  auto opened = word.ok() && !refused ? wire::FromJson<wire::EmptyReply>(*word) : StatusOr<wire::EmptyReply>(Internal(""));
  if (!word.ok() || refused || !opened.ok())
    return FailStart(w, log_path,
                     !word.ok() ? word.status().message() : refused ? refused->message : opened.status().message());
  return Status::Ok();
}

StatusOr<wire::InitReply> WorkerClient::Initialize(ChildProcess& w, const std::string& log_path,
                                                   const wire::InitRequest& init) {
  if (Status sent = SendMessage(w.stdin_fd(), wire::ToJson(init)); !sent.ok())
    return FailStart(w, log_path, sent.message());
  auto reply = ReceiveMessage(w.stdout_fd(), 120);
  std::optional<wire::ErrorReply> refused = reply.ok() ? wire::ErrorOf(*reply) : std::nullopt;
  auto started = reply.ok() && !refused ? wire::FromJson<wire::InitReply>(*reply) : StatusOr<wire::InitReply>(Internal(""));
  if (!reply.ok() || refused || !started.ok())
    return FailStart(w, log_path,
                     !reply.ok() ? reply.status().message() : refused ? refused->message : started.status().message());
  return started;
}

Status WorkerClient::FailStart(ChildProcess& w, const std::string& log_path, const std::string& why) {
  w.Kill();
  std::string log = log_path == log_path_ ? TakeLog() : "";
  return FailedPrecondition("the GPU worker did not start: " + why + (log.empty() ? "" : "\n" + log));
}

std::string WorkerClient::Stop() {
  std::string how = worker_.Kill();
  ready_ = false;
  spawned_ = awaiting_init_ = false;
  ++restarts_;
  return how;
}

std::string WorkerClient::TakeLog() {
  if (log_path_.empty()) return "";
  // Only the head is read: a printf flood can fill the file up to its size limit.
  std::string s;
  int64_t total = 0;
  {
    UniqueFd fd(open(log_path_.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return "";
    total = lseek(fd.get(), 0, SEEK_END);
    lseek(fd.get(), 0, SEEK_SET);
    s.resize(std::min<int64_t>(std::max<int64_t>(total, 0), log_cap_));
    ssize_t n = s.empty() ? 0 : read(fd.get(), s.data(), s.size());
    s.resize(n > 0 ? n : 0);
  }
  (void)truncate(log_path_.c_str(), 0);
  if (total > static_cast<int64_t>(s.size()))
    s += "\n[... " + std::to_string(total - s.size()) + " more bytes of worker output dropped]\n";
  return s;
}

WorkerClient::StandIn::StandIn(WorkerClient* client, ChildProcess* stand_in)
    : client_(client), stand_in_(stand_in), ready_(client->ready_), restarts_(client->restarts_) {
  std::swap(client_->worker_, *stand_in_);
  client_->ready_ = true;
}

WorkerClient::StandIn::~StandIn() {
  std::swap(client_->worker_, *stand_in_);
  client_->ready_ = ready_;
  client_->restarts_ = restarts_;  // the stand-in's end is no restart of the own worker
}

}  // namespace ks
