// kernelsearch serve: the gRPC server (server/server.h) with the orchestrator as
// its search runner. Searches run with the server's model (--model and the
// other model flags) and evaluator (--evaluator); clients choose only the
// shape and budgets of a search, within the server's bounds.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "cli/cli.h"
#include "cli/llm_flags.h"
#include "evaluator/problem.h"
#include "search/prompt_template.h"
#include "store/lineage_store.h"
#include "server/orchestrator_runner.h"
#include "server/server.h"

namespace ks::cli {
namespace {

struct ServeFlags {
  server::ServerOptions server;
  std::string evaluator;
  std::string gpus;
  std::string python;
  double practice_timeout_s = server::PracticeCallOptions().deadline_s;
  LlmFlags llm;
};

int RunServe(ServeFlags& f) {
  // Its own file by default, beside the CLI's: on start the server resumes
  // every pending or running search of its store, and must not take over one
  // that a local `kernelsearch search` is running in the CLI's file.
  if (f.server.db_path.empty())
    f.server.db_path = (std::filesystem::path(store::DefaultDbPath()).parent_path() / "server.db").string();
  auto prompts = PromptLibrary::LoadDefault();
  if (!prompts.ok()) return ReportError(prompts.status());
  const PromptLibrary prompt_library = std::move(prompts).value();

  SearchConfig base;
  base.model = f.llm.config.spec;
  for (const auto& rs : f.llm.role_models) {
    auto parsed = ParseRoleSpec(rs);
    if (!parsed.ok()) return ReportError(parsed.status());
    base.role_models[parsed->first] = parsed->second;
  }
  // Fail at start, not at the first search, when the model cannot be reached
  // as configured (missing key variable, malformed spec, absent replay file).
  if (auto probe = MakeLlmClientFromFlags(f.llm); !probe.ok()) return ReportError(probe.status());

  server::OrchestratorRunnerOptions ro;
  ro.evaluator.spec = f.evaluator;
  ro.evaluator.python = f.python;
  ro.evaluator.gpus = f.gpus;
  ro.llm = f.llm.config;
  ro.practice.deadline_s = f.practice_timeout_s;
  if (f.llm.temperature >= 0) ro.llm.temperature = f.llm.temperature;
  if (f.llm.max_tokens > 0) ro.llm.max_tokens = f.llm.max_tokens;
  f.server.limits.max_running_searches = std::max(1, f.server.limits.max_running_searches);

  BridgeOptions bridge;
  bridge.python = f.python;
  Status st = server::Serve(f.server, [&](store::LineageStore* store) -> StatusOr<server::ServerParts> {
    server::ServerParts parts;
    auto runner = std::make_unique<server::OrchestratorRunner>(store, &prompt_library, ro);
    parts.practice_calls = runner->practice_calls();  // agents' tool calls for the GPU workers (issue 32)
    parts.runner = std::move(runner);
    parts.load_signature = [bridge](const std::string& path) { return LoadProblemSignature(path, bridge); };
    EvaluatorOptions eo = ro.evaluator;
    // With GPU workers, this server has no GPU of its own: EvaluateKernel says so.
    if (eo.spec != server::kWorkersEvaluator) {
      parts.make_evaluator = [eo](const store::ProblemRow& problem) {
        return server::MakeStoredProblemEvaluator(problem, eo);
      };
    }
    parts.search_base = base;
    return parts;
  });
  if (!st.ok()) return ReportError(st);
  return kExitOk;
}

}  // namespace

void RegisterServeCommand(CLI::App& app) {
  auto* f = new ServeFlags();  // lives as long as the process: CLI11 binds to it
  CLI::App* sub = app.add_subcommand("serve", "Run the gRPC server: searches as jobs, watch, browse");
  sub->add_option("--listen", f->server.listen, "HOST:PORT to listen on (port 0: any free port, printed)")
      ->capture_default_str();
  sub->add_option("--token-file", f->server.token_file, "File holding the bearer token (else $KS_SERVER_TOKEN)");
  sub->add_option("--tls-cert", f->server.tls_cert, "PEM certificate chain (TLS; required beyond loopback)");
  sub->add_option("--tls-key", f->server.tls_key, "PEM private key for --tls-cert");
  sub->add_option("--db", f->server.db_path, "Lineage store (default server.db beside the CLI's lineage.db; the server resumes its unfinished searches)");
  sub->add_option("--evaluator", f->evaluator,
                  "Evaluator: gpu (default), workers (candidates wait for `kernelsearch gpu-worker` processes, "
                  "which lease them over this API; an agent search's tool calls too), or fake[:CONFIG.json] "
                  "for tests");
  AddGpusOption(sub, &f->gpus);
  AddPythonOption(sub, &f->python);
  sub->add_option("--max-running", f->server.limits.max_running_searches, "Searches run at once")
      ->capture_default_str();
  sub->add_option("--max-queued", f->server.limits.max_queued_searches, "Searches waiting at most")
      ->capture_default_str();
  sub->add_option("--max-watchers", f->server.limits.max_watchers, "Open WatchSearch streams at most")
      ->capture_default_str();
  sub->add_option("--max-message-bytes", f->server.limits.max_receive_bytes, "Largest request accepted")
      ->capture_default_str();
  sub->add_option("--max-source-bytes", f->server.limits.max_source_bytes, "Largest problem or kernel source")
      ->capture_default_str();
  sub->add_option("--threads", f->server.rpc_threads, "Threads serving unary calls")->capture_default_str();
  sub->add_option("--poll-interval", f->server.poll_interval_s, "Seconds between store reads for watchers")
      ->capture_default_str();
  sub->add_option("--practice-timeout", f->practice_timeout_s,
                  "With --evaluator workers: seconds an agent waits for a GPU worker to answer one compile, test "
                  "or profile call before the call fails")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 86400.0));
  AddLlmOptions(sub, &f->llm, /*require_model=*/true);
  SetAction(sub, [f] { return RunServe(*f); });
}

}  // namespace ks::cli
