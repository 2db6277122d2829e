// bench_compile_time: NVRTC compile time of one realistic candidate, measured
// two ways, N times each:
//   worker      ks::CompileCandidate: include check + `ks-worker compile` child
//               (fork/exec, sandbox limits, NVRTC, ptxas -v parse, JSON back).
//               This is what every candidate of a search pays.
//   inprocess   ks::CompileWithNvrtc in this process (NVRTC alone; the floor).
// Prints median / p10 / p90 / min / max per mode (target: worker median <= 100 ms)
// and, with --out FILE, writes the same as a markdown results file.
//
//   bench_compile_time [--runs 50] [--warmup 2] [--worker PATH] [--source FILE]
//                      [--arch sm_90] [--mode both|worker|inprocess]
//                      [--out FILE] [--commit SHA] [--target-ms 100]
#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/files.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/problem.h"

namespace {

// The built-in candidate: <cuda_fp16.h>, the softmax_large seed
// (problems/seeds/softmax_large.cu, read from the data directory) and this fp16
// variant: what a typical model-written candidate looks like (one header, two
// kernels, shared-memory reductions, expf).
constexpr const char* kHalfVariant = R"(
extern "C" __global__ void softmax_rows_half(const __half* __restrict__ x, __half* __restrict__ out,
                                             int rows, int cols) {
  __shared__ float red[THREADS];
  int row = blockIdx.x;
  if (row >= rows) return;
  const __half* xr = x + (long long)row * cols;
  __half* yr = out + (long long)row * cols;
  int t = threadIdx.x;
  float m = -3.402823466e+38f;
  for (int j = t; j < cols; j += THREADS) m = fmaxf(m, __half2float(xr[j]));
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((t & 31) == 0) red[t >> 5] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < THREADS / 32; ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  float sum = 0.0f;
  for (int j = t; j < cols; j += THREADS) sum += __expf(__half2float(xr[j]) - m);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if ((t & 31) == 0) red[t >> 5] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < THREADS / 32; ++w) sum += red[w];
  float inv = 1.0f / sum;
  for (int j = t; j < cols; j += THREADS) yr[j] = __float2half(__expf(__half2float(xr[j]) - m) * inv);
}
)";

struct Args {
  int runs = 50;
  int warmup = 2;
  std::string worker, source_file, arch = "sm_90", mode = "both", out, commit, cuda_home;
  double target_ms = 100;
  std::string command;
};

[[noreturn]] void Usage(const char* why) {
  if (why && *why) std::fprintf(stderr, "bench_compile_time: %s\n", why);
  std::fprintf(stderr,
               "usage: bench_compile_time [--runs N] [--warmup N] [--worker PATH] [--source FILE.cu]\n"
               "                          [--arch sm_90] [--mode both|worker|inprocess] [--cuda-home DIR]\n"
               "                          [--out FILE.md] [--commit SHA] [--target-ms 100]\n");
  std::exit(2);
}

Args Parse(int argc, char** argv) {
  Args a;
  for (int i = 0; i < argc; ++i) a.command += (i ? " " : "") + std::string(argv[i]);
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "-h" || k == "--help") Usage("");
    if (i + 1 >= argc) Usage(("missing value for " + k).c_str());
    std::string v = argv[++i];
    if (k == "--runs") a.runs = std::atoi(v.c_str());
    else if (k == "--warmup") a.warmup = std::atoi(v.c_str());
    else if (k == "--worker") a.worker = v;
    else if (k == "--source") a.source_file = v;
    else if (k == "--arch") a.arch = v;
    else if (k == "--mode") a.mode = v;
    else if (k == "--out") a.out = v;
    else if (k == "--commit") a.commit = v;
    else if (k == "--cuda-home") a.cuda_home = v;
    else if (k == "--target-ms") a.target_ms = std::atof(v.c_str());
    else Usage(("unknown option " + k).c_str());
  }
  if (a.runs < 1) Usage("--runs must be >= 1");
  if (a.mode != "both" && a.mode != "worker" && a.mode != "inprocess") Usage("--mode must be both, worker or inprocess");
  return a;
}

struct Stats {
  std::string mode;
  int runs = 0;
  double first_ms = 0, median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0;
};

double Quantile(std::vector<double> v, double q) {  // linear interpolation, like numpy's default
  std::sort(v.begin(), v.end());
  double pos = q * (v.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - lo);
}

Stats Summarize(const std::string& mode, double first_ms, const std::vector<double>& ms) {
  Stats s;
  s.mode = mode;
  s.runs = static_cast<int>(ms.size());
  s.first_ms = first_ms;
  s.median = Quantile(ms, 0.5);
  s.p10 = Quantile(ms, 0.1);
  s.p90 = Quantile(ms, 0.9);
  s.min = *std::min_element(ms.begin(), ms.end());
  s.max = *std::max_element(ms.begin(), ms.end());
  double sum = 0;
  for (double x : ms) sum += x;
  s.mean = sum / ms.size();
  return s;
}

std::string FirstLine(const std::string& path, const std::string& prefix) {
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(prefix, 0) == 0) {
      auto c = line.find(':');
      if (c == std::string::npos) return "";
      std::string v = line.substr(c + 1);
      v.erase(0, v.find_first_not_of(" \t"));
      return v;
    }
  return "";
}

std::string NowUtc() {
  std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return buf;
}

std::string LoadAvg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

}  // namespace

int main(int argc, char** argv) {
  Args a = Parse(argc, argv);

  std::string source, source_name = "built-in: softmax_large seed + fp16 variant, #include <cuda_fp16.h>";
  if (a.source_file.empty()) {
    auto seed_path = ks::FindDataFile("problems/seeds/softmax_large.cu");
    auto seed = seed_path.ok() ? ks::ReadFile(*seed_path) : ks::StatusOr<std::string>(seed_path.status());
    if (!seed.ok()) {
      std::fprintf(stderr, "bench_compile_time: the built-in candidate needs the softmax_large seed: %s\n",
                   seed.status().message().c_str());
      return 2;
    }
    source = "#include <cuda_fp16.h>\n" + *seed + kHalfVariant;
  } else {
    std::ifstream f(a.source_file, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "bench_compile_time: cannot read --source %s\n", a.source_file.c_str());
      return 2;
    }
    std::stringstream ss;
    ss << f.rdbuf();
    source = ss.str();
    source_name = a.source_file;
  }

  auto home = ks::FindCudaHome(a.cuda_home);
  if (!home.ok()) {
    std::fprintf(stderr, "bench_compile_time: %s\n", home.status().message().c_str());
    return 3;
  }
  std::string worker_path;
  if (a.mode != "inprocess") {
    auto w = ks::FindWorker(a.worker);
    if (!w.ok()) {
      std::fprintf(stderr, "bench_compile_time: %s (pass --worker PATH)\n", w.status().message().c_str());
      return 3;
    }
    worker_path = *w;
  }
  int nv_major = 0, nv_minor = 0;
  nvrtcVersion(&nv_major, &nv_minor);

  std::vector<Stats> results;
  std::string first_failure;

  if (a.mode != "inprocess") {
    ks::CompileOptions co;
    co.arch = a.arch;
    co.worker_path = worker_path;
    co.cuda_home = *home;
    std::vector<double> ms;
    double first = -1;
    for (int i = 0; i < a.warmup + a.runs; ++i) {
      auto t0 = Clock::now();
      auto r = ks::CompileCandidate(source, co);
      double t = MsSince(t0);
      if (!r.ok() || !r->ok) {
        std::fprintf(stderr, "bench_compile_time: worker compile failed: %s\n%s\n",
                     r.ok() ? r->message.c_str() : r.status().message().c_str(), r.ok() ? r->log.c_str() : "");
        return 1;
      }
      if (first < 0) first = t;
      if (i >= a.warmup) ms.push_back(t);
    }
    results.push_back(Summarize("worker (ks::CompileCandidate, out of process)", first, ms));
  }
  if (a.mode != "worker") {
    std::vector<double> ms;
    double first = -1;
    for (int i = 0; i < a.warmup + a.runs; ++i) {
      auto t0 = Clock::now();
      ks::CompileResult r = ks::CompileWithNvrtc(source, a.arch, *home);
      double t = MsSince(t0);
      if (!r.ok) {
        std::fprintf(stderr, "bench_compile_time: in-process compile failed: %s\n%s\n", r.message.c_str(), r.log.c_str());
        return 1;
      }
      if (first < 0) first = t;
      if (i >= a.warmup) ms.push_back(t);
    }
    results.push_back(Summarize("in process (ks::CompileWithNvrtc)", first, ms));
  }

  const long nproc = sysconf(_SC_NPROCESSORS_ONLN);
  std::string cpu = FirstLine("/proc/cpuinfo", "model name");
  if (cpu.empty()) cpu = "unknown CPU";
  const std::string date = NowUtc(), load = LoadAvg();
  char nvrtc_ver[32];
  std::snprintf(nvrtc_ver, sizeof nvrtc_ver, "%d.%d", nv_major, nv_minor);

  // Verdict: the path a search pays for (worker) against the target.
  const Stats& gate = results.front();
  const bool pass = gate.median <= a.target_ms;

  std::ostringstream tbl;
  char line[512];
  tbl << "| mode | runs | first (cold) ms | median ms | p10 ms | p90 ms | min ms | max ms | mean ms |\n";
  tbl << "|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& s : results) {
    std::snprintf(line, sizeof line, "| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |\n", s.mode.c_str(),
                  s.runs, s.first_ms, s.median, s.p10, s.p90, s.min, s.max, s.mean);
    tbl << line;
  }
  std::snprintf(line, sizeof line, "\n%s median %.1f ms vs target <= %.0f ms: %s\n", gate.mode.c_str(), gate.median,
                a.target_ms, pass ? "PASS" : "FAIL");
  std::string verdict = line;

  std::printf("compile time: %s, arch %s, NVRTC %s, %ld CPUs (%s), load %s\n", source_name.c_str(), a.arch.c_str(),
              nvrtc_ver, nproc, cpu.c_str(), load.c_str());
  std::printf("%s%s", tbl.str().c_str(), verdict.c_str());

  if (!a.out.empty()) {
    std::ofstream f(a.out);
    if (!f) {
      std::fprintf(stderr, "bench_compile_time: cannot write %s\n", a.out.c_str());
      return 2;
    }
    f << "## Compile time, " << date << "\n\n";
    f << "- machine: " << nproc << " CPUs, " << cpu << " (load average at the end: " << load << ")\n";
    f << "- commit: " << (a.commit.empty() ? "(not given)" : a.commit) << "\n";
    f << "- command: `" << a.command << "`\n";
    f << "- source: " << source_name << " (" << source.size() << " bytes), arch " << a.arch << ", NVRTC " << nvrtc_ver
      << ", CUDA home " << *home << "\n";
    if (!worker_path.empty()) f << "- worker: " << worker_path << "\n";
    f << "- " << a.warmup << " warm-up compiles per mode (not counted; the first one is shown as \"first\"), then "
      << a.runs << " timed; wall clock around the call\n\n";
    f << tbl.str() << verdict;
  }
  return 0;
}
