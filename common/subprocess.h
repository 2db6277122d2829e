// Running another program: one-shot (RunSubprocess, with stdin text, captured and
// capped output, and a wall-clock limit) and long-lived (ChildProcess, an owned
// child with pipes that is killed and reaped when the object dies).
// Not thread-safe per object; separate objects may be used from separate threads.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace ks {

struct SubprocessOptions {
  std::vector<std::string> argv;          // argv[0] is looked up on PATH
  std::string stdin_data;                 // written to the child's stdin, then closed
  double timeout_s = 60;                  // wall clock; the child is killed after it
  std::map<std::string, std::string> env; // set (added or replaced) in the child
  std::vector<std::string> unset_env;     // removed from the child's environment
  size_t max_output_bytes = 64 << 20;     // per stream; the rest is discarded
  std::string cwd;                        // empty: inherit
  // Runs in the child after fork, before exec (sandboxing). Must be
  // async-signal-safe; a non-zero return aborts the exec with that exit code.
  std::function<int()> in_child;
};

struct SubprocessResult {
  int exit_code = -1;        // valid when term_signal == 0
  int term_signal = 0;       // signal that ended the child, if any
  bool timed_out = false;
  bool stdout_truncated = false;
  bool stderr_truncated = false;
  std::string out;
  std::string err;
  double wall_s = 0;
  bool Succeeded() const { return !timed_out && term_signal == 0 && exit_code == 0; }
  std::string Describe() const;  // "exit code 3", "killed by signal 9", "timed out after ..."
};

// Fails only when the child cannot be started; a child that fails is a result.
StatusOr<SubprocessResult> RunSubprocess(const SubprocessOptions& opts);

// A long-lived child with stdin/stdout pipes (stderr inherited or to a file).
// Killed with SIGKILL and reaped on destruction. Move-only.
class ChildProcess {
 public:
  ChildProcess() = default;
  ~ChildProcess();
  ChildProcess(ChildProcess&& o) noexcept;
  ChildProcess& operator=(ChildProcess&& o) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // stderr_path: where the child's stderr goes ("" = inherit).
  static StatusOr<ChildProcess> Start(const std::vector<std::string>& argv,
                                      const std::map<std::string, std::string>& env,
                                      const std::string& stderr_path,
                                      std::function<int()> in_child = nullptr);

  pid_t pid() const { return pid_; }
  int stdin_fd() const { return in_.get(); }
  int stdout_fd() const { return out_.get(); }
  bool running() const { return pid_ > 0; }
  // Closes our end of the child's stdin (the child reads EOF).
  void CloseStdin() { in_.reset(); }
  // Our end of the child's stdin, handed over: whoever holds it decides when
  // the child reads EOF (a kept bridge's first lease).
  UniqueFd TakeStdin() { return std::move(in_); }

  // SIGKILL and reap. Returns the wait status description.
  std::string Kill();
  // Non-blocking check; returns a description if the child has exited.
  std::optional<std::string> TryReap();

 private:
  pid_t pid_ = -1;
  UniqueFd in_;
  UniqueFd out_;
};

// Writes all of `data` to fd (retrying on EINTR/partial writes).
Status WriteAll(int fd, const void* data, size_t n);
// Reads exactly n bytes, waiting at most timeout_s (< 0: forever).
// DeadlineExceeded on time out, Unavailable on EOF.
Status ReadExact(int fd, void* data, size_t n, double timeout_s);

// Looks a program up on PATH (or returns it when it contains '/').
std::optional<std::string> FindOnPath(const std::string& program);

}  // namespace ks
