#include "evaluator/compile/helper_cache.h"

#include <sys/stat.h>

#include <cuda.h>  // CUDA_VERSION: the toolkit NVRTC was built from

#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "common/files.h"
#include "evaluator/compile/compiler.h"

namespace ks {
namespace {

namespace fs = std::filesystem;

// An entry: the magic line, the key line, the cubin's size and SHA-256 on a
// line, then the cubin. The size and hash catch a torn or corrupt file before
// the driver ever sees it; the key line, a file copied under another name.
constexpr const char* kMagic = "ks-helper-cubin 1\n";
constexpr size_t kMaxCubinBytes = 64u << 20;  // the helpers are ~100 KiB; anything near this is not ours

std::string Header(const std::string& key, const std::string& cubin) {
  return std::string(kMagic) + key + "\n" + std::to_string(cubin.size()) + " " + Sha256Hex(cubin) + "\n";
}

std::mutex& Mu() {
  static std::mutex* mu = new std::mutex();  // lives for the process
  return *mu;
}
// key -> cubin, guarded by Mu().
std::map<std::string, std::string>& Memory() {
  static auto* memory = new std::map<std::string, std::string>();
  return *memory;
}

}  // namespace

const char* HelperCubinOriginName(HelperCubinOrigin origin) {
  switch (origin) {
    case HelperCubinOrigin::kCompiled: return "compile";
    case HelperCubinOrigin::kMemory: return "memory";
    case HelperCubinOrigin::kDisk: return "disk";
  }
  return "?";
}

std::string HelperCacheKey(const std::string& source, const std::string& arch, const std::string& compiler_id) {
  // Lengths first: no two different triples join to the same text.
  return Sha256Hex(std::to_string(source.size()) + ":" + std::to_string(arch.size()) + ":" +
                   std::to_string(compiler_id.size()) + ":" + source + arch + compiler_id);
}

std::string HelperCompilerId(const std::string& worker_path, const std::string& cuda_home) {
  std::string id = "cuda " + std::to_string(CUDA_VERSION) + "\nprelude " + NvrtcPrelude() + "\noptions";
  for (const auto& o : NvrtcBaseOptions()) id += " " + o;
  id += "\nheaders " + cuda_home + "\nworker " + worker_path;
  struct stat st;
  if (!worker_path.empty() && stat(worker_path.c_str(), &st) == 0)
    id += " " + std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
          std::to_string(st.st_mtim.tv_nsec);
  return id;
}

std::string HelperCacheFile(const std::string& dir, const std::string& key) {
  return (fs::path(dir) / ("helpers-" + key.substr(0, 32) + ".cubin")).string();
}

StatusOr<std::string> ReadHelperCubin(const std::string& dir, const std::string& key) {
  const std::string path = HelperCacheFile(dir, key);
  std::error_code ec;
  if (!fs::exists(path, ec)) return NotFound(path + ": no cached helper cubin");
  KS_ASSIGN_OR_RETURN(std::string data, ReadFile(path, kMaxCubinBytes + 4096));
  const std::string magic_key = std::string(kMagic) + key + "\n";
  if (data.compare(0, magic_key.size(), magic_key) != 0)
    return Internal(path + ": not a helper cubin of this key");
  const size_t line_end = data.find('\n', magic_key.size());
  if (line_end == std::string::npos) return Internal(path + ": truncated header");
  const std::string line = data.substr(magic_key.size(), line_end - magic_key.size());
  const size_t space = line.find(' ');
  size_t size = 0;
  try {
    size = space == std::string::npos ? 0 : std::stoull(line.substr(0, space));
  } catch (...) {
    return Internal(path + ": unreadable size");
  }
  std::string cubin = data.substr(line_end + 1);
  if (size == 0 || size > kMaxCubinBytes || cubin.size() != size)
    return Internal(path + ": " + std::to_string(cubin.size()) + " bytes of cubin, the header says " +
                    std::to_string(size));
  if (line.substr(space + 1) != Sha256Hex(cubin)) return Internal(path + ": the cubin's hash does not match");
  return cubin;
}

Status WriteHelperCubin(const std::string& dir, const std::string& key, const std::string& cubin) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Internal("creating " + dir + ": " + ec.message());
  return WriteFile(HelperCacheFile(dir, key), Header(key, cubin) + cubin);  // atomic: temporary + rename
}

StatusOr<HelperCubin> GetHelperCubin(const std::string& key, const std::string& dir, const HelperCompileFn& compile,
                                     const HelperAcceptFn& accept) {
  // One lock over lookup and compile: evaluators set up side by side (one per
  // GPU) wait for the first one's compile instead of each doing it.
  std::lock_guard<std::mutex> lock(Mu());
  auto& memory = Memory();
  if (auto it = memory.find(key); it != memory.end() && accept(it->second).ok())
    return HelperCubin{it->second, HelperCubinOrigin::kMemory};
  if (!dir.empty()) {
    auto cached = ReadHelperCubin(dir, key);
    if (cached.ok() && accept(*cached).ok()) {
      memory[key] = *cached;
      return HelperCubin{std::move(*cached), HelperCubinOrigin::kDisk};
    }
  }
  KS_ASSIGN_OR_RETURN(std::string cubin, compile());
  KS_RETURN_IF_ERROR(accept(cubin));
  memory[key] = cubin;
  if (!dir.empty()) (void)WriteHelperCubin(dir, key, cubin);  // a cache that cannot be written costs only the compile
  return HelperCubin{std::move(cubin), HelperCubinOrigin::kCompiled};
}

void ClearHelperCubinMemory() {
  std::lock_guard<std::mutex> lock(Mu());
  Memory().clear();
}

}  // namespace ks
