#include "server/server.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>

#include "common/files.h"
#include "search/search_config.h"
#include "server/auth.h"
#include "server/job_manager.h"
#include "server/service.h"
#include "server/watch_hub.h"

namespace ks::server {
namespace {

StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeCredentials(const ServerOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) return InvalidArgument("--tls-cert and --tls-key go together");
  if (o.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  KS_ASSIGN_OR_RETURN(pair.cert_chain, ReadFile(o.tls_cert, 1 << 20));
  KS_ASSIGN_OR_RETURN(pair.private_key, ReadFile(o.tls_key, 1 << 20));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(ssl);
}

// "host:port" with a non-loopback host needs TLS: the bearer token would
// otherwise cross the network in clear text.
bool IsLoopback(const std::string& listen) {
  return listen.rfind("127.", 0) == 0 || listen.rfind("localhost:", 0) == 0 || listen.rfind("[::1]:", 0) == 0 ||
         listen.rfind("unix:", 0) == 0;
}

}  // namespace

Status Serve(const ServerOptions& o, const PartsFactory& make_parts) {
  // Every thread created from here on inherits the blocked mask; this one
  // takes the signals with sigwait, so shutdown runs as ordinary code.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  KS_ASSIGN_OR_RETURN(std::string token, LoadToken(o.token_file));
  TokenAuth auth(token);
  KS_ASSIGN_OR_RETURN(auto creds, MakeCredentials(o));
  if (!IsLoopback(o.listen) && o.tls_cert.empty())
    return InvalidArgument("listening on " + o.listen +
                           " beyond loopback needs --tls-cert/--tls-key (the token would travel in clear text)");
  if (o.db_path.empty()) return InvalidArgument("no lineage store path (--db)");
  KS_ASSIGN_OR_RETURN(std::unique_ptr<store::LineageStore> store, store::LineageStore::Open(o.db_path));
  // GPU workers report evaluations here: each is stored under its search's policy (--require robust).
  store->SetEvaluationPolicy(ApplySearchPolicy);
  KS_ASSIGN_OR_RETURN(ServerParts parts, make_parts(store.get()));

  WatchHub hub(store.get(), o.limits.max_watchers,
               std::chrono::milliseconds(static_cast<int64_t>(o.poll_interval_s * 1000)));
  JobManager jobs(store.get(), parts.runner.get(), o.limits.max_running_searches, o.limits.max_queued_searches);
  jobs.SetProgressListener([&hub](int64_t id) { hub.Poke(id); });

  ServiceDeps deps;
  deps.store = store.get();
  deps.jobs = &jobs;
  deps.hub = &hub;
  deps.auth = &auth;
  deps.limits = o.limits;
  deps.load_signature = parts.load_signature;
  deps.make_evaluator = parts.make_evaluator;
  deps.search_base = parts.search_base;
  deps.practice_calls = parts.practice_calls;
  deps.queue_search = [&jobs](int64_t id) { return jobs.Queue(id); };
  KernelSearchService service(std::move(deps));

  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(o.listen, creds, &port);
  // gRPC sets SO_REUSEPORT by default: a second server on the same port would
  // bind too, and clients would be split at random between two stores. One
  // server owns its port; a second one fails here.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(o.limits.max_receive_bytes);
  grpc::ResourceQuota quota("kernelsearch");
  // Bounds the sync pool (unary calls); callback streams do not hold threads.
  quota.SetMaxThreads(o.rpc_threads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0)
    return Unavailable("cannot listen on " + o.listen +
                       ": the address is in use (another `kernelsearch serve`? pick another with --listen) or invalid");

  hub.Start();
  KS_ASSIGN_OR_RETURN(int resumed, jobs.Start());
  std::string host = o.listen.substr(0, o.listen.rfind(':'));
  std::printf("listening on %s:%d\n", host.c_str(), port);
  std::fflush(stdout);
  if (resumed > 0) std::fprintf(stderr, "kernelsearch serve: resuming %d search(es)\n", resumed);

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "kernelsearch serve: %s, shutting down\n", sig == SIGTERM ? "SIGTERM" : "SIGINT");

  // Watchers first, so that none sees a stopping search as ended; then ask the
  // searches to stop (each is left pending in the store at a step boundary,
  // and the next server resumes it); then stop accepting and give calls in
  // flight a grace period before cancelling them (watch streams end there).
  auto t0 = std::chrono::steady_clock::now();
  hub.Stop();
  jobs.RequestStop();
  auto deadline = std::chrono::system_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(o.shutdown_grace_s * 1000));
  server->Shutdown(deadline);
  auto t1 = std::chrono::steady_clock::now();
  jobs.Shutdown();
  server->Wait();
  server.reset();
  auto ms = [](auto a, auto b) { return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count(); };
  std::fprintf(stderr, "kernelsearch serve: stopped (calls %lld ms, searches %lld ms)\n",
               static_cast<long long>(ms(t0, t1)), static_cast<long long>(ms(t1, std::chrono::steady_clock::now())));
  return Status::Ok();
}

}  // namespace ks::server
