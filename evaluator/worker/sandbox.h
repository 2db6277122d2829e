// Limits applied to the processes that touch untrusted code (the compile child
// and the GPU worker), in the child between fork and exec. Everything here is
// async-signal-safe. Which limits apply is decided by the caller (SandboxLimits).
#pragma once

#include <cstdint>

namespace ks {

struct SandboxLimits {
  int64_t address_space_bytes = 0;  // RLIMIT_AS; 0 = unlimited (CUDA maps large VA ranges: keep 0 for the GPU worker)
  int64_t file_size_bytes = 64 << 20;  // RLIMIT_FSIZE: no large files written
  int64_t open_files = 1024;           // RLIMIT_NOFILE
  int64_t cpu_seconds = 0;             // RLIMIT_CPU; 0 = unlimited
  bool new_network_namespace = true;   // unshare(CLONE_NEWNET) when permitted: no network
  bool drop_privileges = true;         // when root: setgid/setuid to nobody (65534)
  int64_t max_processes = 256;         // RLIMIT_NPROC, applied once running as nobody
  bool die_with_parent = true;         // PR_SET_PDEATHSIG(SIGKILL)
  bool keep_dumpable = false;          // false: PR_SET_DUMPABLE 0 (no core, no ptrace by others)
};

// Applies the limits; returns 0 or a negative errno for a step that must not be
// skipped. Steps that need privileges we do not have (namespaces) are skipped.
int ApplySandbox(const SandboxLimits& limits);

}  // namespace ks
