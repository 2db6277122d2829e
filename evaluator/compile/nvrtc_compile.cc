// NVRTC itself. Linked only into ks-worker (and tests): the trusted processes
// never run the compiler on untrusted source in their own address space.
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "evaluator/compile/compiler.h"

namespace ks {
namespace {

struct ProgramDeleter {
  void operator()(nvrtcProgram* p) const {
    if (p && *p) nvrtcDestroyProgram(p);
    delete p;
  }
};
using ProgramPtr = std::unique_ptr<nvrtcProgram, ProgramDeleter>;



std::string Log(nvrtcProgram p) {
  size_t n = 0;
  if (nvrtcGetProgramLogSize(p, &n) != NVRTC_SUCCESS || n <= 1) return "";
  std::string log(n, '\0');
  nvrtcGetProgramLog(p, log.data());
  log.resize(n - 1);
  // The front end's and ptxas's logs can be joined by a NUL: keep all of it readable.
  log.erase(std::remove(log.begin(), log.end(), '\0'), log.end());
  return log;
}

}  // namespace

CompileResult CompileWithNvrtc(const std::string& source, const std::string& arch, const std::string& cuda_home) {
  auto t0 = std::chrono::steady_clock::now();
  CompileResult res;
  ProgramPtr prog(new nvrtcProgram(nullptr));
  const char* header_names[] = {kNvrtcPreludeName};
  const char* header_sources[] = {NvrtcPrelude()};
  nvrtcResult rc = nvrtcCreateProgram(prog.get(), source.c_str(), "candidate.cu", 1, header_sources, header_names);
  if (rc != NVRTC_SUCCESS) {
    res.message = std::string("nvrtcCreateProgram: ") + nvrtcGetErrorString(rc);
    return res;
  }
  std::vector<std::string> opts = {"-arch=" + arch};
  opts.insert(opts.end(), NvrtcBaseOptions().begin(), NvrtcBaseOptions().end());
  for (const auto& d : CudaIncludeDirs(cuda_home)) opts.push_back("-I" + d);
  std::vector<const char*> copts;
  for (const auto& o : opts) copts.push_back(o.c_str());
  rc = nvrtcCompileProgram(*prog, static_cast<int>(copts.size()), copts.data());
  res.log = Log(*prog);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (rc != NVRTC_SUCCESS) {
    // The first error line is the one-line reason.
    std::string first;
    size_t e = res.log.find("error");
    if (e != std::string::npos) {
      size_t ls = res.log.rfind('\n', e);
      size_t le = res.log.find('\n', e);
      first = res.log.substr(ls == std::string::npos ? 0 : ls + 1, le == std::string::npos ? std::string::npos : le - ls - 1);
    }
    res.message = first.empty() ? std::string(nvrtcGetErrorString(rc)) : first;
    return res;
  }
  size_t n = 0;
  if (nvrtcGetCUBINSize(*prog, &n) != NVRTC_SUCCESS || n == 0) {
    res.message = "NVRTC produced no CUBIN (is the arch a real one, e.g. sm_90?)";
    return res;
  }
  res.cubin.resize(n);
  nvrtcGetCUBIN(*prog, res.cubin.data());
  size_t pn = 0;
  std::string ptx;
  if (nvrtcGetPTXSize(*prog, &pn) == NVRTC_SUCCESS && pn > 1) {
    ptx.resize(pn);
    nvrtcGetPTX(*prog, ptx.data());
    ptx.resize(pn - 1);
  }
  auto entries = ParsePtxEntries(ptx);
  if (!entries.ok()) {
    res.message = entries.status().message();
    return res;
  }
  res.kernels = *entries;
  res.globals = ParsePtxGlobals(ptx);
  ParsePtxasResources(res.log, &res.kernels);
  res.ptx = std::move(ptx);
  res.ok = true;
  return res;
}

}  // namespace ks
