// `kernelsearch serve`: opens the store, resumes interrupted searches, listens
// (loopback unless told otherwise, TLS when given a certificate), and runs
// until SIGTERM or SIGINT, then shuts down in order: stop accepting, end the
// streams, stop running searches leaving them resumable, close the store.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "evaluator/evaluator_api.h"
#include "evaluator/signature.h"
#include "search/search_config.h"
#include "store/lineage_store.h"
#include "server/limits.h"
#include "server/practice_calls.h"
#include "server/search_runner.h"

namespace ks::server {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // port 0: an ephemeral one, printed on stdout
  std::string token_file;                  // "" = $KS_SERVER_TOKEN
  std::string tls_cert;                    // PEM; both or neither
  std::string tls_key;
  std::string db_path;                     // the lineage store
  ServerLimits limits;
  int rpc_threads = 64;                    // the sync pool serving unary calls; beyond it, RESOURCE_EXHAUSTED
  double poll_interval_s = 0.25;           // how often watched searches are re-read
  double shutdown_grace_s = 3;             // in-flight calls get this long on SIGTERM
};

// Built once the store is open (the runner reads and writes it).
struct ServerParts {
  std::unique_ptr<SearchRunner> runner;
  std::function<StatusOr<Signature>(const std::string& path)> load_signature;
  std::function<StatusOr<std::unique_ptr<CandidateEvaluator>>(const store::ProblemRow& problem)> make_evaluator;
  SearchConfig search_base;  // see ServiceDeps::search_base
  // Agents' practice calls for GPU workers (ServiceDeps::practice_calls);
  // owned by the runner, null without GPU workers.
  PracticeCalls* practice_calls = nullptr;
};
using PartsFactory = std::function<StatusOr<ServerParts>(store::LineageStore* store)>;

// Blocks until SIGTERM/SIGINT. Prints "listening on HOST:PORT" on stdout (one
// line, flushed) once it accepts calls. Must be called from the main thread
// before any other thread exists (it blocks the signals in every thread and
// waits for them in this one).
Status Serve(const ServerOptions& options, const PartsFactory& make_parts);

}  // namespace ks::server
