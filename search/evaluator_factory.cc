#include "search/evaluator_factory.h"

#include <algorithm>
#include <chrono>
#include <future>

#include "evaluator/cuda_driver.h"
#include "evaluator/gpu_evaluator.h"
#include "evaluator/problem.h"
#include "evaluator/reference/kept_reference.h"
#include "search/evaluator_pool.h"
#include "search/scripted_evaluator.h"

namespace ks {

GpuFacts GpuFactsFromDevice(const DeviceInfo& info, double measured_bandwidth_gbps, const DevicePeaks* peaks) {
  GpuFacts g;
  g.name = info.name;
  g.compute_capability = std::to_string(info.sm_major) + "." + std::to_string(info.sm_minor);
  g.sm_count = info.multiprocessors;
  g.shared_bytes_per_block = info.shared_per_block_optin;
  g.l2_bytes = info.l2_bytes;
  g.shared_bytes_per_sm = info.shared_per_sm;
  g.registers_per_sm = info.registers_per_sm;
  g.max_threads_per_sm = info.max_threads_per_sm;
  g.max_blocks_per_sm = info.max_blocks_per_sm;
  // No driver attribute says it; 255 holds for every GPU the evaluator runs on (sm_50 and later).
  if (info.sm_major >= 5) g.max_registers_per_thread = 255;
  g.memory_bandwidth_gbps = measured_bandwidth_gbps;
  if (peaks) {
    g.fp32_tflops = peaks->For("fp32");
    g.tf32_tflops = peaks->For("tf32");
    g.fp16_tensor_tflops = std::max(peaks->For("fp16"), peaks->For("bf16"));
  }
  return g;
}

StatusOr<int> CudaDeviceCount() {
  KS_ASSIGN_OR_RETURN(const CudaDriver* d, CudaDriver::Get());
  int count = 0;
  KS_RETURN_IF_ERROR(d->Check(d->cuDeviceGetCount(&count), "cuDeviceGetCount"));
  return count;
}

namespace {

bool IsFakeSpec(const std::string& spec) { return spec == "fake" || spec.rfind("fake:", 0) == 0; }

}  // namespace

StatusOr<std::vector<int>> ResolveGpus(const EvaluatorOptions& options) {
  if (options.gpus.empty()) return std::vector<int>{options.device};
  int count = -1;  // a fake evaluator stands for any GPU
  if (!IsFakeSpec(options.spec)) {
    KS_ASSIGN_OR_RETURN(count, CudaDeviceCount());
  }
  return ParseGpuList(options.gpus, count);
}

EvaluatorOptions PracticeEvaluatorOptions(EvaluatorOptions eo) {
  eo.reference_seed = kPracticeReferenceSeed;
  eo.reveal_reference_values = false;  // the agent's tools give error figures, never reference values
  eo.gpus = "";  // one GPU: an agent's test is one candidate at a time
  return eo;
}

ReferenceOptions ReferenceOptionsFor(const EvaluatorOptions& options) {
  ReferenceOptions ro;
  ro.bridge.python = options.python;
  ro.sets = options.sets;
  ro.device = "cuda";
  ro.time = true;
  ro.seed = options.reference_seed;
  ro.precision = ContractName(options.precision);  // the baselines timed under the contract judged under
  ro.cache_dir = options.cache_dir;
  ro.cache_cap = options.cache_cap;
  ro.keep_s = options.keep_reference_s;
  if (options.practice_sets > 0) {
    ro.practice_sets = options.practice_sets;
    ro.practice_seed = kPracticeReferenceSeed;
  }
  return ro;
}

GpuEvaluatorOptions GpuEvaluatorOptionsFor(const EvaluatorOptions& options, int device, size_t gpus) {
  GpuEvaluatorOptions go;
  go.device = device;
  go.python = options.python;
  go.compile_threads = CompileThreadsPerGpu(gpus);
  go.precision = ContractName(options.precision);
  go.reveal_reference_values = options.reveal_reference_values;
  go.drop_privileges = options.drop_privileges;
  go.run_timeout_s = options.run_timeout_s;
  go.timing = options.timing;
  // The helper kernels' cubin beside the reference cache: compiled once per machine, not per command.
  go.helper_cache_dir = (options.cache_dir.empty() ? DefaultReferenceCacheDir() : options.cache_dir) + "/helpers";
  return go;
}

namespace {

StatusOr<SearchEvaluator> MakeScriptedEvaluator(const std::string& problem_file, const EvaluatorOptions& options) {
  SearchEvaluator made;
  ScriptedEvaluatorOptions o;
  if (options.spec != "fake") {
    KS_ASSIGN_OR_RETURN(o, LoadScriptedEvaluatorOptions(options.spec.substr(5)));
  }
  made.gpu = o.gpu;
  if (o.check_reference) {
    // The fake stands for the GPU side: it checks the reference as the GPU
    // evaluator does while preparing it, with the real bridge on the CPU.
    KS_ASSIGN_OR_RETURN(made.degenerate, CheckProblem(problem_file, BridgeOptions{.python = options.python}, "cpu"));
  }
  KS_ASSIGN_OR_RETURN(std::vector<int> devices, ResolveGpus(options));
  if (devices.size() == 1) {
    made.evaluator = std::make_unique<ScriptedEvaluator>(std::move(o));
    return made;
  }
  auto make = [&o](int) -> StatusOr<std::unique_ptr<CandidateEvaluator>> {
    return std::unique_ptr<CandidateEvaluator>(std::make_unique<ScriptedEvaluator>(o));
  };
  KS_ASSIGN_OR_RETURN(auto pool, EvaluatorPool::Create(devices, make));
  made.evaluator = std::move(pool);
  return made;
}

// The reference of `problem_file` for the GPUs `devices`: sets beyond what
// the GPU holds are not prepared (at least 2; a warning says so): one
// reference serves every GPU, so the smallest free memory counts.
StatusOr<ReferenceData> PrepareGpuReference(const std::string& problem_file, const EvaluatorOptions& options,
                                            const std::vector<int>& devices) {
  const auto started = std::chrono::steady_clock::now();
  ReferenceOptions ro = ReferenceOptionsFor(options);
  // The bridge's interpreter is probed (python starts, no torch import) while
  // this process reads the GPUs' free memory: two waits at once.
  auto probed = std::async(std::launch::async, [&ro] { WarmReferenceProbe(ro.bridge); });
  for (int d : devices) {
    if (auto free_mem = FreeDeviceMemory(d); free_mem.ok()) {
      uint64_t budget = *free_mem / 10 * 9;
      if (ro.device_budget == 0 || budget < ro.device_budget) ro.device_budget = budget;
    }
  }
  probed.wait();
  const double budget_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  KS_ASSIGN_OR_RETURN(ReferenceData d, PrepareReference(problem_file, ro));
  d.phases.insert(d.phases.begin(), {"GPUs' free memory, the interpreter probed meanwhile", budget_s});
  return d;
}

StatusOr<SearchEvaluator> MakeGpuEvaluators(const std::string& problem_file, const EvaluatorOptions& options) {
  // Checked before the reference is computed, so a CPU-only node says so at once.
  std::string why;
  if (!GpuAvailable(&why))
    return FailedPrecondition("evaluating " + problem_file + " needs a GPU (" + why +
                              "); use --generate-only here and `kernelsearch evaluate-pending` on a GPU node");
  KS_ASSIGN_OR_RETURN(std::vector<int> devices, ResolveGpus(options));
  // Short of GPU memory: a reference kept by an earlier command may be why.
  const std::string cache_dir = options.cache_dir.empty() ? DefaultReferenceCacheDir() : options.cache_dir;
  auto prepared = PrepareGpuReference(problem_file, options, devices);
  if (!prepared.ok()) return WithKeptMemoryHint(prepared.status(), cache_dir);
  ReferenceData ref = std::move(prepared).value();
  SearchEvaluator made;
  made.degenerate = ref.degenerate;
  made.reference = {.from_cache = ref.from_cache,
                    .phases = ref.phases,
                    .warnings = ref.warnings,
                    .notes = ref.notes,
                    .evicted = ref.evicted,
                    .signature = ref.signature,
                    .kept = ref.resident ? ref.resident->kept() : std::nullopt,
                    .setup_phases = {}};
  const auto setup_start = std::chrono::steady_clock::now();
  made.gpu_evaluators.resize(devices.size());
  // The prompts describe the first GPU (the GPUs of one host are alike), and
  // the agent practises on it (between the pool's batches).
  auto make_one = [&](size_t i) -> StatusOr<std::unique_ptr<GpuEvaluator>> {
    auto created = GpuEvaluator::Create(ref, GpuEvaluatorOptionsFor(options, devices[i], devices.size()));
    if (!created.ok()) return WithKeptMemoryHint(created.status(), cache_dir);
    std::unique_ptr<GpuEvaluator> ev = std::move(created).value();
    made.gpu_evaluators[i] = ev.get();
    if (i == 0 && options.describe_device) {
      // Peaks are measured once per GPU and cached; a failure only leaves them unknown in prompts.
      auto peaks = ev->Peaks();
      made.gpu = GpuFactsFromDevice(ev->device_info(), ev->measured_bandwidth_gbps(), peaks.ok() ? &*peaks : nullptr);
    }
    if (i == 0 && options.practice_sets > 0 && ev->has_practice_sets()) made.practice = ev->PracticeView();
    return ev;
  };
  if (devices.size() == 1) {
    KS_ASSIGN_OR_RETURN(made.evaluator, make_one(0));
  } else {
    auto make = [&](int device) -> StatusOr<std::unique_ptr<CandidateEvaluator>> {
      const size_t i = std::find(devices.begin(), devices.end(), device) - devices.begin();
      KS_ASSIGN_OR_RETURN(std::unique_ptr<GpuEvaluator> ev, make_one(i));
      return std::unique_ptr<CandidateEvaluator>(std::make_unique<DeviceBoundEvaluator>(std::move(ev), device));
    };
    KS_ASSIGN_OR_RETURN(made.evaluator, EvaluatorPool::Create(devices, make));
  }
  made.reference.setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  if (!made.gpu_evaluators.empty() && made.gpu_evaluators[0])
    made.reference.setup_phases = made.gpu_evaluators[0]->setup_phases();
  return made;
}

}  // namespace

StatusOr<SearchEvaluator> MakeSearchEvaluator(const std::string& problem_file, const EvaluatorOptions& options) {
  if (IsFakeSpec(options.spec)) return MakeScriptedEvaluator(problem_file, options);
  if (options.spec.empty() || options.spec == "gpu") return MakeGpuEvaluators(problem_file, options);
  return InvalidArgument("unknown evaluator '" + options.spec + "' (gpu, fake, fake:FILE)");
}

StatusOr<std::unique_ptr<CandidateEvaluator>> MakeEvaluator(const std::string& problem_file,
                                                            const EvaluatorOptions& options) {
  KS_ASSIGN_OR_RETURN(SearchEvaluator made, MakeSearchEvaluator(problem_file, options));
  return std::move(made.evaluator);
}

}  // namespace ks
