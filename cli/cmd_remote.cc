// The client side of the gRPC service: submit (a problem file, then a search),
// watch, cancel, and `remote history|best|show|lineage|eval` to browse a
// server's store or evaluate a kernel there. Browsing a remote store is its own
// `remote` group so that the local commands keep their flags and meaning.
//
// Every command takes --server HOST:PORT (else $KS_SERVER), --token-file (else
// $KS_SERVER_TOKEN) and --tls-ca for a server with TLS.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "cli/cli.h"
#include "cli/conn_flags.h"
#include "common/files.h"
#include "evaluator/compile/candidate_parser.h"
#include "server/auth.h"
#include "server/client.h"

namespace ks::cli {

void AddConnOptions(CLI::App* sub, ConnFlags* c) {
  sub->add_option("--server", c->server, "HOST:PORT of `kernelsearch serve` (else $KS_SERVER)");
  sub->add_option("--token-file", c->token_file, "File holding the bearer token (else $KS_SERVER_TOKEN)");
  sub->add_option("--tls-ca", c->tls_ca, "PEM of the CA that signed the server's certificate (TLS)");
  sub->add_option("--timeout", c->timeout_s, "Seconds per call")->capture_default_str();
}

StatusOr<server::ClientOptions> ResolveConnFlags(const ConnFlags& c) {
  server::ClientOptions o;
  o.address = c.server;
  if (o.address.empty()) {
    if (const char* e = std::getenv("KS_SERVER"); e && *e) o.address = e;
  }
  KS_ASSIGN_OR_RETURN(o.token, server::LoadToken(c.token_file));
  o.tls_ca = c.tls_ca;
  o.timeout_s = c.timeout_s;
  return o;
}

namespace {

namespace pb = ::kernelsearch::v1;

using Conn = ConnFlags;

StatusOr<std::unique_ptr<server::Client>> Connect(const Conn& c) {
  KS_ASSIGN_OR_RETURN(server::ClientOptions o, ResolveConnFlags(c));
  return server::Client::Connect(o);
}

const char* StateName(pb::SearchState s) {
  switch (s) {
    case pb::QUEUED: return "queued";
    case pb::RUNNING: return "running";
    case pb::SUCCEEDED: return "finished";
    case pb::FAILED: return "failed";
    case pb::CANCELLED: return "cancelled";
    default: return "unknown";
  }
}

std::string Speedup(double s) { return s > 0 ? fmt::format("{:.2f}x", s) : "-"; }

void PrintInfo(const pb::SearchInfo& s) {
  // Rounds as --rounds counts them: improvement rounds after round 0, done/asked.
  std::printf("search %s  problem %s (%s)  %s  rounds %d/%d  evaluated %d  correct %d  best %s%s  $%.2f%s\n",
              s.search_id().c_str(), s.problem_id().c_str(), s.problem_name().c_str(), StateName(s.state()),
              std::max(0, s.rounds_done() - 1), s.config().rounds(), s.candidates_evaluated(), s.candidates_correct(), Speedup(s.best_speedup()).c_str(),
              s.best_candidate_id().empty() ? "" : (" (candidate " + s.best_candidate_id() + ")").c_str(),
              s.cost_usd(), s.stop_reason().empty() ? "" : ("  [" + s.stop_reason() + "]").c_str());
  if (s.failed_llm_calls() > 0)
    std::printf("  %d failed model calls; first: %s\n", s.failed_llm_calls(), s.first_llm_error().c_str());
}

void PrintEvent(const pb::SearchEvent& e) {
  switch (e.event_case()) {
    case pb::SearchEvent::kSnapshot: std::printf("snapshot: "); PrintInfo(e.snapshot()); break;
    case pb::SearchEvent::kRoundStarted: std::printf("round %d started\n", e.round_started().round()); break;
    case pb::SearchEvent::kIdeaProposed:
      std::printf("idea %s (round %d): %s\n", e.idea_proposed().idea_id().c_str(), e.idea_proposed().round(),
                  e.idea_proposed().text().substr(0, 200).c_str());
      break;
    case pb::SearchEvent::kCandidateEvaluated: {
      const auto& c = e.candidate_evaluated();
      std::printf("candidate %s: %s %s\n", c.candidate_id().c_str(), c.status().c_str(),
                  c.status() == "correct" ? fmt::format("{:.4f} ms, {}", c.median_ms(), Speedup(c.speedup_eager())).c_str()
                                          : c.message().substr(0, 160).c_str());
      break;
    }
    case pb::SearchEvent::kNewBest:
      std::printf("new best: candidate %s, %s\n", e.new_best().candidate_id().c_str(),
                  Speedup(e.new_best().speedup_eager()).c_str());
      break;
    case pb::SearchEvent::kFinished: std::printf("finished: "); PrintInfo(e.finished()); break;
    default: break;
  }
  std::fflush(stdout);
}

// Exit code of a watched search: 0 finished, 1 failed or cancelled.
int WatchToEnd(server::Client& client, const std::string& id) {
  pb::SearchState final_state = pb::SEARCH_STATE_UNSPECIFIED;
  Status st = client.Watch(id, [&](const pb::SearchEvent& e) {
    PrintEvent(e);
    if (e.has_finished()) final_state = e.finished().state();
  });
  if (!st.ok()) return ReportError(st);
  if (final_state == pb::SEARCH_STATE_UNSPECIFIED)
    return ReportError(Unavailable("the server ended the stream before the search finished (shutting down?)"));
  return final_state == pb::SUCCEEDED ? kExitOk : kExitFailed;
}

struct SubmitFlags {
  Conn conn;
  std::string problem;
  std::string name;
  pb::SearchConfig config;
  int rounds = 0, ideas = 0, branches = 0, beam = 0, repairs = -1;
  double budget_usd = 0, budget_minutes = 0, target = 0;
  int64_t budget_calls = 0, budget_tokens = 0;
  std::string require, precision;
  std::string implement;
  int agent_turns = 0, agent_tool_calls = 0;
  int64_t agent_tokens = 0;
  bool watch = false;
  bool no_start = false;
};

int RunSubmit(const SubmitFlags& f) {
  auto source = ReadFile(f.problem, 64 << 20);
  if (!source.ok()) return ReportError(source.status());
  auto client = Connect(f.conn);
  if (!client.ok()) return ReportError(client.status());
  pb::SubmitProblemRequest sreq;
  sreq.set_name(f.name.empty() ? std::filesystem::path(f.problem).stem().string() : f.name);
  sreq.set_source(*source);
  auto submitted = (*client)->SubmitProblem(sreq);
  if (!submitted.ok()) return ReportError(submitted.status());
  std::fprintf(stderr, "problem %s: %zu inputs, %zu parameters, %zu outputs\n", submitted->problem_id().c_str(),
               static_cast<size_t>(submitted->signature().inputs_size()),
               static_cast<size_t>(submitted->signature().parameters_size()),
               static_cast<size_t>(submitted->signature().outputs_size()));
  if (f.no_start) {
    std::printf("%s\n", submitted->problem_id().c_str());
    return kExitOk;
  }
  pb::StartSearchRequest req;
  req.set_problem_id(submitted->problem_id());
  pb::SearchConfig* c = req.mutable_config();
  c->set_rounds(f.rounds);
  c->set_ideas_per_round(f.ideas);
  c->set_branches(f.branches);
  c->set_beam(f.beam);
  if (f.repairs >= 0) c->set_repair_attempts(f.repairs);
  c->set_budget_usd(f.budget_usd);
  c->set_budget_calls(f.budget_calls);
  c->set_budget_tokens(f.budget_tokens);
  c->set_budget_minutes(f.budget_minutes);
  c->set_target_speedup(f.target);
  c->set_require_robust(f.require == "robust");
  c->set_precision(f.precision);
  c->set_implement(f.implement);
  c->set_agent_turns(f.agent_turns);
  c->set_agent_tool_calls(f.agent_tool_calls);
  c->set_agent_tokens(f.agent_tokens);
  auto started = (*client)->StartSearch(req);
  if (!started.ok()) return ReportError(started.status());
  std::printf("%s\n", started->search_id().c_str());
  std::fflush(stdout);
  if (!f.watch) return kExitOk;
  return WatchToEnd(**client, started->search_id());
}

void PrintCandidate(const pb::CandidateDetail& d, bool full) {
  const auto& s = d.summary();
  std::printf("candidate %s  search %s  round %d  %s  %s  parent %s\n", s.candidate_id().c_str(),
              s.search_id().c_str(), s.round(), s.status().c_str(),
              s.status() == "correct" ? fmt::format("{:.4f} ms {}", s.median_ms(), Speedup(s.speedup_eager())).c_str()
                                      : s.message().substr(0, 160).c_str(),
              s.parent_id().empty() ? "-" : s.parent_id().c_str());
  if (!d.idea_text().empty()) std::printf("idea: %s\n", d.idea_text().c_str());
  if (full) std::printf("```cuda\n%s\n```\n```json\n%s\n```\n", d.source().c_str(), d.plan_json().c_str());
}

struct BrowseFlags {
  Conn conn;
  std::string id;
  std::string problem;
  bool by_problem = false;
  bool json = false;
};

}  // namespace

void RegisterRemoteCommands(CLI::App& app) {
  {
    auto* f = new SubmitFlags();  // CLI11 binds to it for the life of the process
    CLI::App* sub = app.add_subcommand("submit", "Submit a problem to a server and start a search; prints its id");
    sub->add_option("problem", f->problem, "Problem .py (KernelBench format)")->required();
    AddConnOptions(sub, &f->conn);
    sub->add_option("--name", f->name, "Name for listings (default: the file stem)");
    sub->add_option("--rounds", f->rounds, "Improvement rounds (0: server default)");
    sub->add_option("--ideas", f->ideas, "Ideas per beam kernel per round");
    sub->add_option("--branches", f->branches, "Implementations per idea");
    sub->add_option("--beam", f->beam, "Kernels carried into the next round");
    sub->add_option("--repairs", f->repairs, "Repair attempts per failed candidate");
    sub->add_option("--budget-usd", f->budget_usd, "LLM spend limit");
    sub->add_option("--budget-calls", f->budget_calls, "Model call limit");
    sub->add_option("--budget-tokens", f->budget_tokens, "Token limit");
    sub->add_option("--budget-minutes", f->budget_minutes, "Wall-clock limit");
    sub->add_option("--target-speedup", f->target, "Stop at this speedup over eager");
    sub->add_option("--require", f->require,
                    "robust: kernels that a distribution-shifted input set breaks (specialised) count as incorrect")
        ->check(CLI::IsMember({"robust"}));
    sub->add_option("--precision", f->precision, kPrecisionHelp)->check(CLI::IsMember(ContractNames()));
    sub->add_option("--implement", f->implement, "oneshot (default) or agent (compile/test tools per idea)");
    sub->add_option("--agent-turns", f->agent_turns, "Agent: model turns per implementation (0: server default)");
    sub->add_option("--agent-tool-calls", f->agent_tool_calls, "Agent: tool calls per implementation (0: server default)");
    sub->add_option("--agent-tokens", f->agent_tokens, "Agent: tokens per implementation (0: no limit)");
    sub->add_flag("--watch", f->watch, "Follow the search until it ends");
    sub->add_flag("--no-start", f->no_start, "Only submit the problem; print its id");
    SetAction(sub, [f] { return RunSubmit(*f); });
  }
  {
    auto* f = new BrowseFlags();
    CLI::App* sub = app.add_subcommand("watch", "Follow a search on a server until it ends");
    sub->add_option("search", f->id, "Search id")->required();
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f] {
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      return WatchToEnd(**client, f->id);
    });
  }
  {
    auto* f = new BrowseFlags();
    CLI::App* sub = app.add_subcommand("cancel", "Cancel a search on a server");
    sub->add_option("search", f->id, "Search id")->required();
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f] {
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      pb::CancelSearchRequest req;
      req.set_search_id(f->id);
      auto info = (*client)->CancelSearch(req);
      if (!info.ok()) return ReportError(info.status());
      // Say what happened: the server answers once the search has stopped.
      if (info->state() == pb::CANCELLED)
        std::printf("search %s cancelled: no model call was made after the cancel (calls in flight were "
                    "aborted); evaluations already running finished and were stored (%d evaluated in all). "
                    "It stays in the store: browse it with `kernelsearch remote show`.\n",
                    f->id.c_str(), info->candidates_evaluated());
      else
        std::printf("search %s asked to stop; it is still %s (an evaluation batch is finishing): "
                    "`kernelsearch watch %s` shows when it ends\n",
                    f->id.c_str(), StateName(info->state()), f->id.c_str());
      PrintInfo(*info);
      return kExitOk;
    });
  }

  {
    auto* f = new BrowseFlags();
    auto* rounds = new int(0);
    CLI::App* sub = app.add_subcommand("continue", "Give a finished search on a server more rounds");
    sub->add_option("search", f->id, "Search id")->required();
    sub->add_option("--rounds", *rounds,
                    "the search's new total of rounds (after round 0): a finished search of 3 rounds given 5 runs "
                    "rounds 4 and 5")
        ->required();
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f, rounds] {
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      pb::ContinueSearchRequest req;
      req.set_search_id(f->id);
      req.set_rounds(*rounds);
      auto info = (*client)->ContinueSearch(req);
      if (!info.ok()) return ReportError(info.status());
      std::printf("search %s queued for rounds up to %d: `kernelsearch watch %s` follows it\n", f->id.c_str(),
                  *rounds, f->id.c_str());
      PrintInfo(*info);
      return kExitOk;
    });
  }

  CLI::App* remote = app.add_subcommand("remote", "Browse a server's lineage store, or evaluate a kernel there");
  remote->require_subcommand(1);
  {
    auto* f = new BrowseFlags();
    CLI::App* sub = remote->add_subcommand("history", "Searches on the server, newest first");
    sub->add_option("--problem", f->problem, "Only this problem id");
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f] {
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      pb::ListSearchesRequest req;
      req.set_problem_id(f->problem);
      for (;;) {
        auto page = (*client)->ListSearches(req);
        if (!page.ok()) return ReportError(page.status());
        for (const auto& s : page->searches()) PrintInfo(s);
        if (page->next_page_token().empty()) break;
        req.set_page_token(page->next_page_token());
      }
      return kExitOk;
    });
  }
  {
    auto* f = new BrowseFlags();
    CLI::App* sub = remote->add_subcommand("best", "The fastest correct kernel of a search (or of a problem)");
    sub->add_option("id", f->id, "Search id (problem id with --problem)")->required();
    sub->add_flag("--problem", f->by_problem, "ID is a problem id: best over all its searches");
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f] {
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      pb::GetBestKernelRequest req;
      if (f->by_problem) req.set_problem_id(f->id); else req.set_search_id(f->id);
      auto best = (*client)->GetBestKernel(req);
      if (!best.ok()) return ReportError(best.status());
      PrintCandidate(*best, true);
      return kExitOk;
    });
  }
  {
    auto* f = new BrowseFlags();
    CLI::App* sub = remote->add_subcommand("show", "A search (its candidates) or, with --candidate, one candidate");
    sub->add_option("id", f->id, "Search id (candidate id with --candidate)")->required();
    sub->add_flag("--candidate", f->by_problem, "ID is a candidate id");
    sub->add_flag("--json", f->json, "Print the candidate's evaluation JSON");
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f] {
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      if (f->by_problem) {
        pb::GetCandidateRequest req;
        req.set_candidate_id(f->id);
        auto c = (*client)->GetCandidate(req);
        if (!c.ok()) return ReportError(c.status());
        if (f->json) std::printf("%s\n", c->evaluation_json().c_str()); else PrintCandidate(*c, true);
        return kExitOk;
      }
      pb::GetSearchRequest greq;
      greq.set_search_id(f->id);
      auto info = (*client)->GetSearch(greq);
      if (!info.ok()) return ReportError(info.status());
      PrintInfo(*info);
      pb::ListCandidatesRequest req;
      req.set_search_id(f->id);
      for (;;) {
        auto page = (*client)->ListCandidates(req);
        if (!page.ok()) return ReportError(page.status());
        for (const auto& c : page->candidates()) {
          pb::CandidateDetail d;
          *d.mutable_summary() = c;
          PrintCandidate(d, false);
        }
        if (page->next_page_token().empty()) break;
        req.set_page_token(page->next_page_token());
      }
      return kExitOk;
    });
  }
  {
    auto* f = new BrowseFlags();
    CLI::App* sub = remote->add_subcommand("lineage", "A candidate and its ancestors, nearest first");
    sub->add_option("candidate", f->id, "Candidate id")->required();
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f] {
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      pb::GetCandidateRequest req;
      req.set_candidate_id(f->id);
      auto c = (*client)->GetCandidate(req);
      if (!c.ok()) return ReportError(c.status());
      PrintCandidate(*c, false);
      for (const auto& a : c->lineage()) {
        pb::CandidateDetail d;
        *d.mutable_summary() = a;
        std::printf("  <- ");
        PrintCandidate(d, false);
      }
      return kExitOk;
    });
  }
  {
    auto* f = new BrowseFlags();
    auto* out = new std::string();
    CLI::App* sub = remote->add_subcommand("report", "A search as one self-contained HTML page (as `kernelsearch report`)");
    sub->add_option("search", f->id, "Search id")->required();
    sub->add_option("--out", *out, "Where to write the page (.html)")->required();
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f, out] {
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      pb::GetReportRequest req;
      req.set_search_id(f->id);
      auto r = (*client)->GetReport(req);
      if (!r.ok()) return ReportError(r.status());
      if (Status st = WriteFile(*out, r->html()); !st.ok()) return ReportError(st);
      std::printf("wrote %s (%zu bytes)\n", out->c_str(), r->html().size());
      return kExitOk;
    });
  }
  {
    auto* f = new BrowseFlags();
    auto* plan = new std::string();
    CLI::App* sub = remote->add_subcommand("eval", "Evaluate your own kernel against a submitted problem");
    sub->add_option("problem", f->problem, "Problem id on the server")->required();
    sub->add_option("kernel", f->id, "Kernel: .md (```cuda + ```json) or .cu (plan beside it or --plan)")->required();
    sub->add_option("--plan", *plan, "Launch plan JSON for a .cu file");
    sub->add_flag("--json", f->json, "Print the evaluation JSON");
    AddConnOptions(sub, &f->conn);
    SetAction(sub, [f, plan] {
      auto cand = LoadCandidateFiles(f->id, *plan);
      if (!cand.ok()) return ReportError(cand.status());
      auto client = Connect(f->conn);
      if (!client.ok()) return ReportError(client.status());
      pb::EvaluateKernelRequest req;
      req.set_problem_id(f->problem);
      req.set_source(cand->source);
      req.set_plan_json(cand->plan_json);
      auto r = (*client)->EvaluateKernel(req);
      if (!r.ok()) return ReportError(r.status());
      if (f->json) {
        std::printf("%s\n", r->evaluation_json().c_str());
      } else {
        std::printf("%s %s\n", r->status().c_str(),
                    r->status() == "correct" ? fmt::format("{:.4f} ms, {} over eager", r->median_ms(),
                                                           Speedup(r->speedup_eager())).c_str()
                                             : r->message().c_str());
      }
      return r->status() == "correct" ? kExitOk : kExitFailed;
    });
  }
}

}  // namespace ks::cli
