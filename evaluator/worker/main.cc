// ks-worker: the process that touches untrusted candidate code.
//   ks-worker compile          NVRTC on the source given as JSON on stdin; JSON result on stdout.
//   ks-worker compile-server   the same for a stream of framed requests (worker_protocol.h).
//   ks-worker serve [--device N]   the GPU worker: loads and runs candidates on request
//                      (worker_serve.cc); with N, it opens that GPU's context before the first request.
// It is started only by the evaluator, inside a sandbox (evaluator/worker/sandbox.h).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/worker/worker_protocol.h"
#include "evaluator/worker/worker_serve.h"

namespace {

ks::wire::CompileReply Compiled(const ks::wire::CompileRequest& req) {
  ks::CompileResult r = ks::CompileWithNvrtc(req.source, req.arch.empty() ? "sm_90a" : req.arch,
                                             req.cuda_home.empty() ? "/usr/local/cuda" : req.cuda_home);
  return {r.ok, r.message, r.log, r.seconds, r.cubin, r.ptx};
}

int Compile() {
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  auto req = nlohmann::json::parse(input, nullptr, false);
  if (req.is_discarded() || !req.is_object()) {
    std::fprintf(stderr, "ks-worker compile: stdin is not a JSON request\n");
    return 2;
  }
  auto parsed = ks::wire::FromJson<ks::wire::CompileRequest>(req);
  if (!parsed.ok()) {
    std::fprintf(stderr, "ks-worker compile: %s\n", parsed.status().message().c_str());
    return 2;
  }
  nlohmann::json out = ks::wire::ToJson(Compiled(*parsed));
  std::string s = out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(s.data(), 1, s.size(), stdout);
  return 0;
}

// Long-lived form: framed JSON requests on stdin, one framed reply each on
// stdout, so NVRTC is loaded once rather than per candidate. The evaluator kills
// the process when a compile overruns its limit and starts another.
int CompileServer() {
  for (;;) {
    auto req = ks::ReceiveMessage(0, -1);
    if (!req.ok()) return 0;  // the evaluator went away
    auto parsed = ks::wire::FromJson<ks::wire::CompileRequest>(*req);
    ks::wire::CompileReply reply;
    if (parsed.ok()) reply = Compiled(*parsed);
    else reply.message = "unreadable compile request: " + parsed.status().message();
    if (!ks::SendMessage(1, ks::wire::ToJson(reply)).ok()) return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "compile") return Compile();
  if (mode == "compile-server") return CompileServer();
  if (mode == "serve") return ks::WorkerServe(argc - 1, argv + 1);
  std::fprintf(stderr, "usage: ks-worker compile|compile-server|serve  (started by kernelsearch; not for direct use)\n");
  return 2;
}
