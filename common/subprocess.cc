#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "common/files.h"

extern char** environ;

namespace ks {
namespace {

using Clock = std::chrono::steady_clock;

// A child that exits before reading its stdin must give us EPIPE, not a
// SIGPIPE that ends this whole process.
void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] { signal(SIGPIPE, SIG_IGN); });
}

std::string DescribeWait(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) +
                                  " (" + strsignal(WTERMSIG(status)) + ")";
  return "unknown wait status";
}

// Builds the child's environment as owned strings.
std::vector<std::string> BuildEnv(const std::map<std::string, std::string>& add,
                                  const std::vector<std::string>& unset) {
  std::vector<std::string> out;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    std::string key = kv.substr(0, kv.find('='));
    if (add.count(key)) continue;
    bool drop = false;
    for (const auto& u : unset) drop = drop || (u == key);
    if (!drop) out.push_back(std::move(kv));
  }
  for (const auto& [k, v] : add) out.push_back(k + "=" + v);
  return out;
}

struct Pipe {
  UniqueFd r, w;
};

StatusOr<Pipe> MakePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return PosixError("pipe2", errno);
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Forks and execs. child_in/out/err are the fds the child gets as 0/1/2 (-1: inherit).
StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                      int child_in, int child_out, int child_err, const std::string& cwd,
                      const std::function<int()>& in_child) {
  if (argv.empty()) return InvalidArgument("empty command line");
  auto exe = FindOnPath(argv[0]);
  if (!exe) return NotFound("program not found: " + argv[0]);
  std::vector<char*> cargv, cenv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  auto err_pipe = MakePipe();  // reports exec failure to the parent
  if (!err_pipe.ok()) return err_pipe.status();
  pid_t pid = fork();
  if (pid < 0) return PosixError("fork", errno);
  if (pid == 0) {
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);  // ours is ignored; an ignored signal would survive exec
    if (child_in >= 0) dup2(child_in, 0);
    if (child_out >= 0) dup2(child_out, 1);
    if (child_err >= 0) dup2(child_err, 2);
    if (!cwd.empty() && chdir(cwd.c_str()) != 0) _exit(126);
    if (in_child) {
      int rc = in_child();
      if (rc != 0) {
        int e = -rc;
        (void)!write(err_pipe->w.get(), &e, sizeof e);
        _exit(rc & 0x7f);
      }
    }
    execve(exe->c_str(), cargv.data(), cenv.data());
    int e = errno;
    (void)!write(err_pipe->w.get(), &e, sizeof e);
    _exit(127);
  }
  err_pipe->w.reset();
  int child_errno = 0;
  ssize_t n;
  do n = read(err_pipe->r.get(), &child_errno, sizeof child_errno); while (n < 0 && errno == EINTR);
  if (n == sizeof child_errno) {
    int st;
    waitpid(pid, &st, 0);
    return PosixError("starting " + *exe, child_errno > 0 ? child_errno : EPERM);
  }
  return pid;
}

}  // namespace

std::string SubprocessResult::Describe() const {
  if (timed_out) return "timed out after " + std::to_string(wall_s) + " s";
  if (term_signal) return std::string("killed by signal ") + std::to_string(term_signal) + " (" + strsignal(term_signal) + ")";
  return "exit code " + std::to_string(exit_code);
}

std::optional<std::string> FindOnPath(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    if (end == std::string::npos) end = p.size();
    std::string dir = p.substr(start, end - start);
    if (dir.empty()) dir = ".";
    std::string cand = dir + "/" + program;
    if (access(cand.c_str(), X_OK) == 0) return cand;
    start = end + 1;
  }
  return std::nullopt;
}

StatusOr<SubprocessResult> RunSubprocess(const SubprocessOptions& opts) {
  IgnoreSigpipe();
  KS_ASSIGN_OR_RETURN(Pipe in, MakePipe());
  KS_ASSIGN_OR_RETURN(Pipe out, MakePipe());
  KS_ASSIGN_OR_RETURN(Pipe err, MakePipe());
  auto start = Clock::now();
  KS_ASSIGN_OR_RETURN(pid_t pid, Spawn(opts.argv, BuildEnv(opts.env, opts.unset_env), in.r.get(),
                                       out.w.get(), err.w.get(), opts.cwd, opts.in_child));
  in.r.reset();
  out.w.reset();
  err.w.reset();
  for (int fd : {in.w.get(), out.r.get(), err.r.get()}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);

  SubprocessResult res;
  size_t written = 0;
  if (opts.stdin_data.empty()) in.w.reset();
  bool out_open = true, err_open = true;
  auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(opts.timeout_s));
  char buf[65536];
  while (out_open || err_open) {
    auto now = Clock::now();
    if (now >= deadline) {
      res.timed_out = true;
      break;
    }
    pollfd fds[3];
    int nfds = 0;
    int out_idx = -1, err_idx = -1, in_idx = -1;
    if (out_open) { out_idx = nfds; fds[nfds++] = {out.r.get(), POLLIN, 0}; }
    if (err_open) { err_idx = nfds; fds[nfds++] = {err.r.get(), POLLIN, 0}; }
    if (in.w.valid()) { in_idx = nfds; fds[nfds++] = {in.w.get(), POLLOUT, 0}; }
    int ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) + 1;
    int pr = poll(fds, nfds, ms);
    if (pr < 0 && errno != EINTR) break;
    if (pr <= 0) continue;
    auto drain = [&](int idx, UniqueFd& fd, std::string& dst, bool& trunc, bool& open) {
      if (idx < 0 || !(fds[idx].revents & (POLLIN | POLLHUP | POLLERR))) return;
      ssize_t n = read(fd.get(), buf, sizeof buf);
      if (n > 0) {
        size_t room = opts.max_output_bytes > dst.size() ? opts.max_output_bytes - dst.size() : 0;
        if (static_cast<size_t>(n) > room) trunc = true;
        dst.append(buf, std::min<size_t>(n, room));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        open = false;
      }
    };
    drain(out_idx, out.r, res.out, res.stdout_truncated, out_open);
    drain(err_idx, err.r, res.err, res.stderr_truncated, err_open);
    if (in_idx >= 0 && (fds[in_idx].revents & (POLLOUT | POLLERR | POLLHUP))) {
      ssize_t n = write(in.w.get(), opts.stdin_data.data() + written, opts.stdin_data.size() - written);
      if (n > 0) written += n;
      if (n < 0 && errno != EAGAIN && errno != EINTR) in.w.reset();
      if (written >= opts.stdin_data.size()) in.w.reset();
    }
  }
  if (res.timed_out) kill(-pid, SIGKILL), kill(pid, SIGKILL);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  // The process group may hold grandchildren that keep pipes open; end them too.
  kill(-pid, SIGKILL);
  res.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (WIFEXITED(st)) res.exit_code = WEXITSTATUS(st);
  if (WIFSIGNALED(st)) res.term_signal = WTERMSIG(st);
  if (res.timed_out) res.term_signal = SIGKILL;
  return res;
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) Kill();
}

ChildProcess::ChildProcess(ChildProcess&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), in_(std::move(o.in_)), out_(std::move(o.out_)) {}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0) Kill();
    pid_ = std::exchange(o.pid_, -1);
    in_ = std::move(o.in_);
    out_ = std::move(o.out_);
  }
  return *this;
}

StatusOr<ChildProcess> ChildProcess::Start(const std::vector<std::string>& argv,
                                           const std::map<std::string, std::string>& env,
                                           const std::string& stderr_path, std::function<int()> in_child) {
  IgnoreSigpipe();
  KS_ASSIGN_OR_RETURN(Pipe in, MakePipe());
  KS_ASSIGN_OR_RETURN(Pipe out, MakePipe());
  UniqueFd err_fd;
  if (!stderr_path.empty()) {
    err_fd.reset(open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600));
    if (!err_fd.valid()) return PosixError(stderr_path, errno);
  }
  KS_ASSIGN_OR_RETURN(pid_t pid, Spawn(argv, BuildEnv(env, {}), in.r.get(), out.w.get(),
                                       err_fd.valid() ? err_fd.get() : -1, "", in_child));
  ChildProcess c;
  c.pid_ = pid;
  c.in_ = std::move(in.w);
  c.out_ = std::move(out.r);
  return c;
}

std::string ChildProcess::Kill() {
  if (pid_ <= 0) return "not running";
  kill(-pid_, SIGKILL);
  kill(pid_, SIGKILL);
  int st = 0;
  while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {}
  pid_ = -1;
  in_.reset();
  out_.reset();
  return DescribeWait(st);
}

std::optional<std::string> ChildProcess::TryReap() {
  if (pid_ <= 0) return "not running";
  int st = 0;
  pid_t r = waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    pid_ = -1;
    return DescribeWait(st);
  }
  return std::nullopt;
}

Status WriteAll(int fd, const void* data, size_t n) {
  IgnoreSigpipe();
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd pfd{fd, POLLOUT, 0};
        poll(&pfd, 1, 1000);
        continue;
      }
      return PosixError("write", errno);
    }
    p += w;
    n -= w;
  }
  return Status::Ok();
}

Status ReadExact(int fd, void* data, size_t n, double timeout_s) {
  char* p = static_cast<char*>(data);
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (n > 0) {
    int ms = -1;
    if (timeout_s >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return DeadlineExceeded("no answer within " + std::to_string(timeout_s) + " s");
      ms = static_cast<int>(left);
    }
    pollfd pfd{fd, POLLIN, 0};
    int pr = poll(&pfd, 1, ms);
    if (pr < 0) {
      if (errno == EINTR) continue;
      return PosixError("poll", errno);
    }
    if (pr == 0) continue;
    ssize_t r = read(fd, p, n);
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return PosixError("read", errno);
    }
    if (r == 0) return Unavailable("the other side closed the pipe");
    p += r;
    n -= r;
  }
  return Status::Ok();
}

}  // namespace ks
