#include "evaluator/worker/sandbox.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <grp.h>

#include <cerrno>

namespace ks {
namespace {
int Limit(int resource, int64_t value) {
  rlimit rl;
  rl.rlim_cur = rl.rlim_max = static_cast<rlim_t>(value);
  return setrlimit(resource, &rl) == 0 ? 0 : -errno;
}
}  // namespace

int ApplySandbox(const SandboxLimits& l) {
  if (l.die_with_parent) prctl(PR_SET_PDEATHSIG, SIGKILL);
  // No core dumps: a crashing kernel's memory image must not land on disk.
  if (int rc = Limit(RLIMIT_CORE, 0)) return rc;
  if (!l.keep_dumpable) prctl(PR_SET_DUMPABLE, 0);
  if (l.file_size_bytes > 0)
    if (int rc = Limit(RLIMIT_FSIZE, l.file_size_bytes)) return rc;
  if (l.open_files > 0)
    if (int rc = Limit(RLIMIT_NOFILE, l.open_files)) return rc;
  if (l.address_space_bytes > 0)
    if (int rc = Limit(RLIMIT_AS, l.address_space_bytes)) return rc;
  if (l.cpu_seconds > 0)
    if (int rc = Limit(RLIMIT_CPU, l.cpu_seconds)) return rc;
  // No network: a fresh namespace has only a down loopback. Needs CAP_SYS_ADMIN
  // (root) or user namespaces; without them we go on without it.
  if (l.new_network_namespace) (void)unshare(CLONE_NEWNET);
  if (l.drop_privileges && geteuid() == 0) {
    const gid_t kNobodyGid = 65534;
    const uid_t kNobodyUid = 65534;
    if (setgroups(1, &kNobodyGid) != 0) return -errno;
    if (setgid(kNobodyGid) != 0) return -errno;
    if (setuid(kNobodyUid) != 0) return -errno;
    // Processes and threads, counted per user: as nobody that is just this
    // child (CUDA starts a handful of threads). Not applied to our own user,
    // whose other processes would count against it.
    if (l.max_processes > 0)
      if (int rc = Limit(RLIMIT_NPROC, l.max_processes)) return rc;
  }
  // No new privileges from set-uid binaries the child might exec.
  prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
  return 0;
}

}  // namespace ks
