#include "common/subprocess.h"

#include <gtest/gtest.h>

namespace ks {
namespace {

TEST(SubprocessTest, PassesStdinAndCapturesBothStreams) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "cat; echo err >&2; exit 3"};
  o.stdin_data = "hello";
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->out, "hello");
  EXPECT_EQ(r->err, "err\n");
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_FALSE(r->Succeeded());
}

TEST(SubprocessTest, KillsAChildThatOverrunsItsTimeLimit) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "sleep 30"};
  o.timeout_s = 0.3;
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->timed_out);
  EXPECT_LT(r->wall_s, 5.0);
}

TEST(SubprocessTest, CapsOutput) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "head -c 100000 /dev/zero"};
  o.max_output_bytes = 1000;
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->out.size(), 1000u);
  EXPECT_TRUE(r->stdout_truncated);
}

TEST(SubprocessTest, MissingProgramIsNotFound) {
  SubprocessOptions o;
  o.argv = {"no-such-program-ks"};
  auto r = RunSubprocess(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
}

TEST(SubprocessTest, SetsEnvironment) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", "printf %s \"$KS_X\""};
  o.env["KS_X"] = "42";
  auto r = RunSubprocess(o);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->out, "42");
}

TEST(ChildProcessTest, TalksOverPipesAndIsKilledOnDestruction) {
  auto c = ChildProcess::Start({"/bin/cat"}, {}, "");
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(WriteAll(c->stdin_fd(), "abcd", 4).ok());
  char buf[4];
  ASSERT_TRUE(ReadExact(c->stdout_fd(), buf, 4, 5).ok());
  EXPECT_EQ(std::string(buf, 4), "abcd");
  Status s = ReadExact(c->stdout_fd(), buf, 1, 0.1);
  EXPECT_EQ(s.code(), Code::kDeadlineExceeded);
  EXPECT_FALSE(c->TryReap().has_value());
  c->Kill();
  EXPECT_FALSE(c->running());
}

}  // namespace
}  // namespace ks
