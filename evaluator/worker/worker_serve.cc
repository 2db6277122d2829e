#include "evaluator/worker/worker_serve.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <array>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/base64.h"
#include "evaluator/compile/compiler.h"
#include "evaluator/cuda_driver.h"
#include "evaluator/plan/launch_config.h"
#include "evaluator/worker/worker_protocol.h"

namespace ks {
namespace {

using json = nlohmann::json;

constexpr size_t kGuardBytes = 4096;
constexpr uint8_t kGuardByte = 0xCD;
constexpr uint32_t kScratchFill = 0x7FC0FFEE;  // scratch is not zeroed: it holds junk (a NaN) at every run
// Every buffer the worker allocates is a whole number of these, filled in
// full before every run: no slack past a guard keeps state (the driver maps
// device memory in 2 MiB pages, so a smaller allocation's page has room a
// kernel could reach and nothing would reset).
constexpr size_t kPage = 2u << 20;
size_t RoundToPage(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
// Local-memory scrub kernels of the helper module, by frame size (1 KiB << i).
constexpr int kScrubLocalSizes = 7;  // 1, 2, 4, ... 64 KiB per thread
const char* const kScrubLocalNames[kScrubLocalSizes] = {"ks_scrub_local_1k",  "ks_scrub_local_2k",  "ks_scrub_local_4k",
                                                         "ks_scrub_local_8k",  "ks_scrub_local_16k", "ks_scrub_local_32k",
                                                         "ks_scrub_local_64k"};

struct LaunchSpec {
  CUfunction fn = nullptr;
  wire::Launch launch;
};

struct GlobalSnapshot {
  std::string name;
  CUdeviceptr ptr = 0;
  std::string bytes;
};

struct Candidate {
  std::string cubin;  // loaded again before every run but the first, where it has data (ModuleHasData)
  Module module;
  bool fresh = false;   // the module was (re)loaded and has not run since
  bool reload = true;   // ModuleHasData: the image has memory of its own to reset
  std::vector<LaunchSpec> launches;
  std::vector<DeviceBuffer> scratch;  // [guard][data][guard up to the allocation's end]
  std::vector<size_t> scratch_bytes;
  std::vector<GlobalSnapshot> globals;
  std::vector<std::vector<CUtensorMap>> tensor_maps;  // [map][input set], encoded at load
};

class Worker {
 public:
  explicit Worker(const CudaDriver* d) : d_(d) {}

  json Handle(const json& req, bool* quit) {
    const std::string cmd = wire::CommandOf(req);
    if (cmd == wire::InitRequest::kCmd) return Dispatch<wire::InitRequest>(req, &Worker::Init);
    if (cmd == wire::LoadRequest::kCmd) return Dispatch<wire::LoadRequest>(req, &Worker::Load);
    if (cmd == wire::RunRequest::kCmd) return Dispatch<wire::RunRequest>(req, &Worker::Run);
    if (cmd == wire::WarmRequest::kCmd) return Dispatch<wire::WarmRequest>(req, &Worker::Warm);
    if (cmd == wire::UnloadRequest::kCmd) {
      cand_.reset();
      return wire::ToJson(wire::EmptyReply{});
    }
    if (cmd == wire::QuitRequest::kCmd) {
      *quit = true;
      return wire::ToJson(wire::EmptyReply{});
    }
    return Fail("internal", "unknown request '" + cmd + "'");
  }

  // The device's primary context, opened before the InitRequest comes (serve
  // --device N): the driver's start, most of the worker's, overlaps the
  // evaluator's own setup. Its answer is the worker's first message.
  json OpenEarly(int device) {
    auto ctx = PrimaryContext::Open(device);
    if (!ctx.ok()) return Fail("internal", ctx.status().message(), true);
    ctx_ = std::move(*ctx);
    ctx_device_ = device;
    return wire::ToJson(wire::EmptyReply{});
  }

  bool fatal() const { return fatal_; }

 private:
  static json Fail(const std::string& status, const std::string& message, bool fatal = false) {
    return wire::ToJson(wire::ErrorReply{status, message, fatal});
  }

  // Decodes the request into its struct and hands it to the handler, which
  // answers with its reply's JSON or an error reply.
  template <typename Req>
  json Dispatch(const json& j, json (Worker::*handler)(const Req&)) {
    auto req = wire::FromJson<Req>(j);
    if (!req.ok()) return Fail("internal", std::string(Req::kCmd) + " request: " + req.status().message());
    return (this->*handler)(*req);
  }

  json Init(const wire::InitRequest& req) {
    if (ctx_device_ != req.device) {
      auto ctx = PrimaryContext::Open(req.device);
      if (!ctx.ok()) return Fail("internal", ctx.status().message());
      ctx_ = std::move(*ctx);
      ctx_device_ = req.device;
    }
    // Device printf is captured in the worker's log; a capped FIFO bounds a flood.
    d_->cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE, req.printf_fifo_bytes);
    // The device heap outlives a run, so a kernel could keep results in it.
    // The compiler refuses malloc/free/new (evaluator/compile/compiler.cc); as a
    // second wall the heap is made as small as the driver allows, before any
    // module is loaded.
    // The per-thread stack as small as the driver allows (it raises it for a
    // kernel that needs more, and ResetStack lowers it again before the
    // local-memory scrub): a thread's local window is its frame plus this
    // stack, and the scrub's frame covers only what lies above the stack, so
    // a larger stack would leave holes the scrub never writes (measured:
    // bench/lmem_probe).
    d_->cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0);
    if (d_->cuCtxGetLimit(&min_stack_, CU_LIMIT_STACK_SIZE) != CUDA_SUCCESS) min_stack_ = 0;
    size_t heap = 0;
    for (size_t want : {size_t{0}, size_t{1}, size_t{4096}})
      if (d_->cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE, want) == CUDA_SUCCESS) break;
    if (d_->cuCtxGetLimit(&heap, CU_LIMIT_MALLOC_HEAP_SIZE) != CUDA_SUCCESS) heap = SIZE_MAX;
    if (req.ipc_handle.size() != sizeof(CUipcMemHandle)) return Fail("internal", "bad IPC handle");
    CUipcMemHandle h;
    std::memcpy(&h, req.ipc_handle.data(), sizeof h);
    CUresult r = d_->cuIpcOpenMemHandle(&arena_, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (r != CUDA_SUCCESS) return Fail("internal", "cuIpcOpenMemHandle: " + d_->ErrorName(r));
    outputs_ = req.outputs;
    size_t flush = req.l2_flush_bytes ? RoundToPage(req.l2_flush_bytes) : 0;
    if (flush) {
      auto b = DeviceBuffer::Alloc(flush);
      if (!b.ok()) return Fail("internal", b.status().message());
      flush_ = std::move(*b);
    }
    // The timing pad: a helper kernel from the evaluator, launched after the
    // flush so the start event and this run's launches queue behind GPU work.
    if (!req.helper_cubin.empty()) {
      auto m = Module::Load(req.helper_cubin);
      if (!m.ok()) return Fail("internal", "loading the timing pad: " + m.status().message());
      auto f = m->Function("ks_timing_pad");
      if (!f.ok()) return Fail("internal", f.status().message());
      auto scrub = m->Function("ks_scrub_shared");
      if (!scrub.ok()) return Fail("internal", scrub.status().message());
      pad_module_ = std::move(*m);
      pad_fn_ = *f;
      sms_ = req.sms;
      pad_ns_ = req.pad_ns;
      // Shared memory is not cleared between launches: one block per SM that
      // holds the opt-in maximum overwrites all of it before every run.
      scrub_bytes_ = req.scrub_shared_bytes;
      scrub_blocks_ = req.sms;
      if (scrub_bytes_ && scrub_blocks_) {
        CUresult r = d_->cuFuncSetAttribute(*scrub, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, scrub_bytes_);
        if (r != CUDA_SUCCESS) return Fail("internal", "shared-memory scrub: " + d_->ErrorName(r));
        scrub_fn_ = *scrub;
      }
      if (auto st = InitLocalScrub(); !st.ok())
        return Fail("internal", "local-memory scrub: " + st.message());
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
    return wire::ToJson(wire::InitReply{info.ok() ? info->name : "?", getpid(), heap});
  }

  json Load(const wire::LoadRequest& req) {
    cand_.reset();
    Candidate c;
    auto m = Module::Load(req.cubin);
    if (!m.ok()) return Fail("launch_error", m.status().message());
    c.module = std::move(*m);
    c.cubin = req.cubin;
    c.fresh = true;
    c.reload = ModuleHasData(c.cubin);  // evaluator/compile/compiler.h
    wire::LoadReply reply;
    for (const auto& l : req.launches) {
      LaunchSpec s;
      s.launch = l;
      auto fn = c.module.Function(l.kernel);
      if (!fn.ok()) return Fail("launch_error", fn.status().message());
      s.fn = *fn;
      if (Status st = PrepareFunction(*d_, s.fn, l.shape, l.kernel); !st.ok()) return Fail("launch_error", st.message());
      for (const auto& a : l.args)
        if ((a.kind == wire::Arg::Kind::kScratch && (a.index < 0 || static_cast<size_t>(a.index) >= req.scratch_bytes.size())) ||
            (a.kind == wire::Arg::Kind::kTensorMap && (a.index < 0 || static_cast<size_t>(a.index) >= req.tensor_maps.size())) ||
            (a.kind == wire::Arg::Kind::kTensor && a.offsets.empty()))
          return Fail("internal", l.kernel + ": an argument refers to nothing");
      reply.occupancy.push_back(QueryOccupancy(*d_, s.fn, l.shape));
      c.launches.push_back(std::move(s));
    }
    if (auto bad = ChooseLocalScrub(c)) return *bad;
    for (uint64_t bytes : req.scratch_bytes) {
      const size_t total = RoundToPage(bytes + 2 * kGuardBytes);
      auto buf = DeviceBuffer::Alloc(total);
      if (!buf.ok()) return Fail("launch_error", "scratch of " + std::to_string(bytes) + " bytes: " + buf.status().message());
      CUresult r = d_->cuMemsetD8(buf->get(), kGuardByte, total);
      if (r != CUDA_SUCCESS) return Fail("internal", "cuMemsetD8: " + d_->ErrorName(r));
      c.scratch.push_back(std::move(*buf));
      c.scratch_bytes.push_back(bytes);
    }
    for (size_t i = 0; i < req.tensor_maps.size(); ++i) {
      auto maps = EncodeTensorMaps(req.tensor_maps[i], c);
      if (!maps.ok())
        return Fail("invalid_plan", "tensor_maps[" + std::to_string(i) + "] (" + req.tensor_maps[i].spec.name +
                                        "): " + maps.status().message());
      c.tensor_maps.push_back(std::move(*maps));
    }
    // Module-scope variables persist across launches: snapshot them now and
    // restore before every run (stops caching results or counting calls in them).
    for (const auto& g : req.globals) {
      GlobalSnapshot s;
      s.name = g.name;
      size_t size = 0;
      if (d_->cuModuleGetGlobal(&s.ptr, &size, c.module.get(), s.name.c_str()) != CUDA_SUCCESS) continue;
      s.bytes.resize(size);
      if (size && d_->cuMemcpyDtoH(s.bytes.data(), s.ptr, size) != CUDA_SUCCESS)
        return Fail("internal", "cannot read global " + s.name);
      c.globals.push_back(std::move(s));
    }
    cand_ = std::move(c);
    reply.globals = cand_->globals.size();
    return wire::ToJson(reply);
  }

  // One CUtensorMap per input set (one for scratch), encoded by the driver
  // on this process's own mapping of the arena: the address in a map is a
  // virtual address of the context that uses it. The spec was checked by the
  // plan parser; the address rule and the driver's own verdict are checked here.
  StatusOr<std::vector<CUtensorMap>> EncodeTensorMaps(const wire::TensorMap& t, const Candidate& c) {
    std::vector<CUdeviceptr> bases;
    if (t.scratch >= 0) {
      if (static_cast<size_t>(t.scratch) >= c.scratch.size()) return Internal("no such scratch buffer");
      bases.push_back(c.scratch[t.scratch].get() + kGuardBytes);
    } else {
      for (uint64_t off : t.offsets) bases.push_back(arena_ + off);
    }
    if (bases.empty()) return Internal("a tensor map with no address");
    std::vector<CUtensorMap> out;
    for (CUdeviceptr base : bases) {
      KS_ASSIGN_OR_RETURN(CUtensorMap m, EncodeTensorMap(*d_, t.spec, base));
      out.push_back(m);
    }
    return out;
  }

  // Every run is prepared the same way, so a kernel cannot tell a checked run
  // from a timed one: all runs are both. A run with "split" also records an
  // event between launches, for the time of each launch on its own; the
  // evaluator never counts such a run in the plan's timing.
  json Run(const wire::RunRequest& req) {
    if (!cand_) return Fail("internal", "run without a loaded candidate");
    const size_t set = req.set;
    const bool split = req.split;
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
    if (auto bad = Prepare(/*timed=*/true, /*isolated=*/true)) return *bad;
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
    wire::RunReply reply;
    reply.ms = ms;
    reply.ms_device = device_wide;
    if (auto bad = AfterChecks(&reply.state_changed)) return *bad;
    if (split) {
      for (size_t li = 0; li < c.launches.size(); ++li) {
        float t = 0;
        d_->cuEventElapsedTime(&t, between_[li].get(), between_[li + 1].get());
        reply.launch_ms.push_back(t);
      }
    }
    return wire::ToJson(reply);
  }

  // Warm-up: `runs` runs of the plan back to back, input sets in turn from
  // `first_set`, with one synchronize at the end instead of one per run. Each
  // run is prepared as a timed run is (globals restored, scratch refilled,
  // outputs poisoned, shared memory scrubbed) except for the L2 flush and the
  // pad, which only matter to a figure and none is taken here. The checks
  // that follow a run (scratch guards, globals) are made once, after the last
  // run; the evaluator then verifies the last run's outputs and every input set.
  json Warm(const wire::WarmRequest& req) {
    if (!cand_) return Fail("internal", "warm-up without a loaded candidate");
    const int runs = req.runs;
    const size_t sets = std::max<size_t>(1, req.sets);
    const size_t first = req.first_set;
    for (int i = 0; i < runs; ++i) {
      // Only the last run is checked: it alone must start from clean state.
      if (auto bad = Prepare(/*timed=*/false, /*isolated=*/i == runs - 1)) return *bad;
      if (auto bad = LaunchPlan((first + i) % sets, /*split=*/false)) return *bad;
    }
    if (CUresult r = d_->cuCtxSynchronize(); r != CUDA_SUCCESS) return Sticky("running the plan", r);
    wire::WarmReply reply;
    reply.runs = runs;
    if (auto bad = AfterChecks(&reply.state_changed)) return *bad;
    return wire::ToJson(reply);
  }

  // Before a run: scratch refilled with junk, outputs poisoned, shared memory
  // scrubbed. Before a checked run (`isolated`: every run but a warm-up's
  // first ones) also everything a previous run could have left state in: the
  // module loaded afresh, the L2 flush buffer rewritten, local memory
  // scrubbed. A timed run also gets the pad. Warm-up runs before the last are
  // neither timed nor checked, so what one leaves for the next decides
  // nothing, and the last (checked) one is isolated from all of them. An
  // error reply, or nothing.
  std::optional<json> Prepare(bool timed, bool isolated) {
    Candidate& c = *cand_;
    // A fresh module for every checked run: every module-scope variable
    // (__device__, __managed__, __constant__, .global declared in inline asm,
    // whatever the PTX regex finds or not) starts from the image again. An
    // image with no memory of its own (code, parameters and shared memory
    // only) has none to reset.
    if (isolated && !c.fresh && c.reload)
      if (auto bad = Reload(c)) return *bad;
    c.fresh = false;
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
    if (isolated) {
      // The flush buffer is rewritten in full, so it keeps nothing either.
      if (flush_.get() && d_->cuMemsetD32(flush_.get(), static_cast<uint32_t>(runs_), flush_.bytes() / 4) != CUDA_SUCCESS)
        return Sticky("flushing L2");
      if (auto bad = ScrubLocal()) return *bad;
    }
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
    // One slot per argument, each large and aligned enough for a CUtensorMap
    // (128 bytes, 64-byte aligned); the driver copies the parameter's own size.
    struct alignas(64) Slot { unsigned char bytes[128]; };
    std::vector<Slot> storage;
    std::vector<void*> params;
    for (size_t li = 0; li < c.launches.size(); ++li) {
      const LaunchSpec& l = c.launches[li];
      const auto& args = l.launch.args;
      storage.assign(args.size(), Slot{});
      params.assign(args.size(), nullptr);
      for (size_t i = 0; i < args.size(); ++i) {
        const wire::Arg& a = args[i];
        unsigned char* p = storage[i].bytes;
        switch (a.kind) {
          case wire::Arg::Kind::kTensor: {
            uint64_t off = a.offsets.size() > set ? a.offsets[set] : a.offsets[0];
            CUdeviceptr v = arena_ + off;
            std::memcpy(p, &v, 8);
            break;
          }
          case wire::Arg::Kind::kScratch: {
            CUdeviceptr v = c.scratch[a.index].get() + kGuardBytes;
            std::memcpy(p, &v, 8);
            break;
          }
          case wire::Arg::Kind::kTensorMap: {
            const auto& maps = c.tensor_maps[a.index];
            std::memcpy(p, &maps[maps.size() > set ? set : 0], sizeof(CUtensorMap));
            break;
          }
          case wire::Arg::Kind::kI32: { int32_t v = static_cast<int32_t>(a.i); std::memcpy(p, &v, 4); break; }
          case wire::Arg::Kind::kI64: { int64_t v = a.i; std::memcpy(p, &v, 8); break; }
          case wire::Arg::Kind::kF32: { float v = static_cast<float>(a.f); std::memcpy(p, &v, 4); break; }
          case wire::Arg::Kind::kF64: { double v = a.f; std::memcpy(p, &v, 8); break; }
        }
        params[i] = p;
      }
      CUresult r = Launch(*d_, l.fn, l.launch.shape, params.data(), nullptr);
      if (r != CUDA_SUCCESS) {
        // A launch refused up front (too many resources, bad config) leaves the
        // context usable; anything sticky shows up at the synchronize.
        CUresult s = d_->cuCtxSynchronize();
        if (s != CUDA_SUCCESS) return Sticky("launching " + l.launch.kernel, s);
        return Fail("launch_error", "launching " + l.launch.kernel + ": " + d_->ErrorName(r));
      }
      if (split) d_->cuEventRecord(between_[li + 1].get(), nullptr);
    }
    return std::nullopt;
  }

  // After a run (synchronized): the scratch guards, and the globals, which
  // must hold their load-time values again (names that do not go in *changed).
  std::optional<json> AfterChecks(std::vector<std::string>* changed) {
    Candidate& c = *cand_;
    // Guard regions around scratch: a write past either end is a memory error.
    // The back guard runs to the allocation's end (its page's slack included).
    for (size_t i = 0; i < c.scratch.size(); ++i) {
      const size_t back = kGuardBytes + c.scratch_bytes[i];
      for (auto [where, bytes] : {std::pair<size_t, size_t>{0, kGuardBytes},
                                  std::pair<size_t, size_t>{back, c.scratch[i].bytes() - back}}) {
        auto n = CountNotGuard(c.scratch[i].get() + where, bytes);
        if (!n) return Sticky("checking scratch guards");
        if (*n) {
          d_->cuMemsetD8(c.scratch[i].get() + where, kGuardByte, bytes);
          return Fail("runtime_error", std::string("wrote ") + (where ? "past the end" : "before the start") +
                                           " of scratch buffer #" + std::to_string(i) +
                                           (where ? " (the guard runs to the end of its allocation)" : ""));
        }
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

  // The module unloaded and loaded again from its image, its functions and
  // globals looked up anew (a kernel's module-scope state dies with it).
  std::optional<json> Reload(Candidate& c) {
    if (CUresult r = d_->cuCtxSynchronize(); r != CUDA_SUCCESS) return Sticky("before reloading the module", r);
    c.module = Module();
    auto m = Module::Load(c.cubin);
    if (!m.ok()) return Sticky("reloading the module");
    c.module = std::move(*m);
    for (LaunchSpec& s : c.launches) {
      auto fn = c.module.Function(s.launch.kernel);
      if (!fn.ok()) return Sticky("reloading " + s.launch.kernel);
      s.fn = *fn;
      if (Status st = PrepareFunction(*d_, s.fn, s.launch.shape, s.launch.kernel); !st.ok())
        return Fail("launch_error", st.message(), true);
    }
    for (GlobalSnapshot& g : c.globals) {
      size_t size = 0;
      if (d_->cuModuleGetGlobal(&g.ptr, &size, c.module.get(), g.name.c_str()) != CUDA_SUCCESS || size != g.bytes.size())
        return Sticky("finding global " + g.name + " after a reload");
    }
    return std::nullopt;
  }

  // The local-memory scrub kernels (helper module) and their launch shape:
  // as many blocks as can be resident at once on every SM, so that every
  // warp slot's local memory is written (ks_scrub_local waits until all
  // blocks have arrived before it writes).
  Status InitLocalScrub() {
    auto b = DeviceBuffer::Alloc(kPage);
    if (!b.ok()) return b.status();
    scrub_counter_ = std::move(*b);
    for (int i = 0; i < kScrubLocalSizes; ++i) {
      KS_ASSIGN_OR_RETURN(scrub_local_[i], pad_module_.Function(kScrubLocalNames[i]));
      int per_sm = 0;
      if (CUresult r = d_->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, scrub_local_[i], kScrubLocalBlock, 0);
          r != CUDA_SUCCESS || per_sm <= 0)
        return Internal(std::string(kScrubLocalNames[i]) + ": no occupancy");
      scrub_local_blocks_[i] = static_cast<unsigned>(per_sm) * std::max(1u, sms_);
    }
    auto cnt = pad_module_.Function("count_not_fill");
    if (!cnt.ok()) return cnt.status();
    count_not_fill_ = *cnt;
    return Status::Ok();
  }

  // The scrub size for a candidate: at least every frame this context has
  // run (the candidate's kernels' local memory plus the stack), as the
  // driver sizes each thread's local window by the largest.
  std::optional<json> ChooseLocalScrub(const Candidate& c) {
    for (const LaunchSpec& s : c.launches) {
      int local = 0;
      d_->cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, s.fn);
      max_local_ = std::max(max_local_, static_cast<size_t>(std::max(local, 0)));
    }
    return SizeLocalScrub();
  }

  // The scrub's frame: at least every frame this context has run, plus the
  // largest stack the driver has had to give any of them.
  std::optional<json> SizeLocalScrub() {
    local_need_ = std::max(local_need_, max_local_ + max_stack_);
    scrub_local_index_ = 0;
    while (scrub_local_index_ < kScrubLocalSizes && (size_t{1024} << scrub_local_index_) < local_need_)
      ++scrub_local_index_;
    if (scrub_local_index_ == kScrubLocalSizes)
      return Fail("launch_error", "a kernel needs " + std::to_string(local_need_) +
                                      " bytes of local memory per thread (stack included); at most 64 KiB can be "
                                      "cleared between runs");
    return std::nullopt;
  }

  // Local memory (stacks, spills) is not cleared between launches: every
  // warp slot's whole local window is overwritten before every run.
  std::optional<json> ScrubLocal() {
    if (!scrub_counter_.get()) return std::nullopt;
    // A kernel that needed a larger stack made the driver raise the limit:
    // the scrub grows by as much, and the limit goes back to its minimum.
    size_t stack = 0;
    if (d_->cuCtxGetLimit(&stack, CU_LIMIT_STACK_SIZE) == CUDA_SUCCESS && stack > min_stack_) {
      max_stack_ = std::max(max_stack_, stack - min_stack_);
      if (auto bad = SizeLocalScrub()) return bad;
      if (CUresult r = d_->cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 0); r != CUDA_SUCCESS)
        return Sticky("lowering the stack limit", r);
    }
    if (d_->cuMemsetD32(scrub_counter_.get(), 0, scrub_counter_.bytes() / 4) != CUDA_SUCCESS)
      return Sticky("resetting the local-memory scrub");
    const int i = scrub_local_index_;
    uint32_t v = static_cast<uint32_t>(runs_ * 0x85EBCA6Bu);
    CUdeviceptr counter = scrub_counter_.get();
    unsigned target = scrub_local_blocks_[i];
    void* args[] = {&v, &counter, &target};
    if (CUresult r = d_->cuLaunchKernel(scrub_local_[i], scrub_local_blocks_[i], 1, 1, kScrubLocalBlock, 1, 1, 0,
                                        nullptr, args, nullptr);
        r != CUDA_SUCCESS)
      return Sticky("scrubbing local memory", r);
    return std::nullopt;
  }

  // Bytes in [p, p + bytes) that are not the guard byte (a helper kernel; synchronous).
  std::optional<uint64_t> CountNotGuard(CUdeviceptr p, size_t bytes) {
    if (bytes == 0) return 0;
    CUdeviceptr count = scrub_counter_.get() + kPage - 64;
    if (d_->cuMemsetD8(count, 0, 8) != CUDA_SUCCESS) return std::nullopt;
    unsigned long long n = bytes;
    unsigned fill = kGuardByte;
    void* args[] = {&p, &n, &fill, &count};
    unsigned grid = static_cast<unsigned>(std::clamp<uint64_t>((n + 255) / 256, 1, 8 * std::max(1u, sms_)));
    if (d_->cuLaunchKernel(count_not_fill_, grid, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr) != CUDA_SUCCESS)
      return std::nullopt;
    uint64_t result = 0;
    if (d_->cuMemcpyDtoH(&result, count, 8) != CUDA_SUCCESS) return std::nullopt;
    return result;
  }

  json Sticky(const std::string& what, CUresult r = CUDA_ERROR_UNKNOWN) {
    fatal_ = true;
    return Fail("runtime_error", what + ": " + d_->ErrorName(r), true);
  }

  const CudaDriver* d_;
  PrimaryContext ctx_;
  int ctx_device_ = -1;  // the ordinal ctx_ is of; -1 before it is open
  CUdeviceptr arena_ = 0;
  std::vector<wire::OutputRegion> outputs_;
  DeviceBuffer flush_;
  Module pad_module_;
  CUfunction pad_fn_ = nullptr;
  uint64_t pad_ns_ = 0;
  CUfunction scrub_fn_ = nullptr;
  unsigned scrub_bytes_ = 0, scrub_blocks_ = 0;
  static constexpr unsigned kScrubLocalBlock = 128;
  unsigned sms_ = 0;
  CUfunction scrub_local_[kScrubLocalSizes] = {};
  unsigned scrub_local_blocks_[kScrubLocalSizes] = {};
  int scrub_local_index_ = 0;
  size_t local_need_ = 0;          // the scrub frame needed (bytes per thread): SizeLocalScrub
  size_t max_local_ = 0;           // the largest CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES loaded
  size_t min_stack_ = 0;           // the smallest stack limit the driver allows (256 B on an H100)
  size_t max_stack_ = 0;           // the most the driver raised it above that for a kernel
  DeviceBuffer scrub_counter_;     // the scrub's arrival counter; the guard count's result at its end
  CUfunction count_not_fill_ = nullptr;
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
    (void)SendMessage(proto_fd, wire::ToJson(wire::ErrorReply{"internal", d.status().message(), true}));
    return 3;
  }
  Worker w(*d);
  // `serve --device N`: the context now, and a word on it (OpenEarly).
  if (argc >= 3 && std::string(argv[1]) == "--device") {
    char* end = nullptr;
    const long device = std::strtol(argv[2], &end, 10);
    json opened = end && *end == '\0' && device >= 0 && device <= INT32_MAX
                      ? w.OpenEarly(static_cast<int>(device))
                      : wire::ToJson(wire::ErrorReply{"internal", std::string("bad --device ") + argv[2], true});
    if (!SendMessage(proto_fd, opened).ok() || wire::ErrorOf(opened)) return 3;
  }
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
