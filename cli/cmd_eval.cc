// kernelsearch eval PROBLEM CANDIDATE|DIR [--plan P] [--json]
// kernelsearch eval KERNELS_DIR --problems PROBLEMS_DIR [--json]: a folder of
// ready kernels scored against a level (the suite table and fast_p figures).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>
#include <vector>
#include <optional>

#include <nlohmann/json.hpp>

#include "cli/cli.h"
#include "cli/eval_format.h"
#include "evaluator/compile/candidate_parser.h"
#include "evaluator/gpu_evaluator.h"
#include "evaluator/problem.h"
#include "evaluator/reference/kept_reference.h"
#include "search/evaluator_factory.h"
#include "search/suite.h"

namespace ks::cli {
namespace {
namespace fs = std::filesystem;

struct EvalArgs {
  std::string problem, candidate, plan, python;
  std::string problems_dir;  // --problems: batch over a level
  std::string evaluator;     // "" / gpu, or fake[:FILE] (tests)
  std::string gpus;          // --gpus: "" = GPU 0; "all" or "0,1" (search/evaluator_pool.h)
  int sets = 3;
  bool json = false;
  bool keep_privileges = false;
  double run_timeout_s = 0;
  std::string timing = "adaptive";  // --timing: adaptive | full (GpuEvaluatorOptions::timing)
  Contract precision = Contract::kHighest;  // --precision (evaluator/judge/judge.h)
  CacheFlags cache;
  bool verbose = false;
  bool profile = false;      // --profile: hardware counters of each correct candidate (ncu)
  std::string keep_reference;  // --keep-reference DURATION ("" = $KS_KEEP_REFERENCE, else not kept)
};

// When this process started (static initialisation): --verbose's first phase
// is the time until the reference's preparation (driver start, candidates read).
const std::chrono::steady_clock::time_point kProcessStart = std::chrono::steady_clock::now();

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Candidates of a directory: every .md, and every .cu with a .json beside it.
std::vector<std::string> CandidateFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::string ext = e.path().extension().string();
    if (ext == ".md") out.push_back(e.path().string());
    if (ext == ".cu") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The evaluator options of eval's flags (search/evaluator_factory.h, the
// builder every command uses), for the evaluator `spec`.
StatusOr<EvaluatorOptions> EvalEvaluatorOptions(const EvalArgs& a, const std::string& spec) {
  EvaluatorOptions eo;
  eo.spec = spec;
  eo.python = a.python;
  eo.gpus = a.gpus;
  eo.precision = a.precision;
  eo.sets = a.sets;
  eo.drop_privileges = !a.keep_privileges;
  eo.run_timeout_s = a.run_timeout_s;
  eo.timing = a.timing == "full" ? TimingMode::kFull : TimingMode::kAdaptive;
  eo.describe_device = false;  // no prompts: no matmul peaks measured for them
  std::string keep = a.keep_reference;
  if (keep.empty())
    if (const char* env = std::getenv("KS_KEEP_REFERENCE")) keep = env;
  if (!keep.empty()) {
    auto s = ParseKeepDuration(keep);
    if (!s.ok())
      return InvalidArgument((a.keep_reference.empty() ? "$KS_KEEP_REFERENCE: " : "--keep-reference: ") +
                             s.status().message());
    eo.keep_reference_s = *s;
  }
  return eo;
}

// The GPU evaluators for one problem, one per device (--gpus, behind an
// EvaluatorPool), with eval's options: the reference is prepared once (the
// sets must fit on the GPU with the least free memory), then the evaluators
// are made at the same time, one thread per GPU, each with an equal share of
// the CPU cores for its compiles. Warnings go to stderr.
StatusOr<SearchEvaluator> MakeGpuEvaluators(const EvalArgs& a, const std::string& problem) {
  KS_ASSIGN_OR_RETURN(EvaluatorOptions eo, EvalEvaluatorOptions(a, "gpu"));
  KS_RETURN_IF_ERROR(ResolveGpus(eo).status());
  KS_ASSIGN_OR_RETURN(auto cache, ResolveCacheFlags(a.cache));
  std::tie(eo.cache_dir, eo.cache_cap) = cache;
  if (!a.json) std::fprintf(stderr, "preparing the reference for %s ...\n", problem.c_str());
  KS_ASSIGN_OR_RETURN(SearchEvaluator made, MakeSearchEvaluator(problem, eo));
  const ReferenceReport& ref = made.reference;
  for (const auto& w : ref.warnings) std::fprintf(stderr, "warning: %s: %s\n", problem.c_str(), w.c_str());
  if (ref.kept)
    std::fprintf(stderr, "%s\n", DescribeKept(*ref.kept).c_str());
  else if (eo.keep_reference_s > 0)
    std::fprintf(stderr,
                 "note: --keep-reference keeps only references held on the GPU (problems of 1 GiB or more, "
                 "$KS_RESIDENT_MIN_BYTES); %s's reference comes from the file cache\n",
                 problem.c_str());
  if (a.verbose) {
    // What the first evaluation of a problem spends its time on, for finding what dominates.
    std::fprintf(stderr, "phases (wall seconds)%s:\n", ref.from_cache ? ", reference from the cache" : "");
    std::fprintf(stderr, "  %-52s %8.3f\n", "process start to the evaluators' setup (all below it)",
                 SecondsSince(kProcessStart) - ref.setup_s);
    for (const auto& [name, s] : ref.phases) std::fprintf(stderr, "  %-52s %8.3f\n", name.c_str(), s);
    std::fprintf(stderr, "  %-52s %8.3f\n", "evaluator setup (upload, helpers, bandwidth, worker)", ref.setup_s);
    for (const auto& [name, s] : ref.setup_phases) std::fprintf(stderr, "    %-50s %8.3f\n", name.c_str(), s);
    for (const auto& e : ref.evicted) std::fprintf(stderr, "evicted from the cache: %s\n", e.c_str());
    for (const auto& n : ref.notes) std::fprintf(stderr, "note: %s\n", n.c_str());
    for (const auto& o : ref.signature.outputs)
      if (ref.signature.ToleranceFor(o).atol != ref.signature.ToleranceFor(o.dtype).atol)
        std::fprintf(stderr, "tolerance of '%s': %s\n", o.name.c_str(), ref.signature.DescribeTolerance(o).c_str());
  }
  if (ref.signature.flops.value_or(0) > 0) {
    for (GpuEvaluator* ev : made.gpu_evaluators)
      if (auto peaks = ev->Peaks(); !peaks.ok())
        std::fprintf(stderr, "warning: no compute floor for %s (the roofline uses bandwidth only): %s\n",
                     problem.c_str(), peaks.status().message().c_str());
  }
  return made;
}

// --evaluator fake[:FILE] (tests of --problems): the scripted evaluator, as a search makes it.
StatusOr<SearchEvaluator> MakeFakeEvaluator(const EvalArgs& a, const std::string& problem) {
  KS_ASSIGN_OR_RETURN(EvaluatorOptions eo, EvalEvaluatorOptions(a, a.evaluator));
  return MakeSearchEvaluator(problem, eo);
}

int WorkerRestarts(const SearchEvaluator& made) {
  int n = 0;
  for (const GpuEvaluator* ev : made.gpu_evaluators) n += ev->worker_restarts();
  return n;
}

// A folder of ready kernels against a folder of problems: kernels are matched
// to problems by name (19_ReLU.cu + 19_ReLU.json, or 19_ReLU.md, for
// 19_ReLU.py). One problem at a time, each with its own reference and worker,
// released before the next (a level's references need not fit at once). A
// problem without a kernel, or whose kernel or reference fails, is a row.
int RunLevel(const EvalArgs& a) {
  const std::string& kernels_dir = a.problem;
  if (!a.candidate.empty())
    return ReportError(InvalidArgument("with --problems, give one KERNELS_DIR (not '" + a.candidate + "')"));
  if (!fs::is_directory(kernels_dir)) return ReportError(InvalidArgument(kernels_dir + ": not a directory of kernels"));
  auto problems = ListProblemFiles({a.problems_dir});
  if (!problems.ok()) return ReportError(problems.status().WithContext("--problems"));
  bool fake = a.evaluator.rfind("fake", 0) == 0;
  if (!a.evaluator.empty() && a.evaluator != "gpu" && !fake)
    return ReportError(InvalidArgument("unknown evaluator '" + a.evaluator + "' (gpu, fake, fake:FILE)"));
  if (!fake) {
    std::string why;
    if (!GpuAvailable(&why)) return ReportError(FailedPrecondition("eval needs a GPU: " + why));
  }
  std::map<std::string, std::vector<std::string>> kernels;  // stem -> .md / .cu files
  for (const auto& f : CandidateFiles(kernels_dir)) kernels[fs::path(f).stem().string()].push_back(f);
  std::set<std::string> matched;

  SuiteReport report;
  if (!a.json) std::printf("%s", RenderSuiteHeader().c_str());
  for (size_t i = 0; i < problems->size(); ++i) {
    const std::string& problem = (*problems)[i];
    std::string stem = fs::path(problem).stem().string();
    SuiteProblemResult row;
    row.problem = stem;
    row.file = problem;
    auto it = kernels.find(stem);
    if (it == kernels.end()) {
      row.status = "no kernel";
      row.message = "no " + stem + ".cu or " + stem + ".md in " + kernels_dir;
    } else if (it->second.size() > 1) {
      matched.insert(stem);
      row.status = "error";
      row.message = "both " + fs::path(it->second[0]).filename().string() + " and " +
                    fs::path(it->second[1]).filename().string() + ": keep one";
    } else {
      matched.insert(stem);
      row.kernel_file = it->second[0];
      [&] {
        auto cand = LoadCandidateFiles(row.kernel_file, "");
        if (!cand.ok()) {
          row.status = "parse_error";
          row.message = cand.status().message();
          return;
        }
        auto made = fake ? MakeFakeEvaluator(a, problem) : MakeGpuEvaluators(a, problem);
        if (!made.ok()) {
          row.status = "error";
          row.message = made.status().message();
          return;
        }
        auto results = made->evaluator->EvaluateBatch({*cand});
        if (!results.ok() || results->size() != 1) {
          row.status = "error";
          row.message = results.ok() ? "the evaluator returned no result" : results.status().message();
          return;
        }
        std::string kernel_file = row.kernel_file;
        row = ResultFromEvaluation(problem, (*results)[0]);
        row.kernel_file = kernel_file;
      }();
    }
    if (a.json) {
      auto j = SuiteProblemResultToJson(row);
      j["event"] = "problem";
      j["index"] = i;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s", RenderSuiteRow(static_cast<int>(i), row).c_str());
    }
    std::fflush(stdout);
    report.rows.push_back(std::move(row));
  }
  for (const auto& [stem, files] : kernels)
    if (!matched.count(stem))
      std::fprintf(stderr, "warning: %s matches no problem in %s\n", files[0].c_str(), a.problems_dir.c_str());
  report.figures = ComputeSuiteFigures(report.rows);
  if (a.json) std::printf("%s\n", SuiteReportToJson(report).dump().c_str());
  else std::printf("%s", RenderSuiteFigures(report.figures).c_str());
  return report.figures.correct == report.figures.problems ? kExitOk : kExitFailed;
}

int Run(const EvalArgs& a) {
  if (!a.problems_dir.empty()) return RunLevel(a);
  if (a.problem.empty() || a.candidate.empty())
    return ReportError(InvalidArgument("eval: give PROBLEM and CANDIDATE (or KERNELS_DIR --problems PROBLEMS_DIR)"));
  if (!fs::is_regular_file(a.problem))
    return ReportError(InvalidArgument(a.problem + ": not a problem file (a folder of kernels goes with --problems DIR)"));
  if (!a.evaluator.empty() && a.evaluator != "gpu")
    return ReportError(InvalidArgument("--evaluator applies to KERNELS_DIR --problems DIR only"));
  std::vector<std::string> files;
  bool batch = fs::is_directory(a.candidate);
  if (batch) {
    files = CandidateFiles(a.candidate);
    if (files.empty()) return ReportError(InvalidArgument(a.candidate + ": no .md or .cu candidates in this directory"));
  } else {
    files = {a.candidate};
  }
  // Read every candidate first: a bad file is reported before any GPU work.
  std::vector<Candidate> cands;
  std::vector<std::string> load_errors(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    auto c = LoadCandidateFiles(files[i], batch ? "" : a.plan);
    if (!c.ok()) {
      if (!batch) return ReportError(c.status());
      load_errors[i] = c.status().message();
      cands.push_back({});
    } else {
      cands.push_back(*c);
    }
  }
  std::string why;
  if (!GpuAvailable(&why)) return ReportError(FailedPrecondition("eval needs a GPU: " + why));
  auto ev = MakeGpuEvaluators(a, a.problem);
  if (!ev.ok()) return ReportError(ev.status());
  std::vector<Candidate> to_eval;
  std::vector<size_t> index;
  for (size_t i = 0; i < cands.size(); ++i)
    if (load_errors[i].empty()) to_eval.push_back(cands[i]), index.push_back(i);
  const auto eval_start = std::chrono::steady_clock::now();
  auto results = ev->evaluator->EvaluateBatch(to_eval);
  if (!results.ok()) return ReportError(results.status());
  if (a.verbose) {
    std::fprintf(stderr, "  %-52s %8.3f\n", "candidates (compile, runs, checks, timing)", SecondsSince(eval_start));
    // Where the candidates' GPU time went, summed over all of them (compiles
    // run in parallel ahead of the GPU, so their sum is CPU time, not wall time).
    std::map<std::string, double> sums;
    double compile = 0;
    for (const auto& e : *results) {
      compile += e.compile_s;
      for (const auto& [name, sec] : e.phases) sums[name] += sec;
    }
    std::fprintf(stderr, "    %-50s %8.3f\n", "compile (CPU seconds, in parallel)", compile);
    for (const auto& [name, sec] : sums) std::fprintf(stderr, "    %-50s %8.3f\n", name.c_str(), sec);
  }
  if (a.profile) {
    // One more verified run of each correct candidate under Nsight Compute;
    // where counters cannot be read, the reason is said once and eval goes on.
    std::vector<Candidate> correct;
    std::vector<size_t> at;
    for (size_t k = 0; k < results->size(); ++k)
      if ((*results)[k].correct()) correct.push_back(to_eval[k]), at.push_back(k);
    auto reports = ev->evaluator->ReadCounters(correct);
    std::string said;
    for (size_t k = 0; k < at.size() && k < reports.size(); ++k) {
      (*results)[at[k]].counters = reports[k];
      if (reports[k].launches.empty() && reports[k].note != said)
        std::fprintf(stderr, "note: no hardware counters: %s\n", (said = reports[k].note).c_str());
    }
  }
  std::vector<std::optional<Evaluation>> by_file(files.size());
  for (size_t k = 0; k < index.size(); ++k) by_file[index[k]] = (*results)[k];
  bool all_correct = true;
  if (!batch) {
    const Evaluation& e = *by_file[0];
    all_correct = e.correct();
    if (a.json) std::printf("%s\n", EvaluationToJson(e).dump(2).c_str());
    else PrintEvaluation(e);
    return all_correct ? kExitOk : kExitFailed;
  }
  if (!a.json) PrintBatchHeader();
  for (size_t i = 0; i < files.size(); ++i) {
    std::string name = fs::path(files[i]).filename().string();
    if (!by_file[i]) {
      all_correct = false;
      if (a.json) std::printf("%s\n", nlohmann::json{{"candidate", files[i]}, {"status", "parse_error"}, {"message", load_errors[i]}}.dump().c_str());
      else PrintBatchRow(name, "parse_error", nullptr, load_errors[i]);
      continue;
    }
    const Evaluation& e = *by_file[i];
    all_correct = all_correct && e.correct();
    if (a.json) {
      auto j = EvaluationToJson(e);
      j["candidate"] = files[i];
      std::printf("%s\n", j.dump().c_str());
    } else {
      PrintBatchRow(name, StatusText(e), &e, e.specialised() ? e.robustness->Summary() : e.message);
    }
  }
  if (!a.json) std::printf("\nworker restarts: %d\n", WorkerRestarts(*ev));
  if (a.verbose) {
    std::fflush(stdout);
    const auto teardown = std::chrono::steady_clock::now();
    ev->practice.reset();
    ev->evaluator.reset();  // the worker stopped, the arena freed, the reference unmapped (a lease ended)
    std::fprintf(stderr, "  %-52s %8.3f\n", "evaluator teardown", SecondsSince(teardown));
  }
  return all_correct ? kExitOk : kExitFailed;
}

}  // namespace

void RegisterEvalCommand(CLI::App& app) {
  auto a = std::make_shared<EvalArgs>();
  CLI::App* sub = app.add_subcommand("eval", "Evaluate a candidate (or a directory of them) on the GPU: correctness and speed against PyTorch");
  sub->add_option("problem", a->problem, "Problem file (KernelBench format .py); with --problems, the folder of kernels")
      ->check(CLI::ExistingPath);
  sub->add_option("candidate", a->candidate, "A .cu (+ .json plan) or .md candidate, or a directory of them")
      ->check(CLI::ExistingPath);
  sub->add_option("--problems", a->problems_dir,
                  "Score a folder of kernels against this folder of problems: 19_ReLU.cu (+ .json) or 19_ReLU.md "
                  "for 19_ReLU.py; prints the per-problem table and fast_p figures")
      ->check(CLI::ExistingDirectory);
  sub->add_option("--evaluator", a->evaluator, "gpu (default), or fake[:FILE] for tests (with --problems)");
  AddGpusOption(sub, &a->gpus);
  sub->add_option("--plan", a->plan, "Launch-plan JSON file (single .cu candidate)")->check(CLI::ExistingFile);
  sub->add_option("--sets", a->sets, "Input sets to check against")->capture_default_str()->check(CLI::Range(1, 16));
  sub->add_option("--run-timeout", a->run_timeout_s, "Seconds one run of the plan may take before it is killed (0 = auto: 200x the PyTorch time, 2..60 s)")
      ->capture_default_str();
  sub->add_option("--timing", a->timing,
                  "adaptive: warm-up runs batched, timed runs until the median is stable, fewer for a candidate "
                  "clearly slower than the best so far (recorded as cut short); full: every warm-up run checked on "
                  "its own and the full planned count of timed runs (the method before adaptive timing)")
      ->capture_default_str()
      ->check(CLI::IsMember({"adaptive", "full"}));
  AddPrecisionOption(sub, &a->precision);
  AddPythonOption(sub, &a->python);
  AddCacheOptions(sub, &a->cache);
  sub->add_flag("--keep-privileges", a->keep_privileges, "Do not drop to nobody in the worker when running as root");
  sub->add_flag("--profile", a->profile,
                "Also read each correct candidate's hardware counters with Nsight Compute (ncu): one more "
                "verified run under the profiler; DRAM/L2 bandwidth, SM and tensor-pipe use, occupancy, warp stalls, "
                "hit rates, bank conflicts per launch");
  sub->add_option("--keep-reference", a->keep_reference,
                  "Keep a GPU-resident reference (problems of 1 GiB or more) on the GPU this long after the "
                  "command, e.g. 10m, so that the next eval of the same problem leases it instead of computing "
                  "it again (default: $KS_KEEP_REFERENCE, else not kept; `kernelsearch cache kept` lists, "
                  "`kernelsearch cache release` frees)")
      ->check(CLI::Validator(
          [](std::string& v) {
            auto s = ParseKeepDuration(v);
            return s.ok() ? std::string() : s.status().message();
          },
          "DURATION"));
  sub->add_flag("--json", a->json, "Print JSON (one line per candidate for a directory)");
  sub->add_flag("--verbose,-v", a->verbose,
                "Print on stderr where the time went: the reference's phases (signature, model build, input "
                "generation, forward, writing, eager and torch.compile timing) and the evaluator's setup");
  sub->footer("Exit status: 0 all correct, 1 some candidate (or problem of --problems) not correct, 2 bad input, 3 no GPU / no torch.");
  SetAction(sub, [a] { return Run(*a); });
}

}  // namespace ks::cli
