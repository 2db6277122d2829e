// The real KernelSearchService on an in-process gRPC channel, for tests of the
// service's calls: a lineage store in a fresh directory, a job manager whose
// runner never runs (searches stay queued), a watch hub, token auth and a stub.
// In tests/server/ rather than tests/testing/: it links ks_server. A test
// fixture derives from ServiceTest, fills the store in SetUp (after
// ServiceTest::SetUp) and calls StartService, giving the ServiceDeps it needs
// beyond these (queue_search, practice_calls). Not thread-safe; one per test.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "proto/kernelsearch.grpc.pb.h"
#include "server/auth.h"
#include "server/job_manager.h"
#include "server/search_runner.h"
#include "server/service.h"
#include "server/watch_hub.h"
#include "store/lineage_store.h"
#include "tests/testing/temp_dir.h"

namespace ks::server {

// A runner for a job manager that is never started.
class NeverRunner final : public SearchRunner {
 public:
  Status Run(int64_t, const std::atomic<bool>*, const std::function<void()>&) override {
    return Internal("the job manager is not started in this test");
  }
};

class ServiceTest : public ::testing::Test {
 protected:
  static constexpr char kToken[] = "service-test-token";

  void SetUp() override {
    auto s = store::LineageStore::Open((dir_ / "lineage.db").string());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(*s);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Starts the service on store_; `more` adds to the deps (store, jobs, hub and auth are set).
  void StartService(const std::function<void(ServiceDeps&)>& more = {}) {
    jobs_ = std::make_unique<JobManager>(store_.get(), &runner_, 1, 4);
    hub_ = std::make_unique<WatchHub>(store_.get(), 8, std::chrono::milliseconds(100));
    ServiceDeps deps;
    deps.store = store_.get();
    deps.jobs = jobs_.get();
    deps.hub = hub_.get();
    deps.auth = &auth_;
    if (more) more(deps);
    service_ = std::make_unique<KernelSearchService>(std::move(deps));
    grpc::ServerBuilder builder;
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_);
    stub_ = ::kernelsearch::v1::KernelSearch::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

  // A call's context, with the token unless `with_token` is false.
  static void Authorize(grpc::ClientContext* ctx, bool with_token = true) {
    if (with_token) ctx->AddMetadata("authorization", std::string("Bearer ") + kToken);
  }

  // Declared first: outlives the store in it.
  ks::testing::TempDir dir_{"ks_service_test_"};
  std::unique_ptr<store::LineageStore> store_;
  NeverRunner runner_;
  TokenAuth auth_{kToken};
  std::unique_ptr<JobManager> jobs_;
  std::unique_ptr<WatchHub> hub_;
  std::unique_ptr<KernelSearchService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<::kernelsearch::v1::KernelSearch::Stub> stub_;
};

}  // namespace ks::server
