#include "search/evaluator_factory.h"

#include <algorithm>

#include "evaluator/cuda_driver.h"
#include "evaluator/gpu_evaluator.h"
#include "evaluator/problem.h"
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

StatusOr<SearchEvaluator> MakeSearchEvaluator(const std::string& problem_file, const EvaluatorOptions& options) {
  const std::string& spec = options.spec;
  SearchEvaluator made;
  if (IsFakeSpec(spec)) {
    ScriptedEvaluatorOptions o;
    if (spec != "fake") {
      KS_ASSIGN_OR_RETURN(o, LoadScriptedEvaluatorOptions(spec.substr(5)));
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
  if (spec.empty() || spec == "gpu") {
    // Checked before the reference is computed, so a CPU-only node says so at once.
    std::string why;
    if (!GpuAvailable(&why))
      return FailedPrecondition("evaluating " + problem_file + " needs a GPU (" + why +
                                "); use --generate-only here and `kernelsearch evaluate-pending` on a GPU node");
    KS_ASSIGN_OR_RETURN(std::vector<int> devices, ResolveGpus(options));
    ReferenceOptions ro;
    ro.bridge.python = options.python;
    ro.device = "cuda";
    ro.time = true;
    ro.seed = options.reference_seed;
    ro.precision = options.precision;  // the baselines timed under the contract judged under
    if (options.practice_sets > 0) {
      ro.practice_sets = options.practice_sets;
      ro.practice_seed = kPracticeReferenceSeed;
    }
    // Sets beyond what the GPU holds are not prepared (at least 2; a warning
    // says so): one reference serves every GPU, so the smallest free memory counts.
    for (int d : devices) {
      if (auto free_mem = FreeDeviceMemory(d); free_mem.ok()) {
        uint64_t budget = *free_mem / 10 * 9;
        if (ro.device_budget == 0 || budget < ro.device_budget) ro.device_budget = budget;
      }
    }
    KS_ASSIGN_OR_RETURN(ReferenceData ref, PrepareReference(problem_file, ro));
    made.degenerate = ref.degenerate;
    auto make_one = [&](int device) -> StatusOr<std::unique_ptr<GpuEvaluator>> {
      GpuEvaluatorOptions go;
      go.device = device;
      go.python = options.python;
      go.compile_threads = CompileThreadsPerGpu(devices.size());
      go.precision = options.precision;
      go.reveal_reference_values = options.reveal_reference_values;
      return GpuEvaluator::Create(ref, go);
    };
    auto facts_of = [](GpuEvaluator* ev) {
      // Peaks are measured once per GPU and cached; a failure only leaves them unknown in prompts.
      auto peaks = ev->Peaks();
      return GpuFactsFromDevice(ev->device_info(), ev->measured_bandwidth_gbps(), peaks.ok() ? &*peaks : nullptr);
    };
    auto practice_of = [&](GpuEvaluator* ev) {
      if (options.practice_sets > 0 && ev->has_practice_sets()) made.practice = ev->PracticeView();
    };
    if (devices.size() == 1) {
      KS_ASSIGN_OR_RETURN(std::unique_ptr<GpuEvaluator> ev, make_one(devices.front()));
      made.gpu = facts_of(ev.get());
      practice_of(ev.get());
      made.evaluator = std::move(ev);
      return made;
    }
    // The prompts describe the first GPU (the GPUs of one host are alike).
    auto make = [&](int device) -> StatusOr<std::unique_ptr<CandidateEvaluator>> {
      KS_ASSIGN_OR_RETURN(std::unique_ptr<GpuEvaluator> ev, make_one(device));
      if (device == devices.front()) {
        made.gpu = facts_of(ev.get());
        practice_of(ev.get());  // the agent practises on the first GPU, between the pool's batches
      }
      return std::unique_ptr<CandidateEvaluator>(std::make_unique<DeviceBoundEvaluator>(std::move(ev), device));
    };
    KS_ASSIGN_OR_RETURN(auto pool, EvaluatorPool::Create(devices, make));
    made.evaluator = std::move(pool);
    return made;
  }
  return InvalidArgument("unknown evaluator '" + spec + "' (gpu, fake, fake:FILE)");
}

StatusOr<std::unique_ptr<CandidateEvaluator>> MakeEvaluator(const std::string& problem_file,
                                                            const EvaluatorOptions& options) {
  KS_ASSIGN_OR_RETURN(SearchEvaluator made, MakeSearchEvaluator(problem_file, options));
  return std::move(made.evaluator);
}

}  // namespace ks
