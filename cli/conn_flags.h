// How a client command reaches `kernelsearch serve`: --server (else
// $KS_SERVER), --token-file (else $KS_SERVER_TOKEN), --tls-ca, --timeout.
// Shared by the remote commands (cmd_remote.cc) and gpu-worker.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "common/status.h"
#include "server/client.h"

namespace ks::cli {

struct ConnFlags {
  std::string server;
  std::string token_file;
  std::string tls_ca;
  double timeout_s = 600;
};

void AddConnOptions(CLI::App* sub, ConnFlags* c);
// The client options the flags select, the token loaded (server/auth.h).
StatusOr<server::ClientOptions> ResolveConnFlags(const ConnFlags& c);

}  // namespace ks::cli
