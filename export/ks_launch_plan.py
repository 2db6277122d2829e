"""Launch plans as kernelsearch's evaluator reads them (evaluator/plan/launch_plan.cc),
for an exported kernel: integer expressions evaluated against the shapes of one
call's tensors, and each argument turned into what the kernel's parameter takes.

Pure Python, no torch, so that tests can compare it with the evaluator. The
rules, as in the evaluator:
- expressions: integers, + - * / % (C semantics: / truncates toward zero, %
  takes the dividend's sign), parentheses, unary minus, cdiv(a, b), min(...),
  max(...), <tensor>.shape[i] (negative i counts from the end), <tensor>.numel,
  integer scalar inputs by name; every edge of int64 is an error: overflow of
  any operator (INT64_MIN / -1 and INT64_MIN % -1 included), a literal or a
  JSON integer beyond int64, more than MAX_EXPR_CHARS characters or
  MAX_EXPR_DEPTH levels of nesting;
- limits on the plan (evaluator/plan/launch_plan.h): its text at most
  MAX_PLAN_BYTES and MAX_PLAN_DEPTH levels of [ {, checked on the text before
  it is parsed (parse_plan), and at most MAX_LAUNCHES launches,
  MAX_ARGS_PER_LAUNCH args a launch, MAX_SCRATCH_BUFFERS scratch buffers and
  MAX_TENSOR_MAPS tensor maps;
- an argument names a scratch buffer or a tensor (passed as a pointer; the
  parameter must be 64-bit), a scalar input (its value), a float literal string
  ("0.00001"), a JSON number, or an integer expression;
- an integer goes into a 64-bit parameter as int64, a 32-bit one as int32 (it
  must fit), a float/double parameter as that float; a float only into a
  float/double parameter;
- a tensor map (the plan's "tensor_maps", evaluator/plan/tensor_map.cc) goes
  into a 128-byte by-value parameter (a CUtensorMap); its dims and strides
  default to the tensor's, innermost first, and every rule of
  cuTensorMapEncodeTiled is checked, plus ours: the walk stays inside the tensor.
"""

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
MAX_SCRATCH_BYTES = 16 << 30
MAX_LAUNCHES = 64
MAX_PLAN_BYTES = 64 << 10
MAX_PLAN_DEPTH = 8
MAX_ARGS_PER_LAUNCH = 128
MAX_SCRATCH_BUFFERS = 32
MAX_TENSOR_MAPS = 32
MAX_EXPR_CHARS = 4096
MAX_EXPR_DEPTH = 32
UINT64_MAX = (1 << 64) - 1
MAX_CLUSTER_SIZE = 16
_GRID_MAX = (2147483647, 65535, 65535)
_BLOCK_MAX = (1024, 1024, 64)
_DIGITS = "0123456789"
_ALPHA = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_SPACE = " \t\n\v\f\r"


class PlanError(ValueError):
    """The plan cannot run at these shapes (the evaluator's invalid_plan)."""


class Env:
    """The names a plan sees: inputs, then parameters, then outputs (the first
    of a name wins, as in the evaluator's Signature::Find)."""

    def __init__(self):
        self._entries = {}

    def add_tensor(self, name, shape, dtype="float32"):
        self._entries.setdefault(name, ("tensor", tuple(int(d) for d in shape), dtype))

    def add_scalar(self, name, value, is_float):
        self._entries.setdefault(name, ("scalar", value, bool(is_float)))

    def find(self, name):
        return self._entries.get(name)


def _numel(entry):
    n = 1
    if entry[0] == "tensor":
        for d in entry[1]:
            n *= d
    return n


def check_plan_text(text):
    """The guard before plan text is parsed: at most MAX_PLAN_BYTES bytes and
    MAX_PLAN_DEPTH levels of [ { outside strings (a flat scan, as CheckPlanText)."""
    size = len(text.encode("utf-8", "surrogatepass")) if isinstance(text, str) else len(text)
    if size > MAX_PLAN_BYTES:
        raise PlanError("launch plan is %d bytes; the limit is %d" % (size, MAX_PLAN_BYTES))
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    depth, in_string, escaped = 0, False, False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > MAX_PLAN_DEPTH:
                raise PlanError("launch plan nests [ ] and { } deeper than %d levels" % MAX_PLAN_DEPTH)
        elif c in "]}" and depth > 0:
            depth -= 1


def _json_float(s):
    # As the evaluator's JSON parser: a number beyond double ("1e999") is an error.
    v = float(s)
    if v in (float("inf"), float("-inf")):
        raise PlanError("launch plan is not valid JSON: number overflow parsing '%s'" % s[:40])
    return v


def _json_int(s):
    # As the evaluator's JSON parser: integers from INT64_MIN to UINT64_MAX stay
    # integers (past INT64_MAX an error where used), any other becomes a float.
    if len(s.lstrip("-")) <= 20:
        v = int(s)
        if INT64_MIN <= v <= UINT64_MAX:
            return v
    return _json_float(s)


def _json_constant(name):
    raise PlanError("launch plan is not valid JSON: %s" % name)


def _check_counts(plan):
    if not isinstance(plan, dict):
        return
    for key, limit in (("launches", MAX_LAUNCHES), ("scratch", MAX_SCRATCH_BUFFERS),
                       ("tensor_maps", MAX_TENSOR_MAPS)):
        if isinstance(plan.get(key), list) and len(plan[key]) > limit:
            raise PlanError('launch plan: "%s" has %d entries; the limit is %d' % (key, len(plan[key]), limit))
    if isinstance(plan.get("launches"), list):
        for i, l in enumerate(plan["launches"]):
            if isinstance(l, dict) and isinstance(l.get("args"), list) and len(l["args"]) > MAX_ARGS_PER_LAUNCH:
                raise PlanError('launches[%d]: "args" has %d entries; the limit is %d' %
                                (i, len(l["args"]), MAX_ARGS_PER_LAUNCH))


def parse_plan(text):
    """Plan text as the evaluator reads it (ParsePlanJson): the limits on the
    text, then the JSON, then the counts. Raises PlanError."""
    import json
    check_plan_text(text)
    try:
        plan = json.loads(text, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant)
    except (ValueError, RecursionError) as e:
        if isinstance(e, PlanError):
            raise
        raise PlanError("launch plan is not valid JSON: %s" % e)
    _check_counts(plan)
    return plan


class _Expr:
    def __init__(self, s, env):
        self.s, self.env, self.pos, self.depth = s, env, 0, 0

    def enter(self):
        self.depth += 1
        if self.depth > MAX_EXPR_DEPTH:
            raise self.error("nested deeper than %d levels" % MAX_EXPR_DEPTH)

    def error(self, what):
        return PlanError("expression '%s': %s at position %d" % (self.s, what, self.pos))

    def ws(self):
        while self.pos < len(self.s) and self.s[self.pos] in _SPACE:
            self.pos += 1

    def eat(self, c):
        self.ws()
        if self.pos < len(self.s) and self.s[self.pos] == c:
            self.pos += 1
            return True
        return False

    def checked(self, v):
        if v > INT64_MAX or v < INT64_MIN:
            raise self.error("integer overflow")
        return v

    def parse(self):
        v = self.sum()
        self.ws()
        if self.pos != len(self.s):
            raise self.error("unexpected '%s'" % self.s[self.pos])
        return v

    def sum(self):
        self.enter()
        v = self.product()
        while True:
            if self.eat("+"):
                r = self.product()
                v = self.checked(v + r)
            elif self.eat("-"):
                r = self.product()
                v = self.checked(v - r)
            else:
                self.depth -= 1
                return v

    def product(self):
        v = self.unary()
        while True:
            if self.eat("*"):
                op = "*"
            elif self.eat("/"):
                op = "/"
            elif self.eat("%"):
                op = "%"
            else:
                return v
            r = self.unary()
            if op == "*":
                v = self.checked(v * r)
            else:
                if r == 0:
                    raise self.error("division by zero")
                if v == INT64_MIN and r == -1:  # the evaluator's C++ would trap (SIGFPE)
                    raise self.error("integer overflow")
                q = abs(v) // abs(r)
                if (v < 0) != (r < 0):
                    q = -q
                v = q if op == "/" else v - q * r

    def unary(self):
        sign = "-" if self.eat("-") else "+" if self.eat("+") else ""
        if not sign:
            return self.primary()
        self.enter()
        v = self.unary()
        self.depth -= 1
        return self.checked(-v) if sign == "-" else v

    def primary(self):
        self.ws()
        if self.pos >= len(self.s):
            raise self.error("unexpected end")
        c = self.s[self.pos]
        if c == "(":
            self.pos += 1
            v = self.sum()
            if not self.eat(")"):
                raise self.error("expected ')'")
            return v
        if c in _DIGITS:
            v = 0
            while self.pos < len(self.s) and self.s[self.pos] in _DIGITS:
                v = v * 10 + _DIGITS.index(self.s[self.pos])
                self.pos += 1
                if v > INT64_MAX:
                    raise self.error("integer literal too large")
            if self.pos < len(self.s) and self.s[self.pos] in ".eE":
                raise self.error("a float literal is not allowed in an integer expression")
            return v
        if c in _ALPHA or c == "_":
            return self.name()
        raise self.error("unexpected '%s'" % c)

    def name(self):
        start = self.pos
        while self.pos < len(self.s) and (self.s[self.pos] in _ALPHA or self.s[self.pos] in _DIGITS or
                                          self.s[self.pos] in "_."):
            self.pos += 1
        name = self.s[start:self.pos]
        if name in ("cdiv", "min", "max"):
            if not self.eat("("):
                raise self.error("expected '(' after " + name)
            args = [self.sum()]
            while self.eat(","):
                args.append(self.sum())
            if not self.eat(")"):
                raise self.error("expected ')' to close %s(" % name)
            if name == "cdiv":
                if len(args) != 2:
                    raise self.error("cdiv takes two arguments")
                if args[1] <= 0:
                    raise self.error("cdiv by a non-positive number")
                if args[0] < 0:
                    raise self.error("cdiv of a negative number")
                return args[0] // args[1] + (1 if args[0] % args[1] else 0)
            return min(args) if name == "min" else max(args)
        if len(name) > 6 and name.endswith(".numel"):
            t = name[:-6]
            entry = self.env.find(t)
            if entry is None:
                raise self.error("unknown tensor '%s'" % t)
            n = _numel(entry)
            if n > INT64_MAX:
                raise self.error("integer overflow in %s.numel" % t)
            return n
        if len(name) > 6 and name.endswith(".shape"):
            t = name[:-6]
            entry = self.env.find(t)
            if entry is None:
                raise self.error("unknown tensor '%s'" % t)
            if not self.eat("["):
                raise self.error("expected '[' after .shape")
            idx = self.sum()
            if not self.eat("]"):
                raise self.error("expected ']'")
            shape = entry[1] if entry[0] == "tensor" else ()
            if idx < 0:
                idx += len(shape)
            if idx < 0 or idx >= len(shape):
                raise self.error("'%s' has %d dimensions; shape index out of range" % (t, len(shape)))
            return shape[idx]
        entry = self.env.find(name)
        if entry is not None and entry[0] == "scalar":
            if entry[2]:
                raise self.error("scalar '%s' is a float, not an integer" % name)
            return int(entry[1])
        if entry is not None:
            raise self.error("'%s' is a tensor; use %s.numel or %s.shape[i]" % (name, name, name))
        raise self.error("unknown name '%s'" % name)


def eval_int(expr, env):
    """An integer expression's value (PlanError when it has none)."""
    if len(expr) > MAX_EXPR_CHARS:
        raise PlanError("expression longer than %d characters" % MAX_EXPR_CHARS)
    return _Expr(expr, env).parse()


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _int64(v):
    if v > INT64_MAX or v < INT64_MIN:
        raise PlanError("integer %d is too large (int64)" % v)
    return v


def _field(v, env):
    if _is_int(v):
        return _int64(v)
    if isinstance(v, str):
        return eval_int(v, env)
    raise PlanError("expected an integer or an expression string, got %r" % (v,))


def _dims(v, env, what):
    if _is_int(v) or isinstance(v, str):
        return [_field(v, env), 1, 1]
    if not isinstance(v, list) or not v or len(v) > 3:
        raise PlanError(what + " must be a list of 1 to 3 entries")
    out = [1, 1, 1]
    for i, x in enumerate(v):
        try:
            out[i] = _field(x, env)
        except PlanError as e:
            raise PlanError("%s[%d]: %s" % (what, i, e))
    return out


def looks_like_float(s):
    if not s or not any(c in ".eE" for c in s):
        return False
    if any(c not in "0123456789.eE+-" for c in s):
        return False
    try:
        float(s)
    except ValueError:
        return False
    return True


def _want_int(v, kind):
    if kind == "b64":
        return {"kind": "i64", "value": v}
    if kind == "b32":
        if v < -(1 << 31) or v > (1 << 32) - 1:
            raise PlanError("value %d does not fit the kernel's 32-bit parameter" % v)
        return {"kind": "i32", "value": v}
    if kind == "f32":
        return {"kind": "f32", "value": float(v)}
    if kind == "f64":
        return {"kind": "f64", "value": float(v)}
    raise PlanError("the kernel's parameter is %s, which a plan argument cannot fill" % kind)


def _want_float(v, kind):
    if kind == "f32":
        return {"kind": "f32", "value": float(v)}
    if kind == "f64":
        return {"kind": "f64", "value": float(v)}
    raise PlanError("a float value for a %s parameter" % kind)


def resolve_arg(a, kind, env, scratch, maps=()):
    """One argument for a parameter of `kind` ("b64", "b32", "f32", "bytes128", ...)."""
    if isinstance(a, str) and a in maps:
        if kind != "bytes%d" % TENSOR_MAP_BYTES:
            raise PlanError("tensor map '%s' goes to a `const __grid_constant__ CUtensorMap` parameter (128 bytes, "
                            "aligned to 64), but the kernel's parameter is %s" % (a, kind))
        return {"kind": "tensor_map", "name": a}
    if isinstance(a, float):
        return _want_float(a, kind)
    if _is_int(a):
        return _want_int(_int64(a), kind)
    if not isinstance(a, str):
        raise PlanError("argument must be a string or a number, got %r" % (a,))
    if a in scratch:
        if kind != "b64":
            raise PlanError("scratch '%s' is a pointer but the kernel's parameter is %s" % (a, kind))
        return {"kind": "scratch", "name": a}
    entry = env.find(a)
    if entry is not None:
        if entry[0] == "scalar":
            return _want_float(entry[1], kind) if entry[2] else _want_int(int(entry[1]), kind)
        if kind != "b64":
            raise PlanError("tensor '%s' is a pointer but the kernel's parameter is %s" % (a, kind))
        return {"kind": "tensor", "name": a}
    if looks_like_float(a):
        return _want_float(float(a), kind)
    return _want_int(eval_int(a, env), kind)


def resolve_plan(plan, kernels, env):
    """The plan's launches and scratch at the shapes in `env`.

    plan: the parsed plan, or its text (parsed by parse_plan, with the limits).
    kernels: {"name": [parameter kinds]} from the compiled PTX. Returns
    {"launches": [{"kernel", "grid", "block", "shared", "cluster", "args"}],
     "scratch": [{"name", "bytes"}]}; raises PlanError.
    """
    if isinstance(plan, (str, bytes)):
        plan = parse_plan(plan)
    _check_counts(plan)
    if not isinstance(plan, dict):
        raise PlanError('launch plan must be a JSON object with "launches"')
    for key in plan:
        if key not in ("launches", "scratch", "tensor_maps"):
            raise PlanError('launch plan: unknown key "%s"' % key)
    out = {"launches": [], "scratch": []}
    scratch = set()
    sc = plan.get("scratch", [])
    if not isinstance(sc, list):
        raise PlanError("scratch must be a list")
    for i, s in enumerate(sc):
        where = "scratch[%d]" % i
        if not isinstance(s, dict) or not isinstance(s.get("name"), str) or "bytes" not in s:
            raise PlanError(where + ': needs "name" (string) and "bytes"')
        name = s["name"]
        where += " (%s)" % name
        if env.find(name) is not None:
            raise PlanError(where + ": name collides with a tensor of the signature")
        if name in scratch:
            raise PlanError(where + ": duplicate scratch name")
        scratch.add(name)
        try:
            nbytes = _field(s["bytes"], env)
        except PlanError as e:
            raise PlanError("%s: bytes: %s" % (where, e))
        if nbytes <= 0:
            raise PlanError("%s: bytes must be positive, got %d" % (where, nbytes))
        if nbytes > MAX_SCRATCH_BYTES:
            raise PlanError("%s: %d bytes exceeds the scratch limit of %d" % (where, nbytes, MAX_SCRATCH_BYTES))
        out["scratch"].append({"name": name, "bytes": nbytes})
    maps = []
    tm = plan.get("tensor_maps", [])
    if not isinstance(tm, list):
        raise PlanError("tensor_maps must be a list")
    scratch_bytes = {s["name"]: s["bytes"] for s in out["scratch"]}
    for i, e in enumerate(tm):
        where = "tensor_maps[%d]" % i
        if isinstance(e, dict) and isinstance(e.get("name"), str):
            where += " (%s)" % e["name"]
        try:
            m = resolve_tensor_map(e, env, scratch_bytes)
        except PlanError as err:
            raise PlanError("%s: %s" % (where, err))
        if env.find(m["name"]) is not None or m["name"] in scratch:
            raise PlanError(where + ": name collides with a tensor or scratch buffer")
        if m["name"] in [x["name"] for x in maps]:
            raise PlanError(where + ": duplicate tensor map name")
        maps.append(m)
    map_names = set(m["name"] for m in maps)
    if maps:
        out["tensor_maps"] = maps
    launches = plan.get("launches")
    if not isinstance(launches, list) or not launches:
        raise PlanError('launch plan needs a non-empty "launches" list')
    if len(launches) > MAX_LAUNCHES:
        raise PlanError("launch plan has %d launches; the limit is %d" % (len(launches), MAX_LAUNCHES))
    for li, l in enumerate(launches):
        where = "launches[%d]" % li
        if not isinstance(l, dict):
            raise PlanError(where + ": must be an object")
        for key in l:
            if key not in ("kernel", "grid", "block", "shared_bytes", "args", "cluster"):
                raise PlanError('%s: unknown key "%s"' % (where, key))
        if not isinstance(l.get("kernel"), str):
            raise PlanError(where + ': needs "kernel" (a name)')
        kernel = l["kernel"]
        where += " (%s)" % kernel
        if kernel not in kernels:
            raise PlanError(where + ': no extern "C" __global__ kernel of that name')
        kinds = kernels[kernel]
        if "grid" not in l:
            raise PlanError(where + ': needs "grid"')
        if "block" not in l:
            raise PlanError(where + ': needs "block"')
        try:
            grid = _dims(l["grid"], env, "grid")
            block = _dims(l["block"], env, "block")
        except PlanError as e:
            raise PlanError("%s: %s" % (where, e))
        for d in range(3):
            if not 1 <= grid[d] <= _GRID_MAX[d]:
                raise PlanError("%s: grid.%s = %d is outside 1..%d" % (where, "xyz"[d], grid[d], _GRID_MAX[d]))
            if not 1 <= block[d] <= _BLOCK_MAX[d]:
                raise PlanError("%s: block.%s = %d is outside 1..%d" % (where, "xyz"[d], block[d], _BLOCK_MAX[d]))
        if block[0] * block[1] * block[2] > 1024:
            raise PlanError("%s: block has %d threads; at most 1024" % (where, block[0] * block[1] * block[2]))
        shared = 0
        if "shared_bytes" in l:
            try:
                shared = _field(l["shared_bytes"], env)
            except PlanError as e:
                raise PlanError("%s: shared_bytes: %s" % (where, e))
        if shared < 0:
            raise PlanError(where + ": shared_bytes is negative")
        cluster = None
        if "cluster" in l:
            try:
                cluster = _dims(l["cluster"], env, "cluster")
            except PlanError as e:
                raise PlanError("%s: %s" % (where, e))
            size = 1
            for d in range(3):
                if cluster[d] < 1:
                    raise PlanError(where + ": cluster dimensions must be positive")
                if grid[d] % cluster[d] != 0:
                    raise PlanError(where + ": grid is not a multiple of the cluster shape")
                size *= cluster[d]
            if size > MAX_CLUSTER_SIZE:
                raise PlanError("%s: cluster of %d blocks; at most %d" % (where, size, MAX_CLUSTER_SIZE))
        args = l.get("args", [])
        if not isinstance(args, list):
            raise PlanError(where + ': "args" must be a list')
        if len(args) != len(kinds):
            raise PlanError("%s: %d args given but the kernel takes %d parameters" % (where, len(args), len(kinds)))
        resolved = []
        for ai, a in enumerate(args):
            try:
                resolved.append(resolve_arg(a, kinds[ai], env, scratch, map_names))
            except PlanError as e:
                raise PlanError("%s: args[%d] %r: %s" % (where, ai, a, e))
        out["launches"].append({"kernel": kernel, "grid": grid, "block": block, "shared": shared,
                                "cluster": cluster, "args": resolved})
    return out


def env_from_signature(signature):
    """The names of a signature (its JSON form) at its own shapes."""
    env = Env()
    for group in ("inputs", "parameters", "outputs"):
        for spec in signature.get(group, []):
            if spec.get("kind") == "scalar":
                env.add_scalar(spec["name"], spec.get("value", 0), spec.get("dtype") in FLOAT_DTYPES)
            else:
                env.add_tensor(spec["name"], spec.get("shape", []), spec.get("dtype", "float32"))
    return env


# ---- TMA tensor maps (evaluator/plan/tensor_map.cc) ----

TENSOR_MAP_BYTES = 128
TENSOR_MAP_KEYS = ("name", "tensor", "dtype", "dims", "byte_strides", "box", "element_strides", "interleave",
                   "swizzle", "l2_promotion", "oob_fill")
# The driver's enum values (CUtensorMapDataType, ...), which the resolved plan carries.
TMA_DTYPES = {"uint8": 0, "uint16": 1, "uint32": 2, "int32": 3, "uint64": 4, "int64": 5, "float16": 6,
              "float32": 7, "float64": 8, "bfloat16": 9, "tfloat32": 11}
_TMA_SIZES = {0: 1, 1: 2, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 11: 4}
_TMA_FLOATS = (6, 7, 8, 9, 11)
_TENSOR_TMA = {"float32": 7, "float16": 6, "bfloat16": 9, "float64": 8, "int32": 3, "int64": 5, "uint8": 0,
               "bool": 0}
_DTYPE_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "int8": 1,
                "uint8": 1, "bool": 1}
_INTERLEAVES = {"none": 0, "16B": 1, "32B": 2}
_SWIZZLES = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
_PROMOTIONS = {"none": 0, "64B": 1, "128B": 2, "256B": 3}
_FILLS = {"zero": 0, "nan": 1}


def _named(v, table, key):
    if isinstance(v, str) and v in table:
        return table[v]
    raise PlanError('"%s" must be one of %s, got %s' % (key, ", ".join('"%s"' % k for k in table), _dump(v)))


def _dump(v):
    import json
    return json.dumps(v)


def _int_list(v, env, key):
    if not isinstance(v, list):
        raise PlanError('"%s" must be a list' % key)
    out = []
    for i, x in enumerate(v):
        try:
            out.append(_field(x, env))
        except PlanError as e:
            raise PlanError("%s[%d]: %s" % (key, i, e))
    return out


def resolve_tensor_map(e, env, scratch_bytes):
    """One "tensor_maps" entry, checked, as the evaluator resolves it (TensorMapToJson's form)."""
    if not isinstance(e, dict):
        raise PlanError("must be an object")
    for key in e:
        if key not in TENSOR_MAP_KEYS:
            raise PlanError('unknown key "%s"' % key)
    if not isinstance(e.get("name"), str) or not e["name"]:
        raise PlanError('needs "name" (the launch argument that receives the map)')
    if not isinstance(e.get("tensor"), str):
        raise PlanError('needs "tensor" (a tensor of the signature or a scratch buffer)')
    if "box" not in e:
        raise PlanError('needs "box" (the tile, innermost dimension first)')
    name, tensor = e["name"], e["tensor"]
    entry = env.find(tensor)
    is_scratch = False
    if entry is not None and entry[0] == "tensor":
        shape, tdtype = entry[1], entry[2]
        target = _numel(entry) * _DTYPE_SIZES[tdtype]
        if tdtype not in _TENSOR_TMA:
            raise PlanError('%s tensors have no TMA data type; use "dtype": "uint8"' % tdtype)
        dtype = _TENSOR_TMA[tdtype]
        dims = list(reversed(shape)) or [1]
    elif tensor in scratch_bytes:
        is_scratch = True
        target = scratch_bytes[tensor]
        if "dtype" not in e or "dims" not in e:
            raise PlanError("scratch '%s' has no shape: give \"dtype\" and \"dims\"" % tensor)
        dtype, dims, tdtype = None, [], None
    elif entry is not None:
        raise PlanError("'%s' is a scalar, not a tensor" % tensor)
    else:
        raise PlanError("unknown tensor '%s'" % tensor)
    if "dtype" in e:
        d = _named(e["dtype"], TMA_DTYPES, "dtype")
        if not is_scratch and _TMA_SIZES[d] != _DTYPE_SIZES[tdtype]:
            raise PlanError('dtype "%s" is %d bytes but \'%s\' is %s' % (e["dtype"], _TMA_SIZES[d], tensor, tdtype))
        dtype = d
    elem = _TMA_SIZES[dtype]
    if "dims" in e:
        dims = _int_list(e["dims"], env, "dims")
    if not 1 <= len(dims) <= 5:
        raise PlanError("rank %d: a tensor map has 1 to 5 dimensions" % len(dims))
    rank = len(dims)
    if "byte_strides" in e:
        strides = _int_list(e["byte_strides"], env, "byte_strides")
        if len(strides) != rank - 1:
            raise PlanError('"byte_strides" has %d entries; a rank-%d map has %d' % (len(strides), rank, rank - 1))
    else:
        strides, s = [], elem
        for i in range(rank - 1):
            s *= dims[i]
            strides.append(s)
    box = _int_list(e["box"], env, "box")
    if len(box) != rank:
        raise PlanError('"box" has %d entries for a rank-%d map' % (len(box), rank))
    estr = [1] * rank
    if "element_strides" in e:
        estr = _int_list(e["element_strides"], env, "element_strides")
        if len(estr) != rank:
            raise PlanError('"element_strides" has %d entries for a rank-%d map' % (len(estr), rank))
    for i in range(rank):
        if dims[i] < 1:
            raise PlanError("dims[%d] = %d is not positive" % (i, dims[i]))
        if not 1 <= box[i] <= 256:
            raise PlanError("box[%d] = %d is outside 1..256: a box dimension is 1 to 256 elements" % (i, box[i]))
        if not 1 <= estr[i] <= 8:
            raise PlanError("element_strides[%d] = %d: an element stride is 1 to 8" % (i, estr[i]))
    for i, st in enumerate(strides):
        if st < 1:
            raise PlanError("byte_strides[%d] = %d is not positive" % (i, st))
    m = {"name": name, "tensor": tensor, "scratch": is_scratch, "target_bytes": target, "dtype": dtype,
         "dims": dims, "byte_strides": strides, "box": box, "element_strides": estr,
         "interleave": _named(e["interleave"], _INTERLEAVES, "interleave") if "interleave" in e else 0,
         "swizzle": _named(e["swizzle"], _SWIZZLES, "swizzle") if "swizzle" in e else 0,
         "l2_promotion": _named(e["l2_promotion"], _PROMOTIONS, "l2_promotion") if "l2_promotion" in e else 0,
         "oob_fill": _named(e["oob_fill"], _FILLS, "oob_fill") if "oob_fill" in e else 0}
    check_tensor_map(m)
    return m


def check_tensor_map(m):
    """cuTensorMapEncodeTiled's rules (all but the address) and ours; PlanError names the rule."""
    elem = _TMA_SIZES[m["dtype"]]
    rank = len(m["dims"])
    if m["interleave"] != 0 and rank < 3:
        raise PlanError("an interleaved map needs rank 3 or more (it has %d)" % rank)
    for i in range(rank):
        if not 1 <= m["dims"][i] <= (1 << 32):
            raise PlanError("dims[%d] = %d: a dimension is 1 to 2^32 elements" % (i, m["dims"][i]))
    align = 32 if m["interleave"] == 2 else 16
    for i, st in enumerate(m["byte_strides"]):
        if st % align:
            raise PlanError("byte_strides[%d] = %d is not a multiple of %d bytes" % (i, st, align))
        if st >= (1 << 40):
            raise PlanError("byte_strides[%d] = %d is not below 2^40" % (i, st))
    inner = m["box"][0] * elem
    if m["interleave"] == 0 and inner % 16:
        raise PlanError("the inner box (box[0] = %d x %d bytes = %d bytes) is not a multiple of 16 bytes" %
                        (m["box"][0], elem, inner))
    if m["interleave"] == 0 and m["swizzle"] != 0:
        span = 16 << m["swizzle"]
        if inner > span:
            raise PlanError("the inner box (box[0] = %d x %d bytes = %d bytes) is wider than the %dB swizzle span" %
                            (m["box"][0], elem, inner, span))
    if m["interleave"] == 2 and m["swizzle"] != 1:
        raise PlanError('"interleave": "32B" needs "swizzle": "32B"')
    if m["oob_fill"] == 1 and m["dtype"] not in _TMA_FLOATS:
        raise PlanError('"oob_fill": "nan" needs a floating-point dtype')
    last = m["dims"][0] * elem + sum((m["dims"][i] - 1) * m["byte_strides"][i - 1] for i in range(1, rank))
    if last > m["target_bytes"]:
        raise PlanError("the map reaches byte %d of '%s', which has %d bytes: dims and byte_strides must stay "
                        "inside the tensor" % (last, m["tensor"], m["target_bytes"]))
