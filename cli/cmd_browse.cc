// Browsing the lineage store: history, best, show, lineage, export. Tables for
// people; --json for scripts.
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "cli/cli.h"
#include "common/files.h"
#include "search/store/lineage_store.h"

namespace ks::cli {
namespace {

using store::CandidateRow;

// KS_ASSIGN_OR_RETURN for command bodies: an error becomes the exit code.
#define KS_ASSIGN_OR_RETURN_CLI(lhs, expr) KS_ASSIGN_OR_RETURN_CLI_IMPL(KS_CONCAT(ks_cli_, __LINE__), lhs, expr)
#define KS_ASSIGN_OR_RETURN_CLI_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return ReportError(tmp.status());   \
  lhs = std::move(tmp).value()

struct BrowseFlags {
  std::string db;
  bool json = false;
  std::string problem;
  int64_t id = 0;
  std::string out_dir;
};

StatusOr<std::unique_ptr<store::LineageStore>> OpenStore(const BrowseFlags& f) {
  return store::LineageStore::Open(f.db.empty() ? store::DefaultDbPath() : f.db);
}

std::string Opt(const std::optional<double>& v, const char* fmt_spec) {
  return v ? fmt::format(fmt::runtime(fmt_spec), *v) : "-";
}

nlohmann::json CandidateJson(const CandidateRow& c, bool with_code) {
  nlohmann::json j = {{"id", c.id},           {"search", c.search_id},
                      {"round", c.round},     {"kind", store::CandidateKindName(c.kind)},
                      {"branch", c.branch},   {"repair_depth", c.repair_depth},
                      {"content_hash", c.content_hash}, {"state", c.evaluated ? "evaluated" : "pending"},
                      {"created", c.created}};
  j["idea"] = c.idea_id ? nlohmann::json(*c.idea_id) : nlohmann::json();
  j["parent"] = c.parent_candidate ? nlohmann::json(*c.parent_candidate) : nlohmann::json();
  if (c.evaluation) {
    j["status"] = EvalStatusName(c.evaluation->status);
    j["median_ms"] = c.evaluation->median_ms ? nlohmann::json(*c.evaluation->median_ms) : nlohmann::json();
    j["speedup_eager"] = c.evaluation->speedup_eager ? nlohmann::json(*c.evaluation->speedup_eager) : nlohmann::json();
    j["speedup_compile"] =
        c.evaluation->speedup_compile ? nlohmann::json(*c.evaluation->speedup_compile) : nlohmann::json();
    if (c.evaluation->reused_from) j["reused_from"] = *c.evaluation->reused_from;
  }
  if (with_code) {
    j["source"] = c.source;
    j["plan"] = c.plan_json;
    if (!c.raw_response.empty()) j["raw_response"] = c.raw_response;
    if (c.evaluation) j["evaluation"] = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  }
  return j;
}

int History(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  std::vector<store::SearchSummary> all;
  if (f.problem.empty()) {
    KS_ASSIGN_OR_RETURN_CLI(all, store->History(0));
  } else {
    KS_ASSIGN_OR_RETURN_CLI(auto problems, store->FindProblems(f.problem));
    if (problems.empty()) return ReportError(NotFound("no problem named " + f.problem + " in " + store->path()));
    for (const auto& p : problems) {
      KS_ASSIGN_OR_RETURN_CLI(auto h, store->History(p.id));
      all.insert(all.end(), h.begin(), h.end());
    }
  }
  if (f.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& s : all)
      arr.push_back({{"search", s.search.id}, {"problem", s.problem_name},
                     {"status", store::SearchStatusName(s.search.status)}, {"stop_reason", s.search.stop_reason},
                     {"rounds", s.rounds}, {"candidates", s.candidates}, {"evaluated", s.evaluated},
                     {"correct", s.correct},
                     {"best_speedup", s.best_speedup_eager ? nlohmann::json(*s.best_speedup_eager) : nlohmann::json()},
                     {"best_candidate", s.search.best_candidate ? nlohmann::json(*s.search.best_candidate)
                                                                : nlohmann::json()},
                     {"llm_calls", s.spend.calls}, {"cost_usd", s.spend.cost_usd}, {"created", s.search.created}});
    std::printf("%s\n", arr.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-6s %-22s %-10s %6s %6s %7s %8s %6s %8s  %s\n", "search", "problem", "status", "rounds", "cands",
              "correct", "best", "calls", "cost", "created");
  for (const auto& s : all)
    std::printf("%-6lld %-22s %-10s %6d %6lld %7lld %8s %6lld %8s  %s\n", static_cast<long long>(s.search.id),
                s.problem_name.c_str(), store::SearchStatusName(s.search.status), s.rounds,
                static_cast<long long>(s.candidates), static_cast<long long>(s.correct),
                Opt(s.best_speedup_eager, "{:.2f}x").c_str(), static_cast<long long>(s.spend.calls),
                fmt::format("${:.2f}", s.spend.cost_usd).c_str(), s.search.created.c_str());
  return kExitOk;
}

int ShowCandidate(store::LineageStore* store, const CandidateRow& c, bool json) {
  std::string idea_text;
  if (c.idea_id) {
    auto idea = store->GetIdea(*c.idea_id);
    if (idea.ok()) idea_text = idea->text;
  }
  if (json) {
    auto j = CandidateJson(c, true);
    j["idea_text"] = idea_text;
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("candidate %lld  (search %lld, round %d, %s)\n", static_cast<long long>(c.id),
              static_cast<long long>(c.search_id), c.round, store::CandidateKindName(c.kind));
  std::printf("idea:    %s\n", idea_text.empty() ? "-" : idea_text.c_str());
  std::printf("parent:  %s\n", c.parent_candidate ? std::to_string(*c.parent_candidate).c_str() : "-");
  if (c.evaluation) {
    std::printf("status:  %s%s\n", EvalStatusName(c.evaluation->status),
                c.evaluation->reused_from ? fmt::format(" (same kernel as {})", *c.evaluation->reused_from).c_str()
                                          : "");
    std::printf("time:    %s ms   speedup: %s eager, %s torch.compile\n",
                Opt(c.evaluation->median_ms, "{:.4f}").c_str(), Opt(c.evaluation->speedup_eager, "{:.2f}x").c_str(),
                Opt(c.evaluation->speedup_compile, "{:.2f}x").c_str());
    auto e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
    if (e.is_object() && !e.value("message", std::string()).empty())
      std::printf("message: %s\n", e.value("message", std::string()).c_str());
  } else {
    std::printf("status:  pending\n");
  }
  if (!c.raw_response.empty()) std::printf("\n--- model reply (unparsed) ---\n%s\n", c.raw_response.c_str());
  std::printf("\n--- source ---\n%s\n\n--- plan ---\n%s\n", c.source.c_str(), c.plan_json.c_str());
  return kExitOk;
}

int Show(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  KS_ASSIGN_OR_RETURN_CLI(auto c, store->GetCandidate(f.id));
  return ShowCandidate(store.get(), c, f.json);
}

int Best(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  KS_ASSIGN_OR_RETURN_CLI(auto problems, store->FindProblems(f.problem));
  if (problems.empty()) return ReportError(NotFound("no problem named " + f.problem + " in " + store->path()));
  std::optional<CandidateRow> best;
  for (const auto& p : problems) {
    KS_ASSIGN_OR_RETURN_CLI(auto b, store->BestCorrectForProblem(p.id));
    if (b && (!best || b->evaluation->median_ms.value_or(1e300) < best->evaluation->median_ms.value_or(1e300)))
      best = b;
  }
  if (!best) {
    std::fprintf(stderr, "kernelsearch: no correct kernel for %s yet\n", f.problem.c_str());
    return kExitFailed;
  }
  return ShowCandidate(store.get(), *best, f.json);
}

int Lineage(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  KS_ASSIGN_OR_RETURN_CLI(auto path, store->Lineage(f.id));
  if (f.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& c : path) {
      auto j = CandidateJson(c, false);
      if (c.idea_id) j["idea_text"] = store->GetIdea(*c.idea_id).ok() ? store->GetIdea(*c.idea_id)->text : "";
      arr.push_back(j);
    }
    std::printf("%s\n", arr.dump(2).c_str());
    return kExitOk;
  }
  std::printf("%-4s %-9s %-5s %-7s %-14s %10s %8s  %s\n", "step", "candidate", "round", "kind", "status", "ms",
              "speedup", "idea");
  int step = 0;
  for (const auto& c : path) {
    std::string idea = c.idea_id && store->GetIdea(*c.idea_id).ok() ? store->GetIdea(*c.idea_id)->text : "-";
    if (idea.size() > 80) idea = idea.substr(0, 77) + "...";
    std::printf("%-4d %-9lld %-5d %-7s %-14s %10s %8s  %s\n", step++, static_cast<long long>(c.id), c.round,
                store::CandidateKindName(c.kind), c.evaluation ? EvalStatusName(c.evaluation->status) : "pending",
                c.evaluation ? Opt(c.evaluation->median_ms, "{:.4f}").c_str() : "-",
                c.evaluation ? Opt(c.evaluation->speedup_eager, "{:.2f}x").c_str() : "-", idea.c_str());
  }
  return kExitOk;
}

// The exported module: the kernel as a drop-in replacement for the problem's
// Model. Runtime compilation goes through NVRTC and the CUDA driver loaded with
// ctypes (no build step, no extra package; torch.utils.cpp_extension would need
// a host compiler and minutes of build, jiterator only takes elementwise code).
// Launch arguments are sized from the compiled kernel itself
// (cuFuncGetParamInfo), as the evaluator does.
constexpr const char* kModuleTemplate = R"PY("""kernelsearch export: candidate {id} of problem {problem} ({speedup} over eager when measured).

    from kernel_module import ModelNew
    model = ModelNew(*problem.get_init_inputs()).cuda()
    out = model(*inputs)

ModelNew builds the problem's Model for its parameters (same constructor
arguments, same state_dict), then runs the exported launch plan on the current
torch CUDA stream. The CUDA source is compiled at first use with NVRTC and
loaded with the CUDA driver, both through ctypes.
"""
import ast
import ctypes
import ctypes.util
import glob
import importlib.util
import json
import os

import torch

SOURCE = {source}
PLAN = json.loads({plan})
SIGNATURE = json.loads({signature})
_HERE = os.path.dirname(os.path.abspath(__file__))


def _load_problem():
    spec = importlib.util.spec_from_file_location("ks_problem", os.path.join(_HERE, "problem.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _find_lib(names, patterns):
    for n in names:
        try:
            return ctypes.CDLL(n)
        except OSError:
            pass
    roots = [os.path.dirname(torch.__file__)] + [os.path.join(os.path.dirname(torch.__file__), "..", "nvidia")]
    for root in roots:
        for pat in patterns:
            for path in sorted(glob.glob(os.path.join(root, "**", pat), recursive=True)):
                try:
                    return ctypes.CDLL(path)
                except OSError:
                    pass
    raise RuntimeError("cannot load any of %s" % (names,))


_nvrtc = None
_cuda = None


def _libs():
    global _nvrtc, _cuda
    if _cuda is None:
        _cuda = _find_lib(["libcuda.so.1", "libcuda.so"], [])
        found = ctypes.util.find_library("nvrtc")
        _nvrtc = _find_lib(([found] if found else []) + ["libnvrtc.so", "libnvrtc.so.12", "libnvrtc.so.13"],
                           ["libnvrtc.so*"])
    return _nvrtc, _cuda


def _check_cu(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        _cuda.cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError("%s failed: %s" % (what, name.value.decode() if name.value else rc))


def _compile(device):
    nvrtc, cuda = _libs()
    torch.cuda.init()
    major, minor = torch.cuda.get_device_capability(device)
    prog = ctypes.c_void_p()
    src = SOURCE.encode()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"kernel.cu", 0, None, None) != 0:
        raise RuntimeError("nvrtcCreateProgram failed")
    include = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")
    opts = [("--gpu-architecture=sm_%d%d" % (major, minor)).encode(), b"-std=c++17", ("-I" + include).encode()]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    if rc != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise RuntimeError("NVRTC failed:\n" + log.value.decode(errors="replace"))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetCUBIN(prog, cubin)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    module = ctypes.c_void_p()
    _check_cu(cuda.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
    funcs = {{}}
    for launch in PLAN["launches"]:
        name = launch["kernel"]
        if name not in funcs:
            fn = ctypes.c_void_p()
            _check_cu(cuda.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()), "cuModuleGetFunction " + name)
            sizes = []
            while True:
                off, sz = ctypes.c_size_t(), ctypes.c_size_t()
                if cuda.cuFuncGetParamInfo(fn, len(sizes), ctypes.byref(off), ctypes.byref(sz)) != 0:
                    break
                sizes.append(sz.value)
            funcs[name] = (fn, sizes)
    return module, funcs


def _eval(expr, env):
    """Plan expressions: integers, + - * / %, parentheses, cdiv, min, max, t.shape[i], t.numel, scalars."""
    if isinstance(expr, (int, float)):
        return expr

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {{ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.Div: lambda: a // b, ast.FloorDiv: lambda: a // b, ast.Mod: lambda: a % b}}
            return ops[type(node.op)]()
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = [ev(a) for a in node.args]
            if node.func.id == "cdiv":
                return -(-args[0] // args[1])
            if node.func.id in ("min", "max"):
                return (min if node.func.id == "min" else max)(args)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
            return env[_name(node.value.value)].shape[ev(node.slice)]
        if isinstance(node, ast.Attribute) and node.attr == "numel":
            return env[_name(node.value)].numel()
        if isinstance(node, (ast.Name, ast.Attribute)):
            return env[_name(node)]
        raise ValueError("unsupported plan expression: %r" % expr)

    return ev(ast.parse(str(expr), mode="eval"))


def _name(node):
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return _name(node.value) + "." + node.attr
    raise ValueError("not a name")


_DTYPES = {{"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "int8": torch.int8,
           "uint8": torch.uint8, "bool": torch.bool}}


class ModelNew(torch.nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()
        self.ref = _load_problem().Model(*init_inputs)
        self._compiled = None

    def forward(self, *inputs):
        device = torch.cuda.current_device()
        if self._compiled is None:
            self._compiled = _compile(device)
        _, funcs = self._compiled
        env = {{}}
        for spec, value in zip(SIGNATURE["inputs"], inputs):
            env[spec["name"]] = value.contiguous() if isinstance(value, torch.Tensor) else value
        for name, tensor in self.ref.state_dict().items():
            env[name] = tensor.contiguous()
        outs = []
        for spec in SIGNATURE["outputs"]:
            t = torch.empty(spec["shape"], dtype=_DTYPES[spec["dtype"]], device=device)
            env[spec["name"]] = t
            outs.append(t)
        keep = []
        for s in PLAN.get("scratch", []):
            env[s["name"]] = torch.empty(int(_eval(s["bytes"], env)), dtype=torch.uint8, device=device)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for launch in PLAN["launches"]:
            fn, sizes = funcs[launch["kernel"]]
            grid = [int(_eval(g, env)) for g in launch["grid"]] + [1, 1]
            block = [int(_eval(b, env)) for b in launch["block"]] + [1, 1]
            shared = int(_eval(launch.get("shared_bytes", "0"), env))
            if shared > 48 * 1024:
                _check_cu(_cuda.cuFuncSetAttribute(fn, 8, shared), "raising dynamic shared memory")  # MAX_DYNAMIC_SHARED_SIZE_BYTES
            params = []
            for i, arg in enumerate(launch["args"]):
                size = sizes[i] if i < len(sizes) else 8
                value = env.get(arg) if isinstance(arg, str) else None
                if isinstance(value, torch.Tensor):
                    params.append(ctypes.c_uint64(value.data_ptr()))
                    continue
                is_float = isinstance(arg, float) or (isinstance(arg, str) and any(c in arg for c in ".e") and
                                                      not any(c.isalpha() and c != "e" for c in arg))
                v = float(arg) if is_float else _eval(arg, env)
                if isinstance(v, float) or is_float:
                    params.append(ctypes.c_float(v) if size == 4 else ctypes.c_double(v))
                else:
                    params.append(ctypes.c_int32(int(v)) if size == 4 else ctypes.c_int64(int(v)))
            keep.append(params)
            ptrs = (ctypes.c_void_p * len(params))(*[ctypes.cast(ctypes.pointer(p), ctypes.c_void_p) for p in params])
            _check_cu(_cuda.cuLaunchKernel(fn, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared,
                                           stream, ptrs, None), "cuLaunchKernel " + launch["kernel"])
        return outs[0] if len(outs) == 1 else tuple(outs)
)PY";

std::string PyString(const std::string& s) { return nlohmann::json(s).dump(); }  // JSON strings are Python literals

int Export(const BrowseFlags& f) {
  KS_ASSIGN_OR_RETURN_CLI(auto store, OpenStore(f));
  KS_ASSIGN_OR_RETURN_CLI(auto c, store->GetCandidate(f.id));
  if (c.source.empty()) return ReportError(InvalidArgument(fmt::format("candidate {} has no kernel source", c.id)));
  KS_ASSIGN_OR_RETURN_CLI(auto search, store->GetSearch(c.search_id));
  KS_ASSIGN_OR_RETURN_CLI(auto problem, store->GetProblem(search.problem_id));
  if (problem.signature_json == "{}")
    return ReportError(FailedPrecondition("the store has no signature for problem " + problem.name));
  std::error_code ec;
  std::filesystem::create_directories(f.out_dir, ec);
  if (ec) return ReportError(FailedPrecondition("creating " + f.out_dir + ": " + ec.message()));
  std::string speedup = c.evaluation && c.evaluation->speedup_eager
                            ? fmt::format("{:.2f}x", *c.evaluation->speedup_eager)
                            : "not measured";
  std::string module = fmt::format(fmt::runtime(kModuleTemplate), fmt::arg("id", c.id),
                                   fmt::arg("problem", problem.name), fmt::arg("speedup", speedup),
                                   fmt::arg("source", PyString(c.source)), fmt::arg("plan", PyString(c.plan_json)),
                                   fmt::arg("signature", PyString(problem.signature_json)));
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"kernel.cu", c.source}, {"plan.json", c.plan_json}, {"problem.py", problem.source},
           {"kernel_module.py", module}}) {
    Status st = WriteFile(f.out_dir + "/" + name, text);
    if (!st.ok()) return ReportError(st);
  }
  if (f.json)
    std::printf("%s\n", nlohmann::json({{"candidate", c.id}, {"out", f.out_dir}}).dump().c_str());
  else
    std::printf("wrote %s/{kernel.cu, plan.json, problem.py, kernel_module.py}\n", f.out_dir.c_str());
  return kExitOk;
}

}  // namespace

void RegisterBrowseCommands(CLI::App& app) {
  auto add = [&](const char* name, const char* help, auto action, auto extra) {
    auto* f = new BrowseFlags();  // lives as long as the process: CLI11 binds to it
    auto* sub = app.add_subcommand(name, help);
    sub->add_option("--db", f->db, "lineage store (default $KS_DB or ~/.local/share/kernelsearch/lineage.db)");
    sub->add_flag("--json", f->json, "JSON for scripts");
    extra(sub, f);
    SetAction(sub, [f, action] { return action(*f); });
  };
  add("history", "searches in the store, newest first", History,
      [](CLI::App* s, BrowseFlags* f) { s->add_option("problem", f->problem, "only this problem (name or path)"); });
  add("best", "the fastest correct kernel of a problem", Best, [](CLI::App* s, BrowseFlags* f) {
    s->add_option("problem", f->problem, "problem name or path")->required();
  });
  add("show", "a candidate: code, plan, evaluation, idea, parent", Show,
      [](CLI::App* s, BrowseFlags* f) { s->add_option("id", f->id, "candidate id")->required(); });
  add("lineage", "the path from the first kernel to this one", Lineage,
      [](CLI::App* s, BrowseFlags* f) { s->add_option("id", f->id, "candidate id")->required(); });
  add("export", "write a candidate as .cu, plan and a PyTorch drop-in module", Export,
      [](CLI::App* s, BrowseFlags* f) {
        s->add_option("id", f->id, "candidate id")->required();
        s->add_option("--out", f->out_dir, "output directory")->required();
      });
}

}  // namespace ks::cli
