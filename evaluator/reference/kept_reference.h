// Kept resident references (`--keep-reference`, ReferenceOptions::keep_s):
// a resident reference's bridge that stays on the GPU after its command, so
// that the next command of the same problem and options leases it instead of
// starting python, importing torch and computing the reference again (issue
// 33: seconds of every real-size command). The bridge side is
// evaluator/reference/ks_bridge/keeper.py; this is the caller's side.
//
// Each kept reference is served at a Unix socket in <cache dir>/kept/ (the
// directory is 0700, the socket 0600: only this user reaches it), named by the
// reference's key; the socket is the registration. A lease is a connection:
// while any is open the bridge stays; after the last ends it waits keep_s
// seconds, then exits and frees the GPU memory. Before it serves a lease again
// it checks that its tensors are as they were (fingerprints); a difference
// ends it.
//
// Thread-safety: stateless functions; concurrent processes may share a cache
// directory (two commands that both find no kept reference both compute one;
// only the first to claim the socket stays).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "evaluator/problem.h"

namespace ks {

// The longest path a Unix socket may have (sun_path, with its terminator).
constexpr size_t kMaxSocketPath = 107;

// <cache_dir>/kept, made (mode 0700) when absent.
StatusOr<std::string> KeptDir(const std::string& cache_dir);

// The socket of the kept reference with key `key` of problem `stem`:
// <cache_dir>/kept/<stem, at most 24 characters>-<key, 16>.sock. A path too
// long for a Unix socket is FailedPrecondition naming a shorter --cache-dir.
StatusOr<std::string> KeptSocketPath(const std::string& cache_dir, const std::string& stem, const std::string& key);

// "600", "90s", "10m", "1.5h" -> seconds (at most a day). InvalidArgument otherwise.
StatusOr<double> ParseKeepDuration(const std::string& text);

// One line for the user about a resident reference started or leased with
// keep_s: kept for how long and how to free it, leased from whom, or why not kept.
std::string DescribeKept(const KeptInfo& kept);

// A kept reference as its bridge describes itself (keeper.py's status).
struct KeptStatus {
  std::string problem;
  std::string socket;
  std::string pci_bus_id;
  pid_t pid = 0;
  double keep_s = 0;
  double idle_s = 0;
  std::optional<double> expires_in_s;  // none while a lease is open
  int leases = 0;
  int leases_served = 0;
  uint64_t gpu_bytes = 0;
  bool stopping = false;
};

// Every kept reference under cache_dir that answers (a socket nobody serves
// any more, a killed bridge's, is removed).
StatusOr<std::vector<KeptStatus>> ListKeptReferences(const std::string& cache_dir);

// Asks the kept references under cache_dir to stop: those whose problem file
// ends with `problem` (its path or name; "" = all). Each exits once its open
// leases end; new leases are refused at once. Returns those asked.
StatusOr<std::vector<KeptStatus>> StopKeptReferences(const std::string& cache_dir, const std::string& problem);

// `s`, a failure for GPU memory (ResourceExhausted, or "out of memory" in its
// message), with what the references kept on a GPU under cache_dir hold and
// how to free them; any other status, or none kept, as it is.
Status WithKeptMemoryHint(const Status& s, const std::string& cache_dir);

namespace bridge_internal {

// Leases the kept reference at `socket`: its manifest, parsed as a resident
// reference whose ResidentReference holds the lease (the connection) and
// KeptInfo::leased. NotFound when nothing is kept there, Unavailable when the
// socket does not answer (a killed bridge's: removed) or the reference is
// stopping; either way the caller computes the reference itself.
StatusOr<std::pair<ReferenceData, nlohmann::json>> LeaseKeptReference(const std::string& socket,
                                                                      const std::string& file, double timeout_s);

// Asks the kept reference at `socket` to stop (nothing there: Ok).
Status StopKeptReferenceAt(const std::string& socket);

}  // namespace bridge_internal
}  // namespace ks
