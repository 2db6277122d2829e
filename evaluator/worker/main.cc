// ks-worker: the process that touches untrusted candidate code.
//   ks-worker compile          NVRTC on the source given as JSON on stdin; JSON result on stdout.
//   ks-worker compile-server   the same for a stream of framed requests (worker_protocol.h).
//   ks-worker serve     the GPU worker: loads and runs candidates on request (worker_serve.cc).
// It is started only by the evaluator, inside a sandbox (evaluator/sandbox.h).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "evaluator/compiler.h"
#include "evaluator/plan/worker_protocol.h"
#include "evaluator/worker/worker_serve.h"

namespace {

int Compile() {
  std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  auto req = nlohmann::json::parse(input, nullptr, false);
  if (req.is_discarded() || !req.is_object()) {
    std::fprintf(stderr, "ks-worker compile: stdin is not a JSON request\n");
    return 2;
  }
  ks::CompileResult r = ks::CompileWithNvrtc(req.value("source", ""), req.value("arch", "sm_90"),
                                             req.value("cuda_home", "/usr/local/cuda"));
  nlohmann::json out{{"ok", r.ok}, {"message", r.message}, {"log", r.log}, {"seconds", r.seconds}};
  if (r.ok) {
    out["cubin_b64"] = ks::Base64Encode(r.cubin);
    out["ptx"] = r.ptx;
  }
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
    ks::CompileResult r = ks::CompileWithNvrtc((*req).value("source", ""), (*req).value("arch", "sm_90"),
                                               (*req).value("cuda_home", "/usr/local/cuda"));
    nlohmann::json out{{"ok", r.ok}, {"message", r.message}, {"log", r.log}, {"seconds", r.seconds}};
    if (r.ok) {
      out["cubin_b64"] = ks::Base64Encode(r.cubin);
      out["ptx"] = r.ptx;
    }
    if (!ks::SendMessage(1, out).ok()) return 0;
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
