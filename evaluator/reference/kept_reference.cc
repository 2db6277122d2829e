// The caller's side of kept resident references (kept_reference.h): the
// socket's place, a lease, and the status and stop requests.
#include "evaluator/reference/kept_reference.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/files.h"
#include "common/subprocess.h"
#include "common/unique_fd.h"
#include "evaluator/reference/bridge_internal.h"

namespace ks {
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxAnswerBytes = 256u << 20;

// A connection to the Unix socket at path. NotFound when no file is there,
// Unavailable when nobody answers.
StatusOr<UniqueFd> Connect(const std::string& path) {
  if (path.size() > kMaxSocketPath) return InvalidArgument(path + ": too long for a Unix socket");
  UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return PosixError("socket", errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound(path + ": no kept reference");
    return Unavailable(path + ": the kept reference does not answer (" + std::strerror(err) + ")");
  }
  return fd;
}

// One request line, and the one-line answer (read in blocks, not bytes: a
// manifest is tens of kilobytes), within timeout_s.
StatusOr<json> Ask(int fd, const json& request, double timeout_s) {
  const std::string line = request.dump() + "\n";
  KS_RETURN_IF_ERROR(WriteAll(fd, line.data(), line.size()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  std::string answer;
  char buf[1 << 16];
  while (answer.empty() || answer.back() != '\n') {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return DeadlineExceeded("no answer within " + std::to_string(int(timeout_s)) + " s");
    pollfd p{fd, POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left * 1000) + 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return PosixError("poll", errno);
    if (r == 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return PosixError("recv", errno);
    if (n == 0) return Unavailable("the kept reference closed the connection");
    answer.append(buf, static_cast<size_t>(n));
    if (answer.size() > kMaxAnswerBytes) return Internal("an answer longer than 256 MiB");
  }
  json j = json::parse(answer, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return Internal("an answer that is not a JSON object");
  if (j.contains("error")) return Unavailable(j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump());
  return j;
}

KeptStatus StatusFromJson(const json& j) {
  KeptStatus s;
  s.problem = j.value("problem", "");
  s.socket = j.value("socket", "");
  s.pci_bus_id = j.value("pci_bus_id", "");
  s.pid = j.value("pid", 0);
  s.keep_s = j.value("keep_s", 0.0);
  s.idle_s = j.value("idle_s", 0.0);
  if (j.contains("expires_in_s") && j["expires_in_s"].is_number()) s.expires_in_s = j["expires_in_s"].get<double>();
  s.leases = j.value("leases", 0);
  s.leases_served = j.value("leases_served", 0);
  s.gpu_bytes = j.value("gpu_bytes", uint64_t{0});
  s.stopping = j.value("stopping", false);
  return s;
}

// Every socket under <cache_dir>/kept, each asked `request`; a socket nobody
// answers is a killed bridge's and is removed. (status, answer) per live one.
StatusOr<std::vector<std::pair<KeptStatus, json>>> AskEvery(const std::string& cache_dir, const json& request,
                                                            const std::string& problem = "") {
  std::vector<std::pair<KeptStatus, json>> out;
  const fs::path dir = fs::path(cache_dir) / "kept";
  std::error_code ec;
  if (!fs::exists(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".sock") continue;
    auto fd = Connect(e.path().string());
    if (!fd.ok()) {
      if (fd.status().code() == Code::kUnavailable) fs::remove(e.path(), ec);
      continue;
    }
    auto st = Ask(fd->get(), {{"status", true}}, 10);
    if (!st.ok()) continue;
    KeptStatus s = StatusFromJson(*st);
    if (!problem.empty()) {
      const std::string& p = s.problem;
      const bool match = p == problem || fs::path(p).filename() == fs::path(problem).filename();
      if (!match) continue;
    }
    json answer = *st;
    if (!request.contains("status")) {
      auto fd2 = Connect(e.path().string());
      if (!fd2.ok()) continue;
      auto a = Ask(fd2->get(), request, 10);
      if (!a.ok()) continue;
      answer = *a;
    }
    out.emplace_back(std::move(s), std::move(answer));
  }
  return out;
}

}  // namespace

StatusOr<double> ParseKeepDuration(const std::string& text) {
  const auto bad = [&] {
    return InvalidArgument("'" + text + "' is not a duration (600, 90s, 10m, 1.5h; 0 = not kept; at most 24h)");
  };
  if (text.empty()) return bad();
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return bad();
  }
  const std::string unit = text.substr(used);
  double scale = 0;
  if (unit.empty() || unit == "s") scale = 1;
  else if (unit == "m" || unit == "min") scale = 60;
  else if (unit == "h") scale = 3600;
  else return bad();
  v *= scale;
  if (!(v >= 0) || v > 86400) return bad();
  return v;
}

std::string DescribeKept(const KeptInfo& k) {
  auto gib = [](uint64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / double(1ull << 30));
    return std::string(buf);
  };
  auto secs = [](double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, s >= 120 ? "%.0f min" : "%.0f s", s >= 120 ? s / 60 : s);
    return std::string(buf);
  };
  if (k.leased)
    return "the reference was leased from the one kept on the GPU (bridge pid " + std::to_string(k.pid) + ", " +
           gib(k.gpu_bytes) + "); it stays " + secs(k.keep_s) + " after this command";
  if (!k.socket.empty())
    return "the reference stays on the GPU for the next command (bridge pid " + std::to_string(k.pid) + ", " +
           gib(k.gpu_bytes) + ", until " + secs(k.keep_s) +
           " without a command); `kernelsearch cache release` frees it now";
  return "the reference is not kept: " + (k.declined.empty() ? std::string("the bridge did not say why") : k.declined);
}

StatusOr<std::string> KeptDir(const std::string& cache_dir) {
  const fs::path dir = fs::path(cache_dir) / "kept";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return PosixError(dir.string(), ec.value());
  // Only this user may reach the sockets: they hand out the reference's memory.
  if (chmod(dir.c_str(), 0700) != 0) return PosixError("chmod 0700 " + dir.string(), errno);
  return dir.string();
}

StatusOr<std::string> KeptSocketPath(const std::string& cache_dir, const std::string& stem, const std::string& key) {
  KS_ASSIGN_OR_RETURN(std::string dir, KeptDir(cache_dir));
  std::string path = dir + "/" + stem.substr(0, 24) + "-" + key.substr(0, 16) + ".sock";
  if (path.size() > kMaxSocketPath)
    return FailedPrecondition("--keep-reference: the kept reference's socket " + path + " is longer than the " +
                              std::to_string(kMaxSocketPath) + " bytes a Unix socket may have; use a shorter "
                              "--cache-dir (or $KS_CACHE_DIR)");
  return path;
}

StatusOr<std::vector<KeptStatus>> ListKeptReferences(const std::string& cache_dir) {
  KS_ASSIGN_OR_RETURN(auto all, AskEvery(cache_dir, {{"status", true}}));
  std::vector<KeptStatus> out;
  for (auto& [s, j] : all) out.push_back(std::move(s));
  return out;
}

StatusOr<std::vector<KeptStatus>> StopKeptReferences(const std::string& cache_dir, const std::string& problem) {
  KS_ASSIGN_OR_RETURN(auto all, AskEvery(cache_dir, {{"stop", true}}, problem));
  std::vector<KeptStatus> out;
  for (auto& [s, j] : all) {
    s.stopping = j.value("stopping", false);
    s.leases = j.value("leases", s.leases);
    out.push_back(std::move(s));
  }
  return out;
}

Status WithKeptMemoryHint(const Status& s, const std::string& cache_dir) {
  if (s.ok()) return s;
  std::string lower = s.message();
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool memory = s.code() == Code::kResourceExhausted || lower.find("out of memory") != std::string::npos ||
                      lower.find("out_of_memory") != std::string::npos;
  if (!memory) return s;
  auto kept = ListKeptReferences(cache_dir);
  if (!kept.ok() || kept->empty()) return s;
  uint64_t bytes = 0;
  std::string which;
  for (const auto& k : *kept) {
    bytes += k.gpu_bytes;
    which += (which.empty() ? "" : ", ") + std::string("pid ") + std::to_string(k.pid) + ": " + k.problem;
  }
  char held[32];
  std::snprintf(held, sizeof held, "%.1f GiB", bytes / double(1ull << 30));
  return Status(s.code(), s.message() + "\n" + std::to_string(kept->size()) + " reference(s) kept on a GPU by " +
                              "--keep-reference hold " + held + " (" + which + "); `kernelsearch cache release " +
                              "--cache-dir " + cache_dir + "` frees them");
}

Status bridge_internal::StopKeptReferenceAt(const std::string& socket) {
  auto fd = Connect(socket);
  if (!fd.ok()) return Status::Ok();  // nothing kept there (or a killed bridge's socket)
  return Ask(fd->get(), {{"stop", true}}, 10).status();
}

StatusOr<std::pair<ReferenceData, json>> bridge_internal::LeaseKeptReference(const std::string& socket,
                                                                             const std::string& file,
                                                                             double timeout_s) {
  auto fd = Connect(socket);
  if (!fd.ok()) {
    std::error_code ec;
    if (fd.status().code() == Code::kUnavailable) fs::remove(socket, ec);  // a killed bridge's
    return fd.status();
  }
  // The bridge may be checking its tensors after the last lease: give it time.
  auto j = Ask(fd->get(), {{"lease", true}}, timeout_s);
  if (!j.ok()) return j.status().WithContext(socket);
  const std::string where = file + " (kept reference at " + socket + ")";
  KS_ASSIGN_OR_RETURN(ResidentManifest m, ParseResidentManifest(*j, where));
  KeptInfo kept = KeptInfoFromManifest(*j);
  kept.leased = true;
  m.data.resident = std::make_shared<ResidentReference>(std::move(fd).value(), std::move(kept), std::move(m.tensors),
                                                        m.pci_bus_id);
  return std::make_pair(std::move(m.data), std::move(*j));
}

}  // namespace ks
