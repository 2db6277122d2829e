// What the server accepts: request sizes, search-config bounds, job and watcher
// counts. Checked at the RPC boundary so that the search and the evaluator only
// ever see validated input. Plain data plus pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "proto/kernelsearch.pb.h"

namespace ks::server {

struct ConfigBounds {
  int max_rounds = 50;
  int max_ideas_per_round = 16;
  int max_branches = 16;
  int max_beam = 8;
  int max_repair_attempts = 4;
  int max_agent_turns = 32;        // per implementation (issue 24)
  int max_agent_tool_calls = 64;
  int64_t max_agent_tokens = 10000000;
  double max_budget_usd = 1000;
  int64_t max_budget_calls = 100000;
  int64_t max_budget_tokens = 1000000000;
  double max_budget_minutes = 7 * 24 * 60;
  double max_target_speedup = 1000;
  // (rounds + 1) x beam x ideas x branches: the first-pass candidates a search
  // plans. Bounds the GPU time one client can claim with one call.
  int64_t max_planned_candidates = 5000;
  // Applied to zero (unset) fields. Budgets always end up finite: a server
  // never runs a search without a spending limit.
  int default_rounds = 3;
  int default_ideas_per_round = 4;
  int default_branches = 2;
  int default_beam = 2;
  int default_repair_attempts = 1;
  int default_agent_turns = 8;
  int default_agent_tool_calls = 12;
  double default_budget_usd = 5;
  int64_t default_budget_calls = 2000;
  int64_t default_budget_tokens = 50000000;
  double default_budget_minutes = 240;
};

struct ServerLimits {
  // gRPC rejects a larger message with RESOURCE_EXHAUSTED before any handler runs.
  int max_receive_bytes = 4 << 20;
  // A problem .py or kernel source larger than this is RESOURCE_EXHAUSTED: real
  // operators are a few KiB, and the source is fed to python3 and NVRTC.
  size_t max_source_bytes = 1 << 20;
  size_t max_plan_bytes = 256 << 10;
  size_t max_name_bytes = 64;
  int max_running_searches = 1;   // the pool; searches share the GPUs
  int max_queued_searches = 64;   // beyond this StartSearch is RESOURCE_EXHAUSTED
  int max_watchers = 1024;        // open WatchSearch streams, all searches together
  // GPU worker leases (issue 13): how long a lease lasts unless renewed, and
  // how much one call may take or report.
  double default_lease_s = 60;
  double min_lease_s = 1;
  double max_lease_s = 3600;
  int max_lease_candidates = 64;
  size_t max_worker_name_bytes = 128;
  size_t max_evaluation_bytes = 3 << 20;  // a reported evaluation (compiler logs included)
  // An agent's practice call (issue 32) is leased for at most this long
  // (renewed while it runs): a model conversation waits on it, so the call of
  // a worker that died moves to another within seconds.
  double practice_lease_s = 15;
  int max_page_size = 500;
  int default_page_size = 50;
  ConfigBounds config;
};

// Fills defaults into zero fields and checks every field against `b`.
// InvalidArgument naming the field, its value and the bound.
StatusOr<kernelsearch::v1::SearchConfig> ValidateSearchConfig(const kernelsearch::v1::SearchConfig& c,
                                                              const ConfigBounds& b);

// Source text: ResourceExhausted above max_bytes, InvalidArgument when empty or
// holding NUL bytes (neither python3 nor NVRTC take them). `what` names it.
Status ValidateSource(const std::string& what, const std::string& text, size_t max_bytes);

// A problem name: 1..max_bytes of [A-Za-z0-9_.-], not starting with '.'.
Status ValidateName(const std::string& name, size_t max_bytes);

// An id as the store hands them out: 1..64 of [A-Za-z0-9_-]. InvalidArgument
// naming `what` when empty or malformed (so NOT_FOUND means "well-formed, absent").
Status ValidateId(const std::string& what, const std::string& id);

// A requested lease length: 0 → default, else within [min, max] (InvalidArgument
// naming the bounds otherwise).
StatusOr<double> ResolveLeaseSeconds(double requested, const ServerLimits& limits);

// A lease id as the store makes them: 32 lowercase hex digits (InvalidArgument otherwise).
Status ValidateLeaseId(const std::string& id);

// Page size: 0 → default, negative → InvalidArgument, above max → max.
StatusOr<int> ResolvePageSize(int requested, const ServerLimits& limits);

}  // namespace ks::server
