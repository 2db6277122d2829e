// Load test of `kernelsearch serve` (not a unit test): starts the real binary
// on loopback with the scripted model and evaluator, then measures
//   1. unary calls per second (GetSearch, a store read) from C client threads,
//      each with its own channel, for a fixed time;
//   2. watch streams held at once on one running search: every stream gets its
//      snapshot, then the server's thread count and memory are read from
//      /proc, to show that a watcher holds no thread;
//   3. that all those watchers see the search finish.
// Bounded: a few seconds per phase. Prints a markdown table.
//
//   server_load [--seconds S] [--threads 1,8,32] [--watchers N]
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/server_harness.h"

namespace {

namespace pb = ::kernelsearch::v1;
using Clock = std::chrono::steady_clock;

std::string ProcField(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) {
      std::string v = line.substr(key.size() + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "?";
}

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 5;
  std::vector<int> thread_counts = {1, 8, 32};
  int watchers = 500;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--seconds") seconds = std::stod(argv[i + 1]);
    else if (a == "--threads") thread_counts = ParseList(argv[i + 1]);
    else if (a == "--watchers") watchers = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: server_load [--seconds S] [--threads 1,8,32] [--watchers N]\n");
      return 2;
    }
  }
  // Each watcher is a TCP connection in this process too.
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);

  ks::e2e::ServerHarness h({.llm_sleep_s = 0.5,
                            .eval_delay_ms = 50,
                            .extra_args = {"--max-watchers", std::to_string(watchers + 16)}});
  int64_t problem = h.SeedProblem();
  h.Start();
  auto admin = h.Connect();
  pb::StartSearchRequest start;
  start.set_problem_id(std::to_string(problem));
  start.mutable_config()->set_rounds(3);
  start.mutable_config()->set_ideas_per_round(2);
  start.mutable_config()->set_branches(2);
  start.mutable_config()->set_beam(1);
  auto started = admin->StartSearch(start);
  if (!started.ok()) {
    std::fprintf(stderr, "StartSearch: %s\n", started.status().ToString().c_str());
    return 1;
  }
  const std::string id = started->search_id();
  std::printf("| phase | clients | result |\n|---|---|---|\n");
  std::printf("| server idle | - | %s threads, RSS %s |\n", ProcField(h.pid(), "Threads").c_str(),
              ProcField(h.pid(), "VmRSS").c_str());

  // 1. Unary throughput while the search runs.
  for (int n : thread_counts) {
    std::vector<std::unique_ptr<ks::server::Client>> clients;
    for (int i = 0; i < n; ++i) clients.push_back(h.Connect());
    std::atomic<int64_t> ok{0}, failed{0};
    std::mutex err_mu;
    std::string first_error;
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    std::vector<double> worst(n, 0);
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        pb::GetSearchRequest req;
        req.set_search_id(id);
        while (!stop.load()) {
          auto c0 = Clock::now();
          auto r = clients[i]->GetSearch(req);
          double ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
          worst[i] = std::max(worst[i], ms);
          (r.ok() ? ok : failed)++;
          if (!r.ok()) {
            std::lock_guard<std::mutex> lock(err_mu);
            if (first_error.empty()) first_error = r.status().ToString();
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    stop = true;
    for (auto& t : threads) t.join();
    double el = std::chrono::duration<double>(Clock::now() - t0).count();
    double max_ms = 0;
    for (double w : worst) max_ms = std::max(max_ms, w);
    std::printf("| unary GetSearch, %.0f s | %d | %.0f calls/s, %lld refused%s%s, slowest %.1f ms |\n", seconds, n,
                ok.load() / el, static_cast<long long>(failed.load()), first_error.empty() ? "" : " (first: ",
                first_error.empty() ? "" : (first_error + ")").c_str(), max_ms);
    std::fflush(stdout);
  }

  // 2. Watch streams held on a search that is running (a fresh one, so that it
  // outlives the attaching).
  auto second = admin->StartSearch(start);
  if (!second.ok()) {
    std::fprintf(stderr, "StartSearch: %s\n", second.status().ToString().c_str());
    return 1;
  }
  const std::string wid = second->search_id();
  std::atomic<int> snapshots{0}, finished{0}, errors{0};
  std::vector<std::unique_ptr<ks::server::Client>> wclients;
  const int per_channel = 50;  // streams multiplexed over one HTTP/2 connection
  for (int i = 0; i < (watchers + per_channel - 1) / per_channel; ++i) wclients.push_back(h.Connect());
  std::vector<std::thread> wthreads;
  auto w0 = Clock::now();
  for (int i = 0; i < watchers; ++i) {
    wthreads.emplace_back([&, i] {
      ks::Status st = wclients[i / per_channel]->Watch(wid, [&](const pb::SearchEvent& e) {
        if (e.has_snapshot()) ++snapshots;
        if (e.has_finished()) ++finished;
      });
      if (!st.ok()) {
        ++errors;
        std::fprintf(stderr, "watch: %s\n", st.ToString().c_str());
      }
    });
  }
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (snapshots.load() < watchers && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  double attach_s = std::chrono::duration<double>(Clock::now() - w0).count();
  pb::GetSearchRequest g;
  g.set_search_id(wid);
  auto during = admin->GetSearch(g);
  std::printf("| watch streams open (search %s) | %d | all snapshots in %.2f s; server %s threads, RSS %s |\n",
              during.ok() && during->state() == pb::RUNNING ? "running" : "NOT running", snapshots.load(), attach_s, ProcField(h.pid(), "Threads").c_str(), ProcField(h.pid(), "VmRSS").c_str());
  std::fflush(stdout);
  for (auto& t : wthreads) t.join();
  double total_s = std::chrono::duration<double>(Clock::now() - w0).count();
  std::printf("| watchers saw the search finish | %d | %d finished events, %d errors, after %.1f s |\n", watchers,
              finished.load(), errors.load(), total_s);
  std::string how = h.Terminate();
  std::printf("| SIGTERM | - | %s |\n", how.c_str());
  return finished.load() == watchers && errors.load() == 0 ? 0 : 1;
}
