#include "evaluator/worker/worker_serve.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/base64.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/worker_protocol.h"

namespace ks {
namespace {

using json = nlohmann::json;

constexpr size_t kGuardBytes = 4096;
constexpr uint8_t kGuardByte = 0xCD;
constexpr uint32_t kScratchFill = 0x7FC0FFEE;  // scratch is not zeroed: it holds junk (a NaN) at every run

struct OutputRegion {
  CUdeviceptr offset = 0;
  size_t bytes = 0;
  PoisonPattern poison;
};

struct ArgSpec {
  enum Kind { kTensor, kScratch, kI32, kI64, kF32, kF64 } kind = kI32;
  std::vector<uint64_t> offsets;  // tensor: arena offset per input set
  int scratch = 0;
  int64_t i = 0;
  double f = 0;
};

struct LaunchSpec {
  CUfunction fn = nullptr;
  std::string kernel;
  unsigned grid[3], block[3];
  unsigned shared = 0;
  std::optional<std::array<unsigned, 3>> cluster;
  std::vector<ArgSpec> args;
};

struct GlobalSnapshot {
  std::string name;
  CUdeviceptr ptr = 0;
  std::string bytes;
};

struct Candidate {
  Module module;
  std::vector<LaunchSpec> launches;
  std::vector<DeviceBuffer> scratch;  // [guard][data][guard]
  std::vector<size_t> scratch_bytes;
  std::vector<GlobalSnapshot> globals;
};

class Worker {
 public:
  explicit Worker(const CudaDriver* d) : d_(d) {}

  json Handle(const json& req, bool* quit) {
    std::string cmd = req.value("cmd", "");
    if (cmd == "init") return Init(req);
    if (cmd == "load") return Load(req);
    if (cmd == "run") return Run(req);
    if (cmd == "warm") return Warm(req);
    if (cmd == "unload") {
      cand_.reset();
      return {{"ok", true}};
    }
    if (cmd == "quit") {
      *quit = true;
      return {{"ok", true}};
    }
    return Fail("internal", "unknown request '" + cmd + "'");
  }

  bool fatal() const { return fatal_; }

 private:
  static json Fail(const std::string& status, const std::string& message, bool fatal = false) {
    return {{"ok", false}, {"status", status}, {"message", message}, {"fatal", fatal}};
  }

  json Init(const json& req) {
    auto ctx = PrimaryContext::Open(req.value("device", 0));
    if (!ctx.ok()) return Fail("internal", ctx.status().message());
    ctx_ = std::move(*ctx);
    // Device printf is captured in the worker's log; a capped FIFO bounds a flood.
    d_->cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, req.value("printf_fifo_bytes", size_t{1} << 20));
    // The device heap outlives a run, so a kernel could keep results in it.
    // The compiler refuses malloc/free/new (evaluator/compiler.cc); as a
    // second wall the heap is made as small as the driver allows, before any
    // module is loaded.
    size_t heap = 0;
    for (size_t want : {size_t{0}, size_t{1}, size_t{4096}})
      if (d_->cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, want) == CUDA_SUCCESS) break;
    if (d_->cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE) != CUDA_SUCCESS) heap = SIZE_MAX;
    auto handle = Base64Decode(req.value("ipc", ""));
    if (!handle.ok() || handle->size() != sizeof(CUipcMemHandle)) return Fail("internal", "bad IPC handle");
    CUipcMemHandle h;
    std::memcpy(&h, handle->data(), sizeof h);
    CUresult r = d_->cuIpcOpenMemHandle(&arena_, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) return Fail("internal", "cuIpcOpenMemHandle: " + d_->ErrorName(r));
    for (const auto& o : req.value("outputs", json::array()))
      outputs_.push_back({o["offset"].get<CUdeviceptr>(), o["bytes"].get<size_t>(),
                          PoisonPattern{o["width"].get<int>(), o["pattern"].get<uint32_t>()}});
    size_t flush = req.value("l2_flush_bytes", size_t{0});
    if (flush) {
      auto b = DeviceBuffer::Alloc(flush);
      if (!b.ok()) return Fail("internal", b.status().message());
      flush_ = std::move(*b);
    }
    // The timing pad: a helper kernel from the evaluator, launched after the
    // flush so the start event and this run's launches queue behind GPU work.
    if (std::string b64 = req.value("pad_cubin", ""); !b64.empty()) {
      auto image = Base64Decode(b64);
      if (!image.ok()) return Fail("internal", "bad pad cubin encoding");
      auto m = Module::Load(*image);
      if (!m.ok()) return Fail("internal", "loading the timing pad: " + m.status().message());
      auto f = m->Function("ks_timing_pad");
      if (!f.ok()) return Fail("internal", f.status().message());
      auto scrub = m->Function("ks_scrub_shared");
      if (!scrub.ok()) return Fail("internal", scrub.status().message());
      pad_module_ = std::move(*m);
      pad_fn_ = *f;
      pad_ns_ = req.value("pad_ns", uint64_t{0});
      // Shared memory is not cleared between launches: one block per SM that
      // holds the opt-in maximum overwrites all of it before every run.
      scrub_bytes_ = req.value("scrub_shared_bytes", 0u);
      scrub_blocks_ = req.value("sms", 0u);
      if (scrub_bytes_ && scrub_blocks_) {
        CUresult r = d_->cuFuncSetAttribute(*scrub, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, scrub_bytes_);
        if (r != CUDA_SUCCESS) return Fail("internal", "shared-memory scrub: " + d_->ErrorName(r));
        scrub_fn_ = *scrub;
      }
    }
    auto e0 = Event::Create();
    auto e1 = Event::Create();
    auto e2 = Event::Create();
    if (!e0.ok() || !e1.ok() || !e2.ok()) return Fail("internal", "cuEventCreate failed");
    start_ = std::move(*e0);
    end_ = std::move(*e1);
    after_ = std::move(*e2);
    CUdevice dev = ctx_.device();
    auto info = QueryDevice(dev);
    return {{"ok", true}, {"device", info.ok() ? info->name : "?"}, {"pid", getpid()}, {"heap_bytes", heap}};
  }

  json Load(const json& req) {
    cand_.reset();
    auto image = Base64Decode(req.value("cubin", ""));
    if (!image.ok()) return Fail("internal", "bad cubin encoding");
    Candidate c;
    auto m = Module::Load(*image);
    if (!m.ok()) return Fail("launch_error", m.status().message());
    c.module = std::move(*m);
    for (const auto& l : req["launches"]) {
      LaunchSpec s;
      s.kernel = l["kernel"];
      auto fn = c.module.Function(s.kernel);
      if (!fn.ok()) return Fail("launch_error", fn.status().message());
      s.fn = *fn;
      for (int i = 0; i < 3; ++i) {
        s.grid[i] = l["grid"][i].get<unsigned>();
        s.block[i] = l["block"][i].get<unsigned>();
      }
      s.shared = l.value("shared", 0u);
      if (l.contains("cluster") && l["cluster"].is_array())
        s.cluster = std::array<unsigned, 3>{l["cluster"][0].get<unsigned>(), l["cluster"][1].get<unsigned>(),
                                            l["cluster"][2].get<unsigned>()};
      // Clusters above 8 blocks are legal on sm_90 only once the kernel opts in;
      // the plan parser allows up to 16 (PlanLimits::max_cluster_size).
      if (s.cluster && (*s.cluster)[0] * (*s.cluster)[1] * (*s.cluster)[2] > 8) {
        CUresult r = d_->cuFuncSetAttribute(s.fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1);
        if (r != CUDA_SUCCESS)
          return Fail("launch_error", s.kernel + ": this GPU does not allow clusters of more than 8 blocks: " +
                                          d_->ErrorName(r));
      }
      if (s.shared > 48 * 1024) {
        CUresult r = d_->cuFuncSetAttribute(s.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, s.shared);
        if (r != CUDA_SUCCESS)
          return Fail("launch_error", s.kernel + ": cannot raise dynamic shared memory to " +
                                          std::to_string(s.shared) + " bytes: " + d_->ErrorName(r));
      }
      for (const auto& a : l["args"]) {
        ArgSpec as;
        std::string k = a["k"];
        if (k == "tensor") { as.kind = ArgSpec::kTensor; as.offsets = a["offsets"].get<std::vector<uint64_t>>(); }
        else if (k == "scratch") { as.kind = ArgSpec::kScratch; as.scratch = a["i"]; }
        else if (k == "i32") { as.kind = ArgSpec::kI32; as.i = a["v"]; }
        else if (k == "i64") { as.kind = ArgSpec::kI64; as.i = a["v"]; }
        else if (k == "f32") { as.kind = ArgSpec::kF32; as.f = a["v"]; }
        else if (k == "f64") { as.kind = ArgSpec::kF64; as.f = a["v"]; }
        else return Fail("internal", "bad argument kind " + k);
        s.args.push_back(std::move(as));
      }
      c.launches.push_back(std::move(s));
    }
    json occupancy = json::array();
    for (const auto& s : c.launches) occupancy.push_back(KernelOccupancy(s));
    for (const auto& b : req.value("scratch", json::array())) {
      size_t bytes = b.get<size_t>();
      auto buf = DeviceBuffer::Alloc(bytes + 2 * kGuardBytes);
      if (!buf.ok()) return Fail("launch_error", "scratch of " + std::to_string(bytes) + " bytes: " + buf.status().message());
      CUresult r = d_->cuMemsetD8(buf->get(), kGuardByte, bytes + 2 * kGuardBytes);
      if (r != CUDA_SUCCESS) return Fail("internal", "cuMemsetD8: " + d_->ErrorName(r));
      c.scratch.push_back(std::move(*buf));
      c.scratch_bytes.push_back(bytes);
    }
    // Module-scope variables persist across launches: snapshot them now and
    // restore before every run (stops caching results or counting calls in them).
    for (const auto& g : req.value("globals", json::array())) {
      GlobalSnapshot s;
      s.name = g["name"];
      size_t size = 0;
      if (d_->cuModuleGetGlobal(&s.ptr, &size, c.module.get(), s.name.c_str()) != CUDA_SUCCESS) continue;
      s.bytes.resize(size);
      if (size && d_->cuMemcpyDtoH(s.bytes.data(), s.ptr, size) != CUDA_SUCCESS)
        return Fail("internal", "cannot read global " + s.name);
      c.globals.push_back(std::move(s));
    }
    cand_ = std::move(c);
    return {{"ok", true}, {"globals", cand_->globals.size()}, {"occupancy", occupancy}};
  }

  // What the driver says of one launch's kernel at its block size and dynamic
  // shared memory: resident blocks per SM, and the attributes that decide it.
  // The evaluator names the limiting resource (evaluator/launch_profile.h).
  json KernelOccupancy(const LaunchSpec& s) {
    int threads = static_cast<int>(s.block[0] * s.block[1] * s.block[2]);
    int blocks = -1, regs = -1, static_shared = -1;
    if (d_->cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, s.fn, threads, s.shared) != CUDA_SUCCESS) blocks = -1;
    if (d_->cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, s.fn) != CUDA_SUCCESS) regs = -1;
    if (d_->cuFuncGetAttribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, s.fn) != CUDA_SUCCESS)
      static_shared = -1;
    json out{{"blocks_per_sm", blocks}, {"threads", threads}, {"registers", regs},
             {"static_shared", static_shared}, {"dynamic_shared", s.shared}};
    // A cluster's blocks must be resident together on one GPC, which the
    // per-SM figure cannot show: ask how many clusters fit on the whole GPU.
    if (s.cluster) {
      CUlaunchAttribute attr;
      attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attr.value.clusterDim.x = (*s.cluster)[0];
      attr.value.clusterDim.y = (*s.cluster)[1];
      attr.value.clusterDim.z = (*s.cluster)[2];
      CUlaunchConfig cfg{};
      cfg.gridDimX = s.grid[0]; cfg.gridDimY = s.grid[1]; cfg.gridDimZ = s.grid[2];
      cfg.blockDimX = s.block[0]; cfg.blockDimY = s.block[1]; cfg.blockDimZ = s.block[2];
      cfg.sharedMemBytes = s.shared;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = -1;
      if (d_->cuOccupancyMaxActiveClusters(&clusters, s.fn, &cfg) != CUDA_SUCCESS) clusters = -1;
      out["cluster_size"] = (*s.cluster)[0] * (*s.cluster)[1] * (*s.cluster)[2];
      out["max_active_clusters"] = clusters;
    }
    return out;
  }

  // Every run is prepared the same way, so a kernel cannot tell a checked run
  // from a timed one: all runs are both. A run with "split" also records an
  // event between launches, for the time of each launch on its own; the
  // evaluator never counts such a run in the plan's timing.
  json Run(const json& req) {
    if (!cand_) return Fail("internal", "run without a loaded candidate");
    size_t set = req.value("set", 0);
    bool split = req.value("split", false);
    Candidate& c = *cand_;
    if (split && between_.size() < c.launches.size() + 1) {
      while (between_.size() < c.launches.size() + 1) {
        auto ev = Event::Create();
        if (!ev.ok()) return Fail("internal", "cuEventCreate failed");
        between_.push_back(std::move(*ev));
      }
    }
    // Flush L2 so every run starts cold, as the reference's runs do. No host
    // sync before `start`: as in timing.py, the start event and the launches
    // queue behind the flush and the pad, so launch latency hides behind them
    // on both sides.
    if (auto bad = Prepare(/*timed=*/true)) return *bad;
    d_->cuEventRecord(start_.get(), nullptr);
    if (split) d_->cuEventRecord(between_[0].get(), nullptr);
    if (auto bad = LaunchPlan(set, split)) return *bad;
    // The same method as evaluator/reference/timing.py: an end event on the
    // stream, then a device-wide sync and a second event. Both figures go back;
    // the evaluator takes the device-wide series only when its median shows
    // work outliving the stream (other streams, device-side launches).
    d_->cuEventRecord(end_.get(), nullptr);
    if (CUresult r = d_->cuCtxSynchronize(); r != CUDA_SUCCESS) return Sticky("running the plan", r);
    d_->cuEventRecord(after_.get(), nullptr);
    if (CUresult r = d_->cuEventSynchronize(after_.get()); r != CUDA_SUCCESS) return Sticky("timing", r);
    float ms = 0, device_wide = 0;
    d_->cuEventElapsedTime(&ms, start_.get(), end_.get());
    d_->cuEventElapsedTime(&device_wide, start_.get(), after_.get());
    json changed = json::array();
    if (auto bad = AfterChecks(&changed)) return *bad;
    json reply{{"ok", true}, {"ms", ms}, {"ms_device", device_wide}, {"state_changed", changed}};
    if (split) {
      json launch_ms = json::array();
      for (size_t li = 0; li < c.launches.size(); ++li) {
        float t = 0;
        d_->cuEventElapsedTime(&t, between_[li].get(), between_[li + 1].get());
        launch_ms.push_back(t);
      }
      reply["launch_ms"] = launch_ms;
    }
    return reply;
  }

  // Warm-up: `runs` runs of the plan back to back, input sets in turn from
  // `first_set`, with one synchronize at the end instead of one per run. Each
  // run is prepared as a timed run is (globals restored, scratch refilled,
  // outputs poisoned, shared memory scrubbed) except for the L2 flush and the
  // pad, which only matter to a figure and none is taken here. The checks
  // that follow a run (scratch guards, globals) are made once, after the last
  // run; the evaluator then verifies the last run's outputs and every input set.
  json Warm(const json& req) {
    if (!cand_) return Fail("internal", "warm-up without a loaded candidate");
    int runs = req.value("runs", 0);
    size_t sets = std::max<size_t>(1, req.value("sets", size_t{1}));
    size_t first = req.value("first_set", size_t{0});
    for (int i = 0; i < runs; ++i) {
      if (auto bad = Prepare(/*timed=*/false)) return *bad;
      if (auto bad = LaunchPlan((first + i) % sets, /*split=*/false)) return *bad;
    }
    if (CUresult r = d_->cuCtxSynchronize(); r != CUDA_SUCCESS) return Sticky("running the plan", r);
    json changed = json::array();
    if (auto bad = AfterChecks(&changed)) return *bad;
    return {{"ok", true}, {"runs", runs}, {"state_changed", changed}};
  }

  // Before a run: globals restored, scratch refilled with junk, outputs
  // poisoned, shared memory scrubbed; for a timed run also the L2 flush and
  // the pad. An error reply, or nothing.
  std::optional<json> Prepare(bool timed) {
    Candidate& c = *cand_;
    for (const auto& g : c.globals)
      if (!g.bytes.empty() && d_->cuMemcpyHtoD(g.ptr, g.bytes.data(), g.bytes.size()) != CUDA_SUCCESS)
        return Sticky("restoring globals");
    for (size_t i = 0; i < c.scratch.size(); ++i) {
      CUdeviceptr p = c.scratch[i].get() + kGuardBytes;
      size_t words = c.scratch_bytes[i] / 4, tail = c.scratch_bytes[i] % 4;
      // The tail bytes too: a scratch size that is not a multiple of 4 must not leave bytes that keep state.
      if (d_->cuMemsetD32(p, kScratchFill, words) != CUDA_SUCCESS ||
          (tail && d_->cuMemsetD8(p + 4 * words, kScratchFill & 0xFF, tail) != CUDA_SUCCESS))
        return Sticky("filling scratch");
    }
    for (const auto& o : outputs_) {
      CUdeviceptr p = arena_ + o.offset;
      CUresult r = o.poison.width == 4   ? d_->cuMemsetD32(p, o.poison.pattern, o.bytes / 4)
                   : o.poison.width == 2 ? d_->cuMemsetD16(p, static_cast<uint16_t>(o.poison.pattern), o.bytes / 2)
                                         : d_->cuMemsetD8(p, static_cast<uint8_t>(o.poison.pattern), o.bytes);
      if (r != CUDA_SUCCESS) return Sticky("poisoning outputs");
    }
    ++runs_;
    if (timed && flush_.get()) d_->cuMemsetD32(flush_.get(), static_cast<uint32_t>(runs_), flush_.bytes() / 4);
    if (scrub_fn_) {
      uint32_t v = static_cast<uint32_t>(runs_ * 0x9E3779B9u);
      void* scrub_args[] = {&v};
      if (CUresult r = d_->cuLaunchKernel(scrub_fn_, scrub_blocks_, 1, 1, 1024, 1, 1, scrub_bytes_, nullptr, scrub_args,
                                          nullptr);
          r != CUDA_SUCCESS)
        return Sticky("scrubbing shared memory", r);
    }
    if (timed && pad_fn_) {
      void* pad_args[] = {&pad_ns_};
      if (CUresult r = d_->cuLaunchKernel(pad_fn_, 1, 1, 1, 32, 1, 1, 0, nullptr, pad_args, nullptr); r != CUDA_SUCCESS)
        return Sticky("launching the timing pad", r);
    }
    return std::nullopt;
  }

  // The plan's launches on input set `set` (split: an event after each).
  std::optional<json> LaunchPlan(size_t set, bool split) {
    Candidate& c = *cand_;
    std::vector<std::array<unsigned char, 8>> storage;
    std::vector<void*> params;
    for (size_t li = 0; li < c.launches.size(); ++li) {
      const LaunchSpec& l = c.launches[li];
      storage.assign(l.args.size(), {});
      params.assign(l.args.size(), nullptr);
      for (size_t i = 0; i < l.args.size(); ++i) {
        const ArgSpec& a = l.args[i];
        unsigned char* p = storage[i].data();
        switch (a.kind) {
          case ArgSpec::kTensor: {
            uint64_t off = a.offsets.size() > set ? a.offsets[set] : a.offsets[0];
            CUdeviceptr v = arena_ + off;
            std::memcpy(p, &v, 8);
            break;
          }
          case ArgSpec::kScratch: {
            CUdeviceptr v = c.scratch[a.scratch].get() + kGuardBytes;
            std::memcpy(p, &v, 8);
            break;
          }
          case ArgSpec::kI32: { int32_t v = static_cast<int32_t>(a.i); std::memcpy(p, &v, 4); break; }
          case ArgSpec::kI64: { int64_t v = a.i; std::memcpy(p, &v, 8); break; }
          case ArgSpec::kF32: { float v = static_cast<float>(a.f); std::memcpy(p, &v, 4); break; }
          case ArgSpec::kF64: { double v = a.f; std::memcpy(p, &v, 8); break; }
        }
        params[i] = p;
      }
      CUresult r;
      if (l.cluster) {
        CUlaunchAttribute attr;
        attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
        attr.value.clusterDim.x = (*l.cluster)[0];
        attr.value.clusterDim.y = (*l.cluster)[1];
        attr.value.clusterDim.z = (*l.cluster)[2];
        CUlaunchConfig cfg{};
        cfg.gridDimX = l.grid[0]; cfg.gridDimY = l.grid[1]; cfg.gridDimZ = l.grid[2];
        cfg.blockDimX = l.block[0]; cfg.blockDimY = l.block[1]; cfg.blockDimZ = l.block[2];
        cfg.sharedMemBytes = l.shared;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
        r = d_->cuLaunchKernelEx(&cfg, l.fn, params.data(), nullptr);
      } else {
        r = d_->cuLaunchKernel(l.fn, l.grid[0], l.grid[1], l.grid[2], l.block[0], l.block[1], l.block[2], l.shared,
                               nullptr, params.data(), nullptr);
      }
      if (r != CUDA_SUCCESS) {
        // A launch refused up front (too many resources, bad config) leaves the
        // context usable; anything sticky shows up at the synchronize.
        CUresult s = d_->cuCtxSynchronize();
        if (s != CUDA_SUCCESS) return Sticky("launching " + l.kernel, s);
        return Fail("launch_error", "launching " + l.kernel + ": " + d_->ErrorName(r));
      }
      if (split) d_->cuEventRecord(between_[li + 1].get(), nullptr);
    }
    return std::nullopt;
  }

  // After a run (synchronized): the scratch guards, and the globals, which
  // must hold their load-time values again (names that do not go in *changed).
  std::optional<json> AfterChecks(json* changed) {
    Candidate& c = *cand_;
    // Guard regions around scratch: a write past either end is a memory error.
    std::string guard(kGuardBytes, '\0');
    for (size_t i = 0; i < c.scratch.size(); ++i) {
      for (size_t where : {size_t{0}, kGuardBytes + c.scratch_bytes[i]}) {
        if (d_->cuMemcpyDtoH(guard.data(), c.scratch[i].get() + where, kGuardBytes) != CUDA_SUCCESS)
          return Sticky("checking scratch guards");
        for (char ch : guard)
          if (static_cast<uint8_t>(ch) != kGuardByte)
            return Fail("runtime_error", std::string("wrote ") + (where ? "past the end" : "before the start") +
                                             " of scratch buffer #" + std::to_string(i));
      }
    }
    // Module-scope variables must hold their load-time values again when the
    // plan ends: state kept across launches is how cached results and call
    // counters survive (a legitimate counter is reset by the kernel that uses it).
    std::string now;
    for (const auto& g : c.globals) {
      if (g.bytes.empty()) continue;
      now.resize(g.bytes.size());
      if (d_->cuMemcpyDtoH(now.data(), g.ptr, now.size()) != CUDA_SUCCESS) return Sticky("reading globals");
      if (now != g.bytes) changed->push_back(g.name);
    }
    return std::nullopt;
  }

  json Sticky(const std::string& what, CUresult r = CUDA_ERROR_UNKNOWN) {
    fatal_ = true;
    return Fail("runtime_error", what + ": " + d_->ErrorName(r), true);
  }

  const CudaDriver* d_;
  PrimaryContext ctx_;
  CUdeviceptr arena_ = 0;
  std::vector<OutputRegion> outputs_;
  DeviceBuffer flush_;
  Module pad_module_;
  CUfunction pad_fn_ = nullptr;
  uint64_t pad_ns_ = 0;
  CUfunction scrub_fn_ = nullptr;
  unsigned scrub_bytes_ = 0, scrub_blocks_ = 0;
  Event start_, end_, after_;
  std::vector<Event> between_;  // split runs: one before the plan, one after each launch
  std::optional<Candidate> cand_;
  uint64_t runs_ = 0;
  bool fatal_ = false;
};

}  // namespace

int WorkerServe(int argc, char** argv) {
  // Replies go to a private copy of stdout; stdout itself (where device printf
  // writes) is pointed at stderr, which the evaluator captures and caps.
  int proto_fd = dup(1);
  dup2(2, 1);
  // The log is size-limited (RLIMIT_FSIZE): past it, writes fail quietly
  // instead of killing the worker.
  signal(SIGXFSZ, SIG_IGN);
  auto d = CudaDriver::Get();
  if (!d.ok()) {
    (void)SendMessage(proto_fd, {{"ok", false}, {"status", "internal"}, {"message", d.status().message()}, {"fatal", true}});
    return 3;
  }
  Worker w(*d);
  for (;;) {
    auto req = ReceiveMessage(0, -1);
    if (!req.ok()) return 0;  // the evaluator went away
    bool quit = false;
    json reply = w.Handle(*req, &quit);
    fflush(stdout);
    if (!SendMessage(proto_fd, reply).ok()) return 0;
    if (quit) return 0;
    if (w.fatal()) _exit(3);  // skip destructors: the context is broken
  }
}

}  // namespace ks
