// What a sandboxed child gets (evaluator/worker/sandbox.h): no core dumps, bounded file
// size and open files, and when we are root: nobody's uid, a process cap and
// its own network namespace with only a loopback device.
#include "evaluator/worker/sandbox.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>

#include "common/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace ks {
namespace {

// Whether this machine lets us make a network namespace (containers may not).
bool CanUnshareNetwork() {
  pid_t pid = fork();
  if (pid == 0) _exit(unshare(CLONE_NEWNET) == 0 ? 0 : 1);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

TEST(SandboxTest, AChildGetsTheLimits) {
  SandboxLimits limits;
  limits.file_size_bytes = 1 << 20;
  limits.open_files = 64;
  SubprocessOptions o;
  // /proc/self/limits names each limit; /proc/net/dev lists one device per line after two header lines.
  o.argv = {"/bin/sh", "-c",
            "grep -E '^Max (core file size|file size|open files|processes) ' /proc/self/limits | "
            "awk '{print $(NF-2)}'; id -u; tail -n +3 /proc/net/dev | wc -l"};
  o.in_child = [limits] { return ApplySandbox(limits); };
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->Succeeded()) << r->Describe() << r->err;
  // In the kernel's order: file size, core file size, processes, open files (soft limits).
  std::istringstream in(r->out);
  std::string nproc, fsize, core, nofile, uid, netdevs;
  in >> fsize >> core >> nproc >> nofile >> uid >> netdevs;
  EXPECT_EQ(core, "0") << r->out;
  EXPECT_EQ(fsize, "1048576") << r->out;
  EXPECT_EQ(nofile, "64") << r->out;
  if (geteuid() == 0) {
    EXPECT_EQ(uid, "65534");
    EXPECT_EQ(nproc, "256");
    if (CanUnshareNetwork()) EXPECT_EQ(netdevs, "1") << "a fresh network namespace has only lo";
  } else {
    EXPECT_EQ(uid, std::to_string(geteuid()));
  }
}

TEST(SandboxTest, AWriteBeyondTheFileSizeLimitFails) {
  SandboxLimits limits;
  limits.file_size_bytes = 4096;
  limits.drop_privileges = false;
  ks::testing::TempDir dir("ks_sandbox_big_");
  std::string path = (dir / "big").string();
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "trap '' XFSZ; head -c 100000 /dev/zero > " + path + "; echo rc=$?; wc -c < " + path};
  o.in_child = [limits] { return ApplySandbox(limits); };
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok());
  EXPECT_THAT(r->out, ::testing::HasSubstr("4096"));
  EXPECT_THAT(r->out, ::testing::Not(::testing::HasSubstr("rc=0")));
}

}  // namespace
}  // namespace ks
