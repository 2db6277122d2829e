#include "evaluator/plan/launch_plan.h"

#include "common/json_depth.h"

#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace ks {

const char* ParamKindName(ParamKind k) {
  switch (k) {
    case ParamKind::kB64: return "64-bit (pointer or long long)";
    case ParamKind::kB32: return "32-bit integer";
    case ParamKind::kF32: return "float";
    case ParamKind::kF64: return "double";
    case ParamKind::kB16: return "16-bit";
    case ParamKind::kB8: return "8-bit";
    case ParamKind::kBytes: return "struct by value";
  }
  return "?";
}

namespace {

using json = nlohmann::json;

// Recursive-descent parser over the expression text.
class ExprParser {
 public:
  ExprParser(const std::string& s, const Signature& sig) : s_(s), sig_(sig) {}

  StatusOr<int64_t> Parse() {
    KS_ASSIGN_OR_RETURN(int64_t v, ParseSum());
    SkipWs();
    if (pos_ != s_.size()) return Error("unexpected '" + s_.substr(pos_, 1) + "'");
    return v;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("expression '" + s_ + "': " + what + " at position " + std::to_string(pos_));
  }
  void SkipWs() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool Eat(char c) {
    SkipWs();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  // Each operator, checked: an edge of int64 is an error, never a trap or UB.
  StatusOr<int64_t> Apply(char op, int64_t a, int64_t b) const {
    int64_t v = 0;
    switch (op) {
      case '+': if (__builtin_add_overflow(a, b, &v)) return Error("integer overflow"); return v;
      case '-': if (__builtin_sub_overflow(a, b, &v)) return Error("integer overflow"); return v;
      case '*': if (__builtin_mul_overflow(a, b, &v)) return Error("integer overflow"); return v;
      default: break;
    }
    if (b == 0) return Error("division by zero");
    // INT64_MIN / -1 does not fit; x86 traps (SIGFPE) on it, and on INT64_MIN % -1.
    if (a == std::numeric_limits<int64_t>::min() && b == -1) return Error("integer overflow");
    return op == '/' ? a / b : a % b;
  }

  // Nesting (parentheses, calls, shape indices, unary signs) is bounded, so the
  // recursion here is too.
  Status Enter() {
    if (++depth_ > kMaxExprDepth)
      return Error("nested deeper than " + std::to_string(kMaxExprDepth) + " levels");
    return Status::Ok();
  }

  StatusOr<int64_t> ParseSum() {
    KS_RETURN_IF_ERROR(Enter());
    KS_ASSIGN_OR_RETURN(int64_t v, ParseProduct());
    for (;;) {
      char op = 0;
      if (Eat('+')) op = '+';
      else if (Eat('-')) op = '-';
      else break;
      KS_ASSIGN_OR_RETURN(int64_t r, ParseProduct());
      KS_ASSIGN_OR_RETURN(v, Apply(op, v, r));
    }
    --depth_;
    return v;
  }

  StatusOr<int64_t> ParseProduct() {
    KS_ASSIGN_OR_RETURN(int64_t v, ParseUnary());
    for (;;) {
      char op = 0;
      if (Eat('*')) op = '*';
      else if (Eat('/')) op = '/';
      else if (Eat('%')) op = '%';
      else return v;
      KS_ASSIGN_OR_RETURN(int64_t r, ParseUnary());
      KS_ASSIGN_OR_RETURN(v, Apply(op, v, r));
    }
  }

  StatusOr<int64_t> ParseUnary() {
    char sign = Eat('-') ? '-' : Eat('+') ? '+' : 0;
    if (!sign) return ParsePrimary();
    KS_RETURN_IF_ERROR(Enter());
    KS_ASSIGN_OR_RETURN(int64_t v, ParseUnary());
    --depth_;
    return sign == '-' ? Apply('-', 0, v) : StatusOr<int64_t>(v);
  }

  StatusOr<int64_t> ParsePrimary() {
    SkipWs();
    if (pos_ >= s_.size()) return Error("unexpected end");
    char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      KS_ASSIGN_OR_RETURN(int64_t v, ParseSum());
      if (!Eat(')')) return Error("expected ')'");
      return v;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t v = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, s_[pos_++] - '0', &v))
          return Error("integer literal too large");
      }
      if (pos_ < s_.size() && (s_[pos_] == '.' || s_[pos_] == 'e' || s_[pos_] == 'E'))
        return Error("a float literal is not allowed in an integer expression");
      return v;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') return ParseName();
    return Error("unexpected '" + std::string(1, c) + "'");
  }

  StatusOr<int64_t> ParseName() {
    size_t start = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_' || s_[pos_] == '.'))
      ++pos_;
    std::string name = s_.substr(start, pos_ - start);
    if (name == "cdiv" || name == "min" || name == "max") {
      if (!Eat('(')) return Error("expected '(' after " + name);
      std::vector<int64_t> args;
      do {
        KS_ASSIGN_OR_RETURN(int64_t a, ParseSum());
        args.push_back(a);
      } while (Eat(','));
      if (!Eat(')')) return Error("expected ')' to close " + name + "(");
      if (name == "cdiv") {
        if (args.size() != 2) return Error("cdiv takes two arguments");
        if (args[1] <= 0) return Error("cdiv by a non-positive number");
        if (args[0] < 0) return Error("cdiv of a negative number");
        return args[0] / args[1] + (args[0] % args[1] != 0);  // no overflow: a >= 0, b >= 1
      }
      int64_t v = args[0];
      for (int64_t a : args) v = name == "min" ? std::min(v, a) : std::max(v, a);
      return v;
    }
    // <tensor>.numel, <tensor>.shape[i]; tensor names may contain dots (conv.weight).
    auto ends_with = [&](const std::string& suffix) {
      return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends_with(".numel")) {
      std::string t = name.substr(0, name.size() - 6);
      const TensorSpec* spec = sig_.Find(t);
      if (!spec) return Error("unknown tensor '" + t + "'");
      int64_t n = 1;
      for (int64_t d : spec->shape)
        if (__builtin_mul_overflow(n, d, &n)) return Error("integer overflow in " + t + ".numel");
      return n;
    }
    if (ends_with(".shape")) {
      std::string t = name.substr(0, name.size() - 6);
      const TensorSpec* spec = sig_.Find(t);
      if (!spec) return Error("unknown tensor '" + t + "'");
      if (!Eat('[')) return Error("expected '[' after .shape");
      KS_ASSIGN_OR_RETURN(int64_t idx, ParseSum());
      if (!Eat(']')) return Error("expected ']'");
      int64_t rank = static_cast<int64_t>(spec->shape.size());
      if (idx < 0) idx += rank;
      if (idx < 0 || idx >= rank)
        return Error("'" + t + "' has " + std::to_string(rank) + " dimensions; shape index out of range");
      return spec->shape[idx];
    }
    const TensorSpec* spec = sig_.Find(name);
    if (spec && spec->is_scalar) {
      if (IsFloating(spec->dtype)) return Error("scalar '" + name + "' is a float, not an integer");
      return static_cast<int64_t>(spec->scalar_value);
    }
    if (spec) return Error("'" + name + "' is a tensor; use " + name + ".numel or " + name + ".shape[i]");
    return Error("unknown name '" + name + "'");
  }

  const std::string& s_;
  const Signature& sig_;
  size_t pos_ = 0;
  int depth_ = 0;
};

// A JSON integer as int64: nlohmann keeps 2^63..2^64-1 as unsigned, which
// get<int64_t>() would wrap into negative numbers.
StatusOr<int64_t> JsonInt(const json& v) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return InvalidArgument("integer " + v.dump() + " is too large (int64)");
  return v.get<int64_t>();
}

// An expression field may be a JSON string or a JSON integer.
StatusOr<int64_t> EvalField(const json& v, const Signature& sig) {
  if (v.is_number_integer()) return JsonInt(v);
  if (v.is_string()) return EvalIntExpr(v.get<std::string>(), sig);
  return InvalidArgument("expected an integer or an expression string, got " + v.dump());
}

StatusOr<std::array<int64_t, 3>> EvalDims(const json& v, const Signature& sig, const std::string& what) {
  std::array<int64_t, 3> out{1, 1, 1};
  if (v.is_number_integer() || v.is_string()) {
    KS_ASSIGN_OR_RETURN(out[0], EvalField(v, sig));
    return out;
  }
  if (!v.is_array() || v.empty() || v.size() > 3) return InvalidArgument(what + " must be a list of 1 to 3 entries");
  for (size_t i = 0; i < v.size(); ++i) {
    auto r = EvalField(v[i], sig);
    if (!r.ok()) return r.status().WithContext(what + "[" + std::to_string(i) + "]");
    out[i] = *r;
  }
  return out;
}

bool LooksLikeFloat(const std::string& s) {
  if (s.empty()) return false;
  bool has_mark = s.find_first_of(".eE") != std::string::npos;
  if (!has_mark) return false;
  if (s.find_first_not_of("0123456789.eE+-") != std::string::npos) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end && *end == '\0';
}

StatusOr<ArgValue> ResolveArg(const json& a, const ParamInfo& p, const Signature& sig,
                              const std::set<std::string>& scratch, const std::set<std::string>& maps) {
  auto want_int = [&](int64_t v) -> StatusOr<ArgValue> {
    ArgValue out;
    switch (p.kind) {
      case ParamKind::kB64: out.kind = ArgValue::Kind::kInt64; out.i = v; return out;
      case ParamKind::kB32:
        if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<uint32_t>::max())
          return InvalidArgument("value " + std::to_string(v) + " does not fit the kernel's 32-bit parameter");
        out.kind = ArgValue::Kind::kInt32; out.i = v; return out;
      case ParamKind::kF32: out.kind = ArgValue::Kind::kFloat32; out.f = static_cast<double>(v); return out;
      case ParamKind::kF64: out.kind = ArgValue::Kind::kFloat64; out.f = static_cast<double>(v); return out;
      default:
        return InvalidArgument(std::string("the kernel's parameter is ") + ParamKindName(p.kind) +
                               ", which a plan argument cannot fill");
    }
  };
  auto want_float = [&](double v) -> StatusOr<ArgValue> {
    ArgValue out;
    out.f = v;
    if (p.kind == ParamKind::kF32) { out.kind = ArgValue::Kind::kFloat32; return out; }
    if (p.kind == ParamKind::kF64) { out.kind = ArgValue::Kind::kFloat64; return out; }
    return InvalidArgument(std::string("a float value for a ") + ParamKindName(p.kind) + " parameter");
  };
  if (a.is_number_float()) return want_float(a.get<double>());
  if (a.is_number_integer()) {
    KS_ASSIGN_OR_RETURN(int64_t v, JsonInt(a));
    return want_int(v);
  }
  if (!a.is_string()) return InvalidArgument("argument must be a string or a number, got " + a.dump());
  std::string s = a.get<std::string>();
  if (maps.count(s)) {
    // The driver copies exactly the parameter's bytes: anything but a
    // 128-byte CUtensorMap would hand the kernel a torn descriptor.
    if (p.kind != ParamKind::kBytes || p.size != kTensorMapBytes)
      return InvalidArgument("tensor map '" + s + "' goes to a `const __grid_constant__ CUtensorMap` parameter " +
                             "(128 bytes, aligned to 64), but the kernel's parameter is " + ParamKindName(p.kind) +
                             (p.kind == ParamKind::kBytes ? " of " + std::to_string(p.size) + " bytes" : ""));
    return ArgValue{ArgValue::Kind::kTensorMap, s, 0, 0};
  }
  if (scratch.count(s)) {
    if (p.kind != ParamKind::kB64)
      return InvalidArgument("scratch '" + s + "' is a pointer but the kernel's parameter is " + ParamKindName(p.kind));
    return ArgValue{ArgValue::Kind::kScratch, s, 0, 0};
  }
  if (const TensorSpec* t = sig.Find(s)) {
    if (t->is_scalar) {
      if (IsFloating(t->dtype)) return want_float(t->scalar_value);
      return want_int(static_cast<int64_t>(t->scalar_value));
    }
    if (p.kind != ParamKind::kB64)
      return InvalidArgument("tensor '" + s + "' is a pointer but the kernel's parameter is " + ParamKindName(p.kind));
    return ArgValue{ArgValue::Kind::kTensor, s, 0, 0};
  }
  if (LooksLikeFloat(s)) return want_float(std::strtod(s.c_str(), nullptr));
  KS_ASSIGN_OR_RETURN(int64_t v, EvalIntExpr(s, sig));
  return want_int(v);
}

template <size_t N>
bool Accepted(const std::array<std::string_view, N>& keys, const std::string& key) {
  for (std::string_view k : keys)
    if (k == key) return true;
  return false;
}

template <size_t N>
std::string KeyList(const std::array<std::string_view, N>& keys) {
  std::string out;
  for (std::string_view k : keys) out += (out.empty() ? "\"" : ", \"") + std::string(k) + "\"";
  return out;
}

std::string KnownNames(const Signature& sig, const std::set<std::string>& scratch) {
  std::string out;
  for (const auto* list : {&sig.inputs, &sig.parameters, &sig.outputs})
    for (const auto& t : *list) out += (out.empty() ? "" : ", ") + t.name;
  if (!scratch.empty()) {
    out += "; scratch: ";
    bool first = true;
    for (const auto& s : scratch) out += (first ? "" : ", ") + s, first = false;
  }
  return out;
}

}  // namespace

StatusOr<int64_t> EvalIntExpr(const std::string& expr, const Signature& sig) {
  if (expr.size() > kMaxExprChars)
    return InvalidArgument("expression longer than " + std::to_string(kMaxExprChars) + " characters");
  return ExprParser(expr, sig).Parse();
}

Status CheckPlanText(std::string_view text) {
  if (text.size() > kMaxPlanBytes)
    return InvalidArgument("launch plan is " + std::to_string(text.size()) + " bytes; the limit is " +
                           std::to_string(kMaxPlanBytes));
  return CheckJsonNesting(text, kMaxPlanDepth, "launch plan");
}

Status CheckPlanValue(const json& plan) {
  std::vector<std::pair<const json*, int>> todo = {{&plan, 1}};
  size_t nodes = 0;
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (++nodes > kMaxPlanBytes)
      return InvalidArgument("launch plan has more than " + std::to_string(kMaxPlanBytes) + " values");
    if (!v->is_structured()) continue;
    if (depth > kMaxPlanDepth)
      return InvalidArgument("launch plan nests [ ] and { } deeper than " + std::to_string(kMaxPlanDepth) +
                             " levels");
    for (const auto& child : *v) todo.push_back({&child, depth + 1});
  }
  return Status::Ok();
}

namespace {

// A list in the plan (top level or in an object of it) longer than its limit.
Status CheckCount(const json& parent, const char* key, size_t limit, const std::string& where) {
  if (!parent.is_object()) return Status::Ok();
  auto it = parent.find(key);
  if (it == parent.end() || !it->is_array() || it->size() <= limit) return Status::Ok();
  return InvalidArgument(where + "\"" + key + "\" has " + std::to_string(it->size()) + " entries; the limit is " +
                         std::to_string(limit));
}

}  // namespace

StatusOr<json> ParsePlanJson(const std::string& plan_json) {
  KS_RETURN_IF_ERROR(CheckPlanText(plan_json));
  json plan = json::parse(plan_json, nullptr, false);
  if (plan.is_discarded()) {
    try {
      (void)json::parse(plan_json);
    } catch (const json::exception& e) {
      return InvalidArgument(std::string("launch plan is not valid JSON: ") + e.what());
    }
    return InvalidArgument("launch plan is not valid JSON");
  }
  KS_RETURN_IF_ERROR(CheckCount(plan, "launches", kMaxLaunches, "launch plan: "));
  KS_RETURN_IF_ERROR(CheckCount(plan, "scratch", kMaxScratchBuffers, "launch plan: "));
  KS_RETURN_IF_ERROR(CheckCount(plan, "tensor_maps", kMaxTensorMaps, "launch plan: "));
  if (plan.is_object() && plan.contains("launches") && plan["launches"].is_array()) {
    const json& ls = plan["launches"];
    for (size_t i = 0; i < ls.size(); ++i)
      KS_RETURN_IF_ERROR(CheckCount(ls[i], "args", kMaxArgsPerLaunch, "launches[" + std::to_string(i) + "]: "));
  }
  return plan;
}

std::vector<ResolvedLaunch> ResolvedPlan::Summary() const {
  std::vector<ResolvedLaunch> out;
  for (const auto& l : launches) {
    ResolvedLaunch r;
    r.kernel = l.kernel;
    for (int i = 0; i < 3; ++i) r.grid[i] = l.grid[i], r.block[i] = l.block[i];
    r.shared_bytes = l.shared_bytes;
    out.push_back(r);
  }
  return out;
}

namespace {

// The plan's "scratch" list into out->scratch, their names into *names.
Status ResolveScratch(const json& plan, const Signature& sig, const PlanLimits& limits, ResolvedPlan* out,
                      std::set<std::string>* names) {
  if (!plan.contains("scratch")) return Status::Ok();
  const json& sc = plan["scratch"];
  if (!sc.is_array()) return InvalidArgument("scratch must be a list");
  for (size_t i = 0; i < sc.size(); ++i) {
    std::string where = "scratch[" + std::to_string(i) + "]";
    if (!sc[i].is_object() || !sc[i].contains("name") || !sc[i]["name"].is_string() || !sc[i].contains("bytes"))
      return InvalidArgument(where + ": needs \"name\" (string) and \"bytes\"");
    std::string name = sc[i]["name"];
    where += " (" + name + ")";
    for (const auto& [key, _] : sc[i].items())
      if (!Accepted(kScratchKeys, key))
        return InvalidArgument(where + ": unknown key \"" + key + "\" (a scratch entry has " + KeyList(kScratchKeys) + ")");
    if (sig.Find(name)) return InvalidArgument(where + ": name collides with a tensor of the signature");
    if (!names->insert(name).second) return InvalidArgument(where + ": duplicate scratch name");
    auto bytes = EvalField(sc[i]["bytes"], sig);
    if (!bytes.ok()) return bytes.status().WithContext(where + ": bytes");
    if (*bytes <= 0) return InvalidArgument(where + ": bytes must be positive, got " + std::to_string(*bytes));
    if (*bytes > limits.max_scratch_bytes)
      return InvalidArgument(where + ": " + std::to_string(*bytes) + " bytes exceeds the scratch limit of " +
                             std::to_string(limits.max_scratch_bytes));
    out->scratch.push_back({name, *bytes});
  }
  return Status::Ok();
}

// The plan's "tensor_maps" list into out->tensor_maps (tensor_map.h), their names into *names.
Status ResolveTensorMaps(const json& plan, const Signature& sig, const std::set<std::string>& scratch_names,
                         ResolvedPlan* out, std::set<std::string>* names) {
  if (!plan.contains("tensor_maps")) return Status::Ok();
  const json& tm = plan["tensor_maps"];
  if (!tm.is_array()) return InvalidArgument("tensor_maps must be a list");
  std::map<std::string, int64_t> scratch_bytes;
  for (const auto& s : out->scratch) scratch_bytes[s.name] = s.bytes;
  for (size_t i = 0; i < tm.size(); ++i) {
    std::string where = "tensor_maps[" + std::to_string(i) + "]";
    if (tm[i].is_object() && tm[i].contains("name") && tm[i]["name"].is_string())
      where += " (" + tm[i]["name"].get<std::string>() + ")";
    auto m = ResolveTensorMap(tm[i], sig, scratch_bytes);
    if (!m.ok()) return m.status().WithContext(where);
    if (sig.Find(m->name) || scratch_names.count(m->name))
      return InvalidArgument(where + ": name collides with a tensor or scratch buffer");
    if (!names->insert(m->name).second) return InvalidArgument(where + ": duplicate tensor map name");
    out->tensor_maps.push_back(std::move(*m));
  }
  return Status::Ok();
}

// A launch's shape: grid and block within CUDA's limits, its shared memory
// within the device's, its cluster dividing the grid.
Status ResolveShape(const json& l, const std::string& where, const Signature& sig, const KernelInfo& k,
                    const PlanLimits& limits, PlannedLaunch* pl) {
  if (!l.contains("grid")) return InvalidArgument(where + ": needs \"grid\"");
  if (!l.contains("block")) return InvalidArgument(where + ": needs \"block\"");
  {
    auto g = EvalDims(l["grid"], sig, "grid");
    if (!g.ok()) return g.status().WithContext(where);
    pl->grid = *g;
    auto b = EvalDims(l["block"], sig, "block");
    if (!b.ok()) return b.status().WithContext(where);
    pl->block = *b;
  }
  const int64_t kGridMax[3] = {2147483647LL, 65535, 65535};
  const int64_t kBlockMax[3] = {1024, 1024, 64};
  for (int d = 0; d < 3; ++d) {
    const char* axis = "xyz" + d;
    std::string ax(1, *axis);
    if (pl->grid[d] < 1 || pl->grid[d] > kGridMax[d])
      return InvalidArgument(where + ": grid." + ax + " = " + std::to_string(pl->grid[d]) + " is outside 1.." +
                             std::to_string(kGridMax[d]));
    if (pl->block[d] < 1 || pl->block[d] > kBlockMax[d])
      return InvalidArgument(where + ": block." + ax + " = " + std::to_string(pl->block[d]) + " is outside 1.." +
                             std::to_string(kBlockMax[d]));
  }
  int64_t threads = pl->block[0] * pl->block[1] * pl->block[2];
  if (threads > 1024)
    return InvalidArgument(where + ": block has " + std::to_string(threads) + " threads; at most 1024");
  if (l.contains("shared_bytes")) {
    auto sb = EvalField(l["shared_bytes"], sig);
    if (!sb.ok()) return sb.status().WithContext(where + ": shared_bytes");
    pl->shared_bytes = *sb;
  }
  if (pl->shared_bytes < 0) return InvalidArgument(where + ": shared_bytes is negative");
  int64_t total_shared = 0;
  if (__builtin_add_overflow(pl->shared_bytes, k.resources.static_shared_bytes, &total_shared) ||
      total_shared > limits.max_shared_bytes_per_block)
    return InvalidArgument(where + ": " + std::to_string(pl->shared_bytes) + " dynamic + " +
                           std::to_string(k.resources.static_shared_bytes) +
                           " static bytes of shared memory exceed the device limit of " +
                           std::to_string(limits.max_shared_bytes_per_block) + " per block");
  if (l.contains("cluster")) {
    auto c = EvalDims(l["cluster"], sig, "cluster");
    if (!c.ok()) return c.status().WithContext(where);
    int64_t size = 1;
    for (int d = 0; d < 3; ++d) {
      if ((*c)[d] < 1) return InvalidArgument(where + ": cluster dimensions must be positive");
      if (pl->grid[d] % (*c)[d] != 0)
        return InvalidArgument(where + ": grid is not a multiple of the cluster shape");
      if (__builtin_mul_overflow(size, (*c)[d], &size)) size = std::numeric_limits<int64_t>::max();
    }
    if (size > limits.max_cluster_size)
      return InvalidArgument(where + ": cluster of " + std::to_string(size) + " blocks; at most " +
                             std::to_string(limits.max_cluster_size));
    pl->cluster = *c;
  }
  return Status::Ok();
}

// One entry of "launches": its kernel among those NVRTC found, its shape and
// its arguments against the kernel's parameters.
StatusOr<PlannedLaunch> ResolveLaunch(const json& l, size_t li, const Signature& sig,
                                      const std::vector<KernelInfo>& kernels, const PlanLimits& limits,
                                      const std::set<std::string>& scratch_names,
                                      const std::set<std::string>& map_names) {
  std::string where = "launches[" + std::to_string(li) + "]";
  if (!l.is_object()) return InvalidArgument(where + ": must be an object");
  for (const auto& [key, _] : l.items())
    if (!Accepted(kLaunchKeys, key))
      return InvalidArgument(where + ": unknown key \"" + key + "\" (a launch has " + KeyList(kLaunchKeys) + ")");
  if (!l.contains("kernel") || !l["kernel"].is_string()) return InvalidArgument(where + ": needs \"kernel\" (a name)");
  PlannedLaunch pl;
  pl.kernel = l["kernel"];
  where += " (" + pl.kernel + ")";
  const KernelInfo* k = nullptr;
  for (const auto& ki : kernels)
    if (ki.name == pl.kernel) k = &ki;
  if (!k) {
    std::string names;
    for (const auto& ki : kernels) names += (names.empty() ? "" : ", ") + ki.name;
    return InvalidArgument(where + ": no extern \"C\" __global__ kernel of that name; the source has: " +
                           (names.empty() ? "none" : names));
  }
  KS_RETURN_IF_ERROR(ResolveShape(l, where, sig, *k, limits, &pl));
  static const json kNoArgs = json::array();
  const json& args = l.contains("args") ? l["args"] : kNoArgs;  // a reference: no copy of the plan
  if (!args.is_array()) return InvalidArgument(where + ": \"args\" must be a list");
  if (args.size() != k->params.size())
    return InvalidArgument(where + ": " + std::to_string(args.size()) + " args given but the kernel takes " +
                           std::to_string(k->params.size()) + " parameters");
  for (size_t ai = 0; ai < args.size(); ++ai) {
    auto a = ResolveArg(args[ai], k->params[ai], sig, scratch_names, map_names);
    if (!a.ok()) {
      std::string msg = a.status().message();
      if (msg.find("unknown name") != std::string::npos) msg += " (known: " + KnownNames(sig, scratch_names) + ")";
      return InvalidArgument(where + ": args[" + std::to_string(ai) + "] " + args[ai].dump() + ": " + msg);
    }
    pl.args.push_back(*a);
  }
  return pl;
}

}  // namespace

StatusOr<ResolvedPlan> ResolvePlan(const std::string& plan_json, const Signature& sig,
                                   const std::vector<KernelInfo>& kernels, const PlanLimits& limits) {
  KS_ASSIGN_OR_RETURN(const json plan, ParsePlanJson(plan_json));
  if (!plan.is_object()) return InvalidArgument("launch plan must be a JSON object with \"launches\"");
  for (const auto& [key, _] : plan.items()) {
    if (!Accepted(kPlanKeys, key))
      return InvalidArgument("launch plan: unknown key \"" + key +
                             "\" (expected \"launches\" and optionally \"scratch\" and \"tensor_maps\")");
  }
  ResolvedPlan out;
  std::set<std::string> scratch_names, map_names;
  KS_RETURN_IF_ERROR(ResolveScratch(plan, sig, limits, &out, &scratch_names));
  KS_RETURN_IF_ERROR(ResolveTensorMaps(plan, sig, scratch_names, &out, &map_names));
  if (!plan.contains("launches") || !plan["launches"].is_array() || plan["launches"].empty())
    return InvalidArgument("launch plan needs a non-empty \"launches\" list");
  const json& ls = plan["launches"];
  if (static_cast<int>(ls.size()) > limits.max_launches)
    return InvalidArgument("launch plan has " + std::to_string(ls.size()) + " launches; the limit is " +
                           std::to_string(limits.max_launches));
  for (size_t li = 0; li < ls.size(); ++li) {
    KS_ASSIGN_OR_RETURN(PlannedLaunch pl, ResolveLaunch(ls[li], li, sig, kernels, limits, scratch_names, map_names));
    out.launches.push_back(std::move(pl));
  }
  return out;
}

}  // namespace ks
