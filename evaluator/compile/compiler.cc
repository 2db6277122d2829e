#include "evaluator/compile/compiler.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/base64.h"
#include "common/subprocess.h"
#include "evaluator/worker/worker_protocol.h"
#include "evaluator/worker/sandbox.h"

namespace ks {
namespace fs = std::filesystem;

namespace {

std::string JoinContinuations(const std::string& src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\\' && i + 1 < src.size() && src[i + 1] == '\n') {
      ++i;
      continue;
    }
    if (src[i] == '\\' && i + 2 < src.size() && src[i + 1] == '\r' && src[i + 2] == '\n') {
      i += 2;
      continue;
    }
    out.push_back(src[i]);
  }
  return out;
}

// Removes /* */ comments so "# /**/ include" tricks cannot hide a directive.
std::string StripBlockComments(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '/' && i + 1 < s.size() && s[i + 1] == '*') {
      size_t e = s.find("*/", i + 2);
      if (e == std::string::npos) break;
      out.push_back(' ');
      i = e + 1;
      continue;
    }
    out.push_back(s[i]);
  }
  return out;
}

std::string ExeDir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  return fs::path(std::string(buf, n)).parent_path().string();
}

int ParamSizeOf(const std::string& type) {
  if (type == ".u64" || type == ".s64" || type == ".b64" || type == ".f64") return 8;
  if (type == ".u32" || type == ".s32" || type == ".b32" || type == ".f32") return 4;
  if (type == ".u16" || type == ".s16" || type == ".b16" || type == ".f16") return 2;
  if (type == ".u8" || type == ".s8" || type == ".b8") return 1;
  return 0;
}

}  // namespace

// Names models reach for that NVRTC does not predefine (no <cmath>/<cfloat>).
constexpr const char* kPrelude = R"(#pragma once
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef FLT_MAX
#define FLT_MAX 3.402823466e+38F
#endif
#ifndef FLT_MIN
#define FLT_MIN 1.175494351e-38F
#endif
#ifndef FLT_EPSILON
#define FLT_EPSILON 1.192092896e-07F
#endif
#ifndef DBL_MAX
#define DBL_MAX 1.7976931348623158e+308
#endif
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
#ifndef M_SQRT1_2
#define M_SQRT1_2 0.70710678118654752440
#endif
)";

const char* NvrtcPrelude() { return kPrelude; }

const std::vector<std::string>& NvrtcBaseOptions() {
  static const std::vector<std::string> kOptions = {"--std=c++17", std::string("--pre-include=") + kNvrtcPreludeName,
                                                    "--ptxas-options=-v", "-default-device", "-lineinfo"};
  return kOptions;
}

Status CheckIncludes(const std::string& source, const std::vector<std::string>& include_dirs) {
  std::istringstream in(StripBlockComments(JoinContinuations(source)));
  std::string line;
  int lineno = 0;
  static const std::regex kDirective(R"(^\s*#\s*(include_next|include|import|embed)\b\s*(.*)$)");
  while (std::getline(in, line)) {
    ++lineno;
    std::smatch m;
    if (!std::regex_search(line, m, kDirective)) continue;
    std::string where = "line " + std::to_string(lineno) + ": ";
    std::string dir = m[1];
    if (dir != "include") return InvalidArgument(where + "#" + dir + " is not allowed");
    std::string arg = m[2];
    char open = arg.empty() ? 0 : arg[0];
    char close = open == '<' ? '>' : '"';
    size_t end = arg.find(close, 1);
    if ((open != '<' && open != '"') || end == std::string::npos)
      return InvalidArgument(where + "only #include <header> or \"header\" of the CUDA include tree is allowed "
                             "(computed includes are refused)");
    std::string path = arg.substr(1, end - 1);
    if (path.empty() || path[0] == '/' || path.find("..") != std::string::npos)
      return InvalidArgument(where + "#include \"" + path + "\" is outside the CUDA include tree; refused");
    bool found = false;
    for (const auto& d : include_dirs) found = found || fs::exists(fs::path(d) / path);
    if (!found)
      return InvalidArgument(where + "#include <" + path + ">: not a CUDA header; only headers of the CUDA "
                             "include tree (cuda_fp16.h, cuda_bf16.h, mma.h, cooperative_groups.h, cuda/pipeline, ...) "
                             "are available");
  }
  return Status::Ok();
}

StatusOr<std::vector<KernelInfo>> ParsePtxEntries(const std::string& ptx) {
  std::vector<KernelInfo> out;
  static const std::regex kEntry(R"(\.entry\s+([A-Za-z_$][A-Za-z0-9_$]*)\s*\()");
  static const std::regex kParam(R"(\.param\s+((?:\.[A-Za-z0-9_]+(?:\s+\d+)?\s+)*?)(\.(?:[usbf](?:8|16|32|64)))\s+((?:\.[A-Za-z0-9_]+(?:\s+\d+)?\s+)*)([A-Za-z_$][A-Za-z0-9_$]*)(\[(\d+)\])?)");
  auto it = std::sregex_iterator(ptx.begin(), ptx.end(), kEntry);
  for (; it != std::sregex_iterator(); ++it) {
    KernelInfo k;
    k.name = (*it)[1];
    size_t open = it->position(0) + it->length(0);
    size_t close = ptx.find(')', open);
    if (close == std::string::npos) return Internal("malformed PTX: entry " + k.name + " has no ')'");
    std::string params = ptx.substr(open, close - open);
    size_t pos = 0;
    for (;;) {
      size_t next = params.find(".param", pos);
      if (next == std::string::npos) break;
      size_t stop = params.find(',', next);
      std::string one = params.substr(next, stop == std::string::npos ? std::string::npos : stop - next);
      pos = stop == std::string::npos ? params.size() : stop + 1;
      std::smatch m;
      if (!std::regex_search(one, m, kParam)) return Internal("cannot read PTX parameter: " + one);
      std::string mods = std::string(m[1]) + " " + std::string(m[3]);
      std::string type = m[2];
      ParamInfo p;
      int elem = ParamSizeOf(type);
      if (m[5].matched) {
        p.kind = ParamKind::kBytes;
        p.size = elem * std::stoi(m[6]);
      } else {
        p.size = elem;
        if (type == ".f32") p.kind = ParamKind::kF32;
        else if (type == ".f64") p.kind = ParamKind::kF64;
        else if (elem == 8) p.kind = ParamKind::kB64;
        else if (elem == 4) p.kind = ParamKind::kB32;
        else if (elem == 2) p.kind = ParamKind::kB16;
        else p.kind = ParamKind::kB8;
      }
      static const std::regex kAlign(R"(\.align\s+(\d+))");
      std::smatch am;
      p.align = std::regex_search(one, am, kAlign) ? std::stoi(am[1]) : std::max(1, elem);
      k.params.push_back(p);
    }
    k.resources.kernel = k.name;
    out.push_back(std::move(k));
  }
  return out;
}

std::vector<GlobalVar> ParsePtxGlobals(const std::string& ptx) {
  std::vector<GlobalVar> out;
  std::istringstream in(ptx);
  std::string line;
  static const std::regex kGlobal(
      R"(^\s*(?:\.visible\s+|\.weak\s+)?\.global\s+(?:\.align\s+(\d+)\s+)?(\.[usbf](?:8|16|32|64))\s+([A-Za-z_$][A-Za-z0-9_$]*)(?:\[(\d+)\])?)");
  while (std::getline(in, line)) {
    if (line.find(".global") == std::string::npos || line.find(".extern") != std::string::npos) continue;
    std::smatch m;
    if (!std::regex_search(line, m, kGlobal)) continue;
    int64_t size = ParamSizeOf(m[2]);
    if (m[4].matched) size *= std::stoll(m[4]);
    out.push_back({m[3], size});
  }
  return out;
}

std::vector<std::string> ParsePtxExternFunctions(const std::string& ptx) {
  std::vector<std::string> out;
  static const std::regex kExtern(R"(\.extern\s+\.func\s*(?:\([^)]*\))?\s*([A-Za-z_$][A-Za-z0-9_$]*))");
  for (auto it = std::sregex_iterator(ptx.begin(), ptx.end(), kExtern); it != std::sregex_iterator(); ++it)
    out.push_back((*it)[1]);
  return out;
}

std::optional<std::string> DeviceHeapUse(const std::string& ptx) {
  // new/delete come down to malloc/free in PTX; __nv_aligned_device_malloc to
  // __cuda_syscall_aligned_malloc.
  for (const std::string& f : ParsePtxExternFunctions(ptx))
    if (f == "malloc" || f == "free" || f.find("aligned_malloc") != std::string::npos) return f;
  return std::nullopt;
}

bool PtxUsesAtomics(const std::string& ptx) {
  static const std::regex kAtomic(R"((^|[\s;{])(atom|red|multimem\.red|cp\.reduce)\.)");
  return std::regex_search(ptx, kAtomic);
}

void ParsePtxasResources(const std::string& log, std::vector<KernelInfo>* kernels) {
  std::istringstream in(log);
  std::string line, current;
  static const std::regex kProps(R"(Function properties for ([A-Za-z0-9_$]+))");
  static const std::regex kFrame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex kUsed(R"(Used (\d+) registers)");
  static const std::regex kSmem(R"((\d+) bytes smem)");
  auto find = [&](const std::string& n) -> KernelInfo* {
    for (auto& k : *kernels)
      if (k.name == n) return &k;
    return nullptr;
  };
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_search(line, m, kProps)) {
      current = m[1];
      continue;
    }
    KernelInfo* k = find(current);
    if (!k) continue;
    if (std::regex_search(line, m, kFrame)) {
      k->resources.stack_frame_bytes = std::stoi(m[1]);
      k->resources.spill_store_bytes = std::stoi(m[2]);
      k->resources.spill_load_bytes = std::stoi(m[3]);
    }
    if (std::regex_search(line, m, kUsed)) {
      k->resources.registers = std::stoi(m[1]);
      if (std::regex_search(line, m, kSmem)) k->resources.static_shared_bytes = std::stoi(m[1]);
    }
  }
}

StatusOr<std::string> FindCudaHome(const std::string& explicit_home) {
  std::vector<std::string> cands;
  if (!explicit_home.empty()) cands.push_back(explicit_home);
  for (const char* var : {"KS_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"})
    if (const char* v = getenv(var); v && *v) cands.push_back(v);
  cands.push_back("/usr/local/cuda");
  cands.push_back(fs::path(KS_CUDA_INCLUDE_DIR).parent_path().string());
  for (const auto& c : cands)
    if (fs::exists(fs::path(c) / "include" / "cuda_fp16.h")) return c;
  std::string tried;
  for (const auto& c : cands) tried += " " + c;
  return FailedPrecondition("no CUDA toolkit headers found (looked for include/cuda_fp16.h in:" + tried +
                            "); set KS_CUDA_HOME");
}

std::vector<std::string> CudaIncludeDirs(const std::string& cuda_home) {
  std::vector<std::string> dirs = {cuda_home + "/include"};
  if (fs::exists(cuda_home + "/include/cccl")) dirs.push_back(cuda_home + "/include/cccl");
  return dirs;
}

StatusOr<std::string> FindWorker(const std::string& explicit_path) {
  std::vector<std::string> cands;
  if (!explicit_path.empty()) cands.push_back(explicit_path);
  if (const char* v = getenv("KS_WORKER"); v && *v) cands.push_back(v);
  std::string dir = ExeDir();
  cands.push_back(dir + "/ks-worker");
  cands.push_back(dir + "/../evaluator/worker/ks-worker");
  cands.push_back(dir + "/../../evaluator/worker/ks-worker");
  cands.push_back(dir + "/../libexec/kernelsearch/ks-worker");
  for (const auto& c : cands)
    if (access(c.c_str(), X_OK) == 0) return fs::weakly_canonical(c).string();
  return FailedPrecondition("ks-worker executable not found next to " + dir + " (set KS_WORKER)");
}

CompileServerPool& CompileServerPool::Get() {
  static CompileServerPool* pool = new CompileServerPool();  // lives for the process
  return *pool;
}

StatusOr<ChildProcess> CompileServerPool::Acquire(const std::string& worker) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!idle_.empty()) {
      Entry e = std::move(idle_.back());
      idle_.pop_back();
      if (e.worker == worker && !e.process.TryReap()) return std::move(e.process);
    }
  }
  SandboxLimits limits;
  limits.address_space_bytes = int64_t{16} << 30;  // a runaway template instantiation ends here
  limits.drop_privileges = false;  // reads only world-readable headers
  // Not tied to the forking thread's life (compile threads come and go); the
  // server exits when its stdin closes, which also happens when we die.
  limits.die_with_parent = false;
  return ChildProcess::Start({worker, "compile-server"}, {}, "", [limits] { return ApplySandbox(limits); });
}

void CompileServerPool::Release(const std::string& worker, ChildProcess process) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < kMaxIdle && process.running()) idle_.push_back({worker, std::move(process)});
}

std::string ArchSpecificTarget(const std::string& arch) {
  static const std::regex kPlain(R"(^sm_(\d+)(\d)$)");  // the major, then the one-digit minor
  std::smatch m;
  if (!std::regex_match(arch, m, kPlain)) return arch;
  // 9.0 is the first architecture with arch-specific features; NVRTC 13 has a
  // target for every one from there (sm_90a, sm_100a, sm_103a, sm_110a, sm_120a, sm_121a).
  return std::stoi(m[1]) >= 9 ? arch + "a" : arch;
}

bool IsArchSpecific(const std::string& target) {
  return target.size() > 3 && target.back() == 'a' && target.compare(0, 3, "sm_") == 0;
}

std::string TargetArch(const std::string& target) {
  return IsArchSpecific(target) ? target.substr(0, target.size() - 1) : target;
}

StatusOr<CompileResult> CompileCandidate(const std::string& source, const CompileOptions& opts) {
  CompileResult res;
  if (source.size() > opts.max_source_bytes) {
    res.message = "source is " + std::to_string(source.size()) + " bytes; the limit is " +
                  std::to_string(opts.max_source_bytes);
    return res;
  }
  KS_ASSIGN_OR_RETURN(std::string home, FindCudaHome(opts.cuda_home));
  if (Status s = CheckIncludes(source, CudaIncludeDirs(home)); !s.ok()) {
    res.message = s.message();
    res.log = s.message() + "\n";
    return res;
  }
  static const std::regex kArch(R"(^sm_\d{2,3}a?$)");
  if (!std::regex_match(opts.arch, kArch)) return InvalidArgument("bad --arch '" + opts.arch + "' (expected e.g. sm_90 or sm_90a)");
  KS_ASSIGN_OR_RETURN(std::string worker, FindWorker(opts.worker_path));
  nlohmann::json request = wire::ToJson(wire::CompileRequest{source, opts.arch, home});
  auto t0 = std::chrono::steady_clock::now();
  KS_ASSIGN_OR_RETURN(ChildProcess server, CompileServerPool::Get().Acquire(worker));
  Status sent = SendMessage(server.stdin_fd(), request);
  StatusOr<nlohmann::json> reply = sent.ok() ? ReceiveMessage(server.stdout_fd(), opts.timeout_s) : StatusOr<nlohmann::json>(sent);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!reply.ok()) {
    // A compiler that overran its limit or died takes its process with it.
    std::string how = server.Kill();
    if (reply.status().code() == Code::kDeadlineExceeded) {
      res.message = "compile timed out after " + std::to_string(static_cast<int>(opts.timeout_s)) + " s";
    } else {
      res.message = "the compiler process failed (" + how + ")";
    }
    return res;
  }
  CompileServerPool::Get().Release(worker, std::move(server));
  auto compiled = wire::FromJson<wire::CompileReply>(*reply);
  if (!compiled.ok()) return Internal("ks-worker compile-server returned unreadable output: " + compiled.status().message());
  res.log = compiled->log;
  if (!compiled->ok) {
    res.message = compiled->message.empty() ? "compile error" : compiled->message;
    return res;
  }
  res.cubin = std::move(compiled->cubin);
  res.ptx = std::move(compiled->ptx);
  KS_ASSIGN_OR_RETURN(res.kernels, ParsePtxEntries(res.ptx));
  res.globals = ParsePtxGlobals(res.ptx);
  ParsePtxasResources(res.log, &res.kernels);
  // Refuses the device heap: it survives from run to run and is reset by
  // nothing, so a kernel could keep its product there between runs.
  if (auto f = DeviceHeapUse(res.ptx)) {
    res.message = "device-side heap allocation is not allowed (the kernel calls " + *f +
                  "; malloc, free, new and delete use the device heap, which keeps data between runs): "
                  "declare the memory as scratch in the launch plan instead";
    res.log += res.message + "\n";
    return res;
  }
  if (res.kernels.empty()) {
    res.message = "the source declares no __global__ kernel";
    return res;
  }
  res.ok = true;
  return res;
}

bool ModuleHasData(const std::string& image) {
  auto u16 = [&](size_t at) { uint16_t v; std::memcpy(&v, image.data() + at, 2); return v; };
  auto u32 = [&](size_t at) { uint32_t v; std::memcpy(&v, image.data() + at, 4); return v; };
  auto u64 = [&](size_t at) { uint64_t v; std::memcpy(&v, image.data() + at, 8); return v; };
  if (image.size() < 64 || image.compare(0, 4, "\x7f" "ELF") != 0 || image[4] != 2) return true;  // ELF64 only
  const uint64_t shoff = u64(0x28);
  const size_t shentsize = u16(0x3A), shnum = u16(0x3C), shstrndx = u16(0x3E);
  if (shentsize < 64 || shstrndx >= shnum || shoff > image.size() || shnum > (image.size() - shoff) / shentsize)
    return true;
  const size_t strtab = shoff + shstrndx * shentsize;
  const uint64_t names = u64(strtab + 0x18), names_size = u64(strtab + 0x20);
  if (names > image.size() || names_size > image.size() - names) return true;
  constexpr uint64_t kShfAlloc = 0x2;
  for (size_t i = 0; i < shnum; ++i) {
    const size_t h = shoff + i * shentsize;
    if (!(u64(h + 8) & kShfAlloc)) continue;
    const uint32_t name_at = u32(h);
    if (name_at >= names_size) return true;
    const char* name = image.data() + names + name_at;
    const std::string n(name, strnlen(name, names_size - name_at));
    if (n.rfind(".text.", 0) == 0 || n.rfind(".nv.constant0.", 0) == 0 || n.rfind(".nv.shared.", 0) == 0) continue;
    return true;
  }
  return false;
}


}  // namespace ks
