// WorkerClient's two-step start (issue 33) with the real ks-worker: `serve
// --device N` says first whether it opened the GPU's context (before any
// request), Start then initializes it; Start without Spawn (the restart after
// a crash) does both. On a machine without a GPU the word is the driver's
// error; with one, a bad InitRequest is refused after the context opened.
#include "evaluator/worker/worker_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>

#include "evaluator/worker/sandbox.h"
#include "evaluator/worker/worker_protocol.h"

namespace ks {
namespace {

using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST(WorkerClientTest, TheSpawnedWorkerSaysAtOnceWhetherItsContextOpened) {
  WorkerClient client(KS_WORKER_PATH, /*drop_privileges=*/false, 64 * 1024);
  auto t0 = Clock::now();
  ASSERT_TRUE(client.Spawn(0).ok());
  EXPECT_FALSE(client.ready());
  Status opened = client.AwaitSpawned();  // no request sent: the word comes unasked
  EXPECT_LT(SecondsSince(t0), 60);
  if (!opened.ok()) {  // no GPU here: the driver's error, the worker gone
    EXPECT_EQ(opened.code(), Code::kFailedPrecondition);
    EXPECT_THAT(opened.message(), HasSubstr("the GPU worker did not start"));
  }
  EXPECT_TRUE(client.AwaitSpawned().ok()) << "read once";
  // The InitRequest is refused (no arena), after the context: a start that
  // fails with the worker's reason rather than hangs.
  wire::InitRequest init;
  init.device = 0;
  Status started = client.Start(init);
  ASSERT_FALSE(started.ok());
  EXPECT_THAT(started.message(), HasSubstr("the GPU worker did not start"));
  if (opened.ok()) {
    EXPECT_THAT(started.message(), HasSubstr("bad IPC handle"));
  }
  EXPECT_FALSE(client.ready());
  client.Close();
}

TEST(WorkerClientTest, StartWithoutSpawnStartsAFreshWorker) {
  WorkerClient client(KS_WORKER_PATH, false, 64 * 1024);
  wire::InitRequest init;
  init.device = 0;
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second as after a crash: Stop, then Start
    auto t0 = Clock::now();
    Status started = client.Start(init);
    EXPECT_LT(SecondsSince(t0), 60);
    ASSERT_FALSE(started.ok());
    EXPECT_THAT(started.message(), HasSubstr("the GPU worker did not start"));
    client.Stop();
  }
  EXPECT_EQ(client.restarts(), 2);
}

TEST(WorkerClientTest, ABadDeviceArgumentIsAFatalFirstWord) {
  SandboxLimits limits;
  limits.drop_privileges = false;
  auto w = ChildProcess::Start({KS_WORKER_PATH, "serve", "--device", "zero"}, {}, "",
                               [limits] { return ApplySandbox(limits); });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto word = ReceiveMessage(w->stdout_fd(), 60);
  ASSERT_TRUE(word.ok()) << word.status().ToString();
  auto refused = wire::ErrorOf(*word);
  ASSERT_TRUE(refused.has_value()) << word->dump();
  EXPECT_TRUE(refused->fatal);
  w->Kill();
}

}  // namespace
}  // namespace ks
