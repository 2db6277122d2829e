#include "search/export.h"

#include <map>

#include <fmt/format.h>

#include "evaluator/compiler.h"
#include "evaluator/signature.h"

namespace ks {
namespace {

// ks_launch_plan.py: the evaluator's launch-plan rules (evaluator/launch_plan.cc)
// in Python. export_test compares the two on many plans; change both together.
constexpr const char* kLaunchPlanPy = R"PY("""Launch plans as kernelsearch's evaluator reads them (evaluator/launch_plan.cc),
for an exported kernel: integer expressions evaluated against the shapes of one
call's tensors, and each argument turned into what the kernel's parameter takes.

Pure Python, no torch, so that tests can compare it with the evaluator. The
rules, as in the evaluator:
- expressions: integers, + - * / % (C semantics: / truncates toward zero, %
  takes the dividend's sign), parentheses, unary minus, cdiv(a, b), min(...),
  max(...), <tensor>.shape[i] (negative i counts from the end), <tensor>.numel,
  integer scalar inputs by name; 64-bit overflow is an error;
- an argument names a scratch buffer or a tensor (passed as a pointer; the
  parameter must be 64-bit), a scalar input (its value), a float literal string
  ("0.00001"), a JSON number, or an integer expression;
- an integer goes into a 64-bit parameter as int64, a 32-bit one as int32 (it
  must fit), a float/double parameter as that float; a float only into a
  float/double parameter.
"""

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
MAX_SCRATCH_BYTES = 16 << 30
MAX_LAUNCHES = 64
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

    def add_tensor(self, name, shape):
        self._entries.setdefault(name, ("tensor", tuple(int(d) for d in shape)))

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


class _Expr:
    def __init__(self, s, env):
        self.s, self.env, self.pos = s, env, 0

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
        v = self.product()
        while True:
            if self.eat("+"):
                r = self.product()
                v = self.checked(v + r)
            elif self.eat("-"):
                r = self.product()
                v = self.checked(v - r)
            else:
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
                q = abs(v) // abs(r)
                if (v < 0) != (r < 0):
                    q = -q
                v = q if op == "/" else v - q * r

    def unary(self):
        if self.eat("-"):
            return self.checked(-self.unary())
        if self.eat("+"):
            return self.unary()
        return self.primary()

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
            return _numel(entry)
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
    if len(expr) > 4096:
        raise PlanError("expression longer than 4096 characters")
    return _Expr(expr, env).parse()


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _field(v, env):
    if _is_int(v):
        return v
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


def resolve_arg(a, kind, env, scratch):
    """One argument for a parameter of `kind` ("b64", "b32", "f32", ...)."""
    if isinstance(a, float):
        return _want_float(a, kind)
    if _is_int(a):
        return _want_int(a, kind)
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

    kernels: {"name": [parameter kinds]} from the compiled PTX. Returns
    {"launches": [{"kernel", "grid", "block", "shared", "cluster", "args"}],
     "scratch": [{"name", "bytes"}]}; raises PlanError.
    """
    if not isinstance(plan, dict):
        raise PlanError('launch plan must be a JSON object with "launches"')
    for key in plan:
        if key == "tensor_maps":
            raise PlanError('launch plan: "tensor_maps" (TMA descriptors) is not supported by this evaluator yet')
        if key not in ("launches", "scratch"):
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
                resolved.append(resolve_arg(a, kinds[ai], env, scratch))
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
                env.add_tensor(spec["name"], spec.get("shape", []))
    return env
)PY";

// kernel_module.py; @@NAME@@ marks what ExportCandidate fills in.
constexpr const char* kModulePy = R"PY("""kernelsearch export: candidate @@ID@@ of problem @@PROBLEM@@ (@@SPEEDUP@@).

    import sys; sys.path.insert(0, "<this folder>")
    from kernel_module import ModelNew
    model = ModelNew(*problem.get_init_inputs()).cuda()
    out = model(*inputs)

ModelNew is the problem's Model (same constructor, parameters and state_dict
keys, so weights load as they are) whose forward runs the exported kernel on
the current CUDA stream. The source is compiled at first use on each device with
NVRTC exactly as kernelsearch's evaluator compiled it (the same options and
pre-included header), and launched with the CUDA driver, both through ctypes:
no build step, no extra package. Plan expressions are evaluated against the
shapes of each call's tensors and every argument is passed as the kernel's
parameter takes it, by the evaluator's rules (ks_launch_plan.py). The kernel was
verified at the problem's shapes (SIGNATURE); at other shapes it runs when its
plan allows, unverified. No autograd: use it for inference.
"""
import ctypes
import ctypes.util
import glob
import importlib.util
import json
import os
import threading

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, file))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_plan = _load("ks_launch_plan", "ks_launch_plan.py")
_problem = _load("ks_problem", "problem.py")

SOURCE = @@SOURCE@@
PLAN = json.loads(@@PLAN@@)
SIGNATURE = json.loads(@@SIGNATURE@@)
# Parameter kinds of each kernel, from the PTX NVRTC produced at export time.
KERNELS = json.loads(@@KERNELS@@)
# The plan as the evaluator resolved it at the signature's shapes.
RESOLVED = json.loads(@@RESOLVED@@)
# The evaluator's NVRTC options (after -arch=sm_XY, before the -I folders) and
# the header it pre-includes.
NVRTC_OPTIONS = json.loads(@@NVRTC_OPTIONS@@)
PRELUDE_NAME = "ks_prelude.h"
PRELUDE = @@PRELUDE@@
EXPORT_CUDA_HOME = @@CUDA_HOME@@

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
           "float64": torch.float64, "int32": torch.int32, "int64": torch.int64, "int8": torch.int8,
           "uint8": torch.uint8, "bool": torch.bool}
_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
_LOCK = threading.Lock()


def _cuda_home():
    """The CUDA root whose headers NVRTC sees, found as the evaluator finds it."""
    cands = [os.environ.get(v) for v in ("KS_CUDA_HOME", "CUDA_HOME", "CUDA_PATH")]
    cands += ["/usr/local/cuda", EXPORT_CUDA_HOME]
    for c in cands:
        if c and os.path.exists(os.path.join(c, "include", "cuda_fp16.h")):
            return c
    raise RuntimeError("no CUDA toolkit headers found (include/cuda_fp16.h) in %s; set KS_CUDA_HOME" %
                       [c for c in cands if c])


def _include_dirs(home):
    dirs = [os.path.join(home, "include")]
    if os.path.exists(os.path.join(home, "include", "cccl")):
        dirs.append(os.path.join(home, "include", "cccl"))
    return dirs


def _bind(lib, name, restype, argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


_P = ctypes.POINTER
_nvrtc_lib = None
_cuda_lib = None


def _nvrtc(home):
    global _nvrtc_lib
    if _nvrtc_lib is None:
        cands = []
        for sub in ("lib64", "lib", os.path.join("targets", "*", "lib")):
            cands += sorted(glob.glob(os.path.join(home, sub, "libnvrtc.so")))
            cands += sorted(glob.glob(os.path.join(home, sub, "libnvrtc.so.*")))
        found = ctypes.util.find_library("nvrtc")
        if found:
            cands.append(found)
        nvidia = os.path.join(os.path.dirname(torch.__file__), "..", "nvidia")
        cands += sorted(glob.glob(os.path.join(nvidia, "cuda_nvrtc", "lib", "libnvrtc.so*")))
        for c in cands:
            try:
                lib = ctypes.CDLL(c)
                break
            except OSError:
                continue
        else:
            raise RuntimeError("cannot load libnvrtc (tried %s)" % cands)
        _bind(lib, "nvrtcGetErrorString", ctypes.c_char_p, [ctypes.c_int])
        _bind(lib, "nvrtcCreateProgram", ctypes.c_int,
              [_P(ctypes.c_void_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int, _P(ctypes.c_char_p),
               _P(ctypes.c_char_p)])
        _bind(lib, "nvrtcCompileProgram", ctypes.c_int, [ctypes.c_void_p, ctypes.c_int, _P(ctypes.c_char_p)])
        _bind(lib, "nvrtcGetProgramLogSize", ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_size_t)])
        _bind(lib, "nvrtcGetProgramLog", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p])
        _bind(lib, "nvrtcGetCUBINSize", ctypes.c_int, [ctypes.c_void_p, _P(ctypes.c_size_t)])
        _bind(lib, "nvrtcGetCUBIN", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p])
        _bind(lib, "nvrtcDestroyProgram", ctypes.c_int, [_P(ctypes.c_void_p)])
        _nvrtc_lib = lib
    return _nvrtc_lib


class _LaunchAttributeValue(ctypes.Union):  # CUlaunchAttributeValue: 64 bytes
    _fields_ = [("pad", ctypes.c_ubyte * 64), ("clusterDim", ctypes.c_uint * 3)]


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_ubyte * 4), ("value", _LaunchAttributeValue)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", _P(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


def _cuda():
    global _cuda_lib
    if _cuda_lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            lib = ctypes.CDLL("libcuda.so")
        v, i, u = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
        _bind(lib, "cuInit", i, [u])
        _bind(lib, "cuGetErrorName", i, [i, _P(ctypes.c_char_p)])
        _bind(lib, "cuDeviceGet", i, [_P(i), i])
        _bind(lib, "cuDevicePrimaryCtxRetain", i, [_P(v), i])
        _bind(lib, "cuCtxSetCurrent", i, [v])
        _bind(lib, "cuModuleLoadData", i, [_P(v), v])
        _bind(lib, "cuModuleGetFunction", i, [_P(v), v, ctypes.c_char_p])
        _bind(lib, "cuFuncSetAttribute", i, [v, i, i])
        _bind(lib, "cuLaunchKernel", i, [v, u, u, u, u, u, u, u, v, _P(v), _P(v)])
        if hasattr(lib, "cuLaunchKernelEx"):
            _bind(lib, "cuLaunchKernelEx", i, [_P(_LaunchConfig), v, _P(v), _P(v)])
        _cuda_lib = lib
    return _cuda_lib


def _check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError("%s failed: %s" % (what, name.value.decode() if name.value else rc))


def _compile(device_index):
    """CUBIN for this device, compiled as the evaluator compiles."""
    major, minor = torch.cuda.get_device_capability(device_index)
    home = _cuda_home()
    opts = ["-arch=sm_%d%d" % (major, minor)] + NVRTC_OPTIONS + ["-I" + d for d in _include_dirs(home)]
    nv = _nvrtc(home)
    prog = ctypes.c_void_p()
    headers = (ctypes.c_char_p * 1)(PRELUDE.encode())
    names = (ctypes.c_char_p * 1)(PRELUDE_NAME.encode())
    rc = nv.nvrtcCreateProgram(ctypes.byref(prog), SOURCE.encode(), b"candidate.cu", 1, headers, names)
    if rc != 0:
        raise RuntimeError("nvrtcCreateProgram: " + nv.nvrtcGetErrorString(rc).decode())
    try:
        copts = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        rc = nv.nvrtcCompileProgram(prog, len(opts), copts)
        if rc != 0:
            size = ctypes.c_size_t()
            nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(max(size.value, 1))
            nv.nvrtcGetProgramLog(prog, log)
            raise RuntimeError("NVRTC (%s) failed: %s\n%s" % (" ".join(opts), nv.nvrtcGetErrorString(rc).decode(),
                                                             log.value.decode(errors="replace")))
        size = ctypes.c_size_t()
        if nv.nvrtcGetCUBINSize(prog, ctypes.byref(size)) != 0 or size.value == 0:
            raise RuntimeError("NVRTC produced no CUBIN for sm_%d%d" % (major, minor))
        cubin = ctypes.create_string_buffer(size.value)
        nv.nvrtcGetCUBIN(prog, cubin)
        return cubin
    finally:
        nv.nvrtcDestroyProgram(ctypes.byref(prog))


class _Loaded:
    """The compiled module on one device: its primary context (torch's), the
    kernels, and the dynamic shared memory each was allowed so far."""

    def __init__(self, device_index):
        cu = _cuda()
        _check(cu.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        _check(cu.cuDeviceGet(ctypes.byref(dev), device_index), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        # Retained for the life of the process, like the module loaded into it.
        _check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        _check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        cubin = _compile(device_index)
        self.module = ctypes.c_void_p()
        _check(cu.cuModuleLoadData(ctypes.byref(self.module), cubin), "cuModuleLoadData")
        self.functions = {}
        for name in KERNELS:
            fn = ctypes.c_void_p()
            _check(cu.cuModuleGetFunction(ctypes.byref(fn), self.module, name.encode()), "cuModuleGetFunction " + name)
            self.functions[name] = fn
        self.shared_allowed = {}


_LOADED = {}


def _loaded(device_index):
    with _LOCK:
        entry = _LOADED.get(device_index)
        if entry is None:
            entry = _LOADED[device_index] = _Loaded(device_index)
    _check(_cuda().cuCtxSetCurrent(entry.ctx), "cuCtxSetCurrent")
    return entry


def _launch(entry, launch, pointers, stream):
    cu = _cuda()
    fn = entry.functions[launch["kernel"]]
    shared = launch["shared"]
    # As the evaluator does: more than 48 KiB of dynamic shared memory must be allowed first.
    if shared > 48 * 1024 and entry.shared_allowed.get(launch["kernel"], 0) < shared:
        _check(cu.cuFuncSetAttribute(fn, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared),
               "%s: raising dynamic shared memory to %d bytes" % (launch["kernel"], shared))
        entry.shared_allowed[launch["kernel"]] = shared
    values = []
    for a in launch["args"]:
        kind = a["kind"]
        if kind in ("tensor", "scratch"):
            values.append(ctypes.c_uint64(pointers[a["name"]].data_ptr()))
        elif kind == "i32":
            values.append(ctypes.c_int32(a["value"]))
        elif kind == "i64":
            values.append(ctypes.c_int64(a["value"]))
        elif kind == "f32":
            values.append(ctypes.c_float(a["value"]))
        elif kind == "f64":
            values.append(ctypes.c_double(a["value"]))
        else:
            raise RuntimeError("unknown argument kind %r" % kind)
    params = (ctypes.c_void_p * max(len(values), 1))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                                      for v in values])
    g, b = launch["grid"], launch["block"]
    if launch.get("cluster"):
        if not hasattr(cu, "cuLaunchKernelEx"):
            raise RuntimeError("this CUDA driver has no cuLaunchKernelEx (needed for thread-block clusters)")
        attr = _LaunchAttribute()
        attr.id = _CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        for d in range(3):
            attr.value.clusterDim[d] = launch["cluster"][d]
        cfg = _LaunchConfig(g[0], g[1], g[2], b[0], b[1], b[2], shared, ctypes.c_void_p(stream),
                            ctypes.pointer(attr), 1)
        _check(cu.cuLaunchKernelEx(ctypes.byref(cfg), fn, params, None), "cuLaunchKernelEx " + launch["kernel"])
    else:
        _check(cu.cuLaunchKernel(fn, g[0], g[1], g[2], b[0], b[1], b[2], shared, ctypes.c_void_p(stream), params,
                                 None), "cuLaunchKernel " + launch["kernel"])


def _tensor_arg(value, spec, device):
    name = spec["name"]
    if not isinstance(value, torch.Tensor):
        raise TypeError("%s: expected a tensor, got %s" % (name, type(value).__name__))
    want = _DTYPES[spec["dtype"]]
    if value.dtype != want:
        raise TypeError("%s: the kernel takes %s, got %s" % (name, want, value.dtype))
    if value.device != device:
        raise ValueError("%s is on %s; the call runs on %s" % (name, value.device, device))
    return value.detach().contiguous()


class ModelNew(_problem.Model):
    """The problem's Model, running the exported kernel in forward."""

    def forward(self, *args, **kwargs):
        if getattr(self, "_ks_reference_forward", False):  # output shapes at new input shapes
            return super().forward(*args, **kwargs)
        inputs = list(args)
        for spec in SIGNATURE["inputs"][len(inputs):]:
            if spec["name"] not in kwargs:
                raise TypeError("missing input '%s'" % spec["name"])
            inputs.append(kwargs.pop(spec["name"]))
        if kwargs or len(inputs) != len(SIGNATURE["inputs"]):
            raise TypeError("expected the inputs %s" % [s["name"] for s in SIGNATURE["inputs"]])
        device = next((v.device for v in inputs if isinstance(v, torch.Tensor)), None)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device.type != "cuda":
            raise ValueError("the exported kernel runs on CUDA tensors; got %s" % device)
        with torch.cuda.device(device), torch.no_grad():
            return self._run(device, inputs)

    def _run(self, device, inputs):
        env = _plan.Env()
        pointers = {}
        same_shapes = True   # every tensor has the signature's shape
        same_scalars = True  # every scalar has the signature's value
        for spec, value in zip(SIGNATURE["inputs"], inputs):
            if spec["kind"] == "scalar":
                if isinstance(value, torch.Tensor):
                    value = value.item()
                env.add_scalar(spec["name"], value, spec["dtype"] in _plan.FLOAT_DTYPES)
                same_scalars = same_scalars and value == spec["value"]
                continue
            t = _tensor_arg(value, spec, device)
            env.add_tensor(spec["name"], t.shape)
            pointers.setdefault(spec["name"], t)
            same_shapes = same_shapes and list(t.shape) == spec["shape"]
        state = self.state_dict()
        for spec in SIGNATURE["parameters"]:
            t = _tensor_arg(state[spec["name"]], spec, device)
            env.add_tensor(spec["name"], t.shape)
            pointers.setdefault(spec["name"], t)
            same_shapes = same_shapes and list(t.shape) == spec["shape"]
        shapes = ([spec["shape"] for spec in SIGNATURE["outputs"]] if same_shapes
                  else self._output_shapes(inputs))
        outputs = []
        for spec, shape in zip(SIGNATURE["outputs"], shapes):
            t = torch.empty(shape, dtype=_DTYPES[spec["dtype"]], device=device)
            env.add_tensor(spec["name"], t.shape)
            pointers.setdefault(spec["name"], t)
            outputs.append(t)
        plan = _plan.resolve_plan(PLAN, KERNELS, env)
        if same_shapes and same_scalars and plan != RESOLVED:
            raise AssertionError("kernelsearch export is broken: the plan resolves to\n%s\nhere but the evaluator "
                                 "resolved it to\n%s" % (json.dumps(plan), json.dumps(RESOLVED)))
        for s in plan["scratch"]:  # not zeroed, as in the evaluator
            pointers[s["name"]] = torch.empty(s["bytes"], dtype=torch.uint8, device=device)
        entry = _loaded(device.index if device.index is not None else torch.cuda.current_device())
        stream = torch.cuda.current_stream(device).cuda_stream
        for launch in plan["launches"]:
            _launch(entry, launch, pointers, stream)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _output_shapes(self, inputs):
        """The reference's output shapes at these input shapes, on the meta device."""
        meta_state = {k: torch.empty_like(v, device="meta") for k, v in self.state_dict().items()}
        meta_inputs = tuple(torch.empty_like(v, device="meta") if isinstance(v, torch.Tensor) else v for v in inputs)
        self._ks_reference_forward = True
        try:
            out = torch.func.functional_call(self, meta_state, meta_inputs)
        except Exception as e:
            raise ValueError("cannot tell the output shapes at input shapes %s (the kernel was verified at %s): %s" %
                             ([list(v.shape) for v in meta_inputs if isinstance(v, torch.Tensor)],
                              [s.get("shape") for s in SIGNATURE["inputs"]], e))
        finally:
            self._ks_reference_forward = False
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if len(outs) != len(SIGNATURE["outputs"]):
            raise ValueError("the reference returned %d outputs; the signature has %d" %
                             (len(outs), len(SIGNATURE["outputs"])))
        return [list(o.shape) for o in outs]
)PY";

// A Python string literal (JSON strings are Python literals); bytes that are not
// UTF-8 become U+FFFD rather than an exception.
std::string PyString(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Replaces every @@NAME@@ of `text` in one pass (a value may itself hold "@@").
StatusOr<std::string> Fill(const std::string& text, const std::map<std::string, std::string>& values) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t open = text.find("@@", pos);
    if (open == std::string::npos) break;
    size_t close = text.find("@@", open + 2);
    if (close == std::string::npos) return Internal("unterminated @@ in the module template");
    std::string key = text.substr(open + 2, close - open - 2);
    auto it = values.find(key);
    if (it == values.end()) return Internal("no value for @@" + key + "@@ in the module template");
    out += text.substr(pos, open - pos);
    out += it->second;
    pos = close + 2;
  }
  out += text.substr(pos);
  return out;
}

// Text for the module's docstring: no quotes or backslashes that could end it.
std::string DocText(std::string s) {
  for (char& ch : s)
    if (ch == '"' || ch == '\\' || ch == '\n') ch = ' ';
  return s;
}

std::string Describe(const store::CandidateRow& c) {
  if (!c.evaluation) return "not evaluated";
  nlohmann::json e = nlohmann::json::parse(c.evaluation->evaluation_json, nullptr, false);
  std::string device = e.is_object() ? e.value("device", "") : "";
  std::string on = device.empty() ? "" : " on " + device;
  if (c.evaluation->status != EvalStatus::kCorrect)
    return std::string("NOT a correct kernel: evaluated ") + EvalStatusName(c.evaluation->status) + on;
  if (c.evaluation->speedup_eager) return fmt::format("correct, {:.2f}x over PyTorch eager{}", *c.evaluation->speedup_eager, on);
  return "correct" + on;
}

}  // namespace

const std::vector<std::string>& EvaluatorNvrtcOptions() { return NvrtcBaseOptions(); }

const char* EvaluatorNvrtcPrelude() { return NvrtcPrelude(); }

const char* LaunchPlanPython() { return kLaunchPlanPy; }

const char* ParamKindCode(ParamKind k) {
  switch (k) {
    case ParamKind::kB64: return "b64";
    case ParamKind::kB32: return "b32";
    case ParamKind::kF32: return "f32";
    case ParamKind::kF64: return "f64";
    case ParamKind::kB16: return "b16";
    case ParamKind::kB8: return "b8";
    case ParamKind::kBytes: return "bytes";
  }
  return "?";
}

nlohmann::json KernelParamKindsJson(const std::vector<KernelInfo>& kernels) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& k : kernels) {
    nlohmann::json kinds = nlohmann::json::array();
    for (const auto& p : k.params) kinds.push_back(ParamKindCode(p.kind));
    j[k.name] = kinds;
  }
  return j;
}

nlohmann::json ResolvedPlanToJson(const ResolvedPlan& plan) {
  nlohmann::json launches = nlohmann::json::array();
  for (const auto& l : plan.launches) {
    nlohmann::json args = nlohmann::json::array();
    for (const auto& a : l.args) {
      switch (a.kind) {
        case ArgValue::Kind::kTensor: args.push_back({{"kind", "tensor"}, {"name", a.name}}); break;
        case ArgValue::Kind::kScratch: args.push_back({{"kind", "scratch"}, {"name", a.name}}); break;
        case ArgValue::Kind::kInt32: args.push_back({{"kind", "i32"}, {"value", a.i}}); break;
        case ArgValue::Kind::kInt64: args.push_back({{"kind", "i64"}, {"value", a.i}}); break;
        case ArgValue::Kind::kFloat32: args.push_back({{"kind", "f32"}, {"value", a.f}}); break;
        case ArgValue::Kind::kFloat64: args.push_back({{"kind", "f64"}, {"value", a.f}}); break;
      }
    }
    launches.push_back({{"kernel", l.kernel},
                        {"grid", l.grid},
                        {"block", l.block},
                        {"shared", l.shared_bytes},
                        {"cluster", l.cluster ? nlohmann::json(*l.cluster) : nlohmann::json(nullptr)},
                        {"args", args}});
  }
  nlohmann::json scratch = nlohmann::json::array();
  for (const auto& s : plan.scratch) scratch.push_back({{"name", s.name}, {"bytes", s.bytes}});
  return {{"launches", launches}, {"scratch", scratch}};
}

StatusOr<std::vector<ExportedFile>> ExportCandidate(store::LineageStore* store, int64_t candidate_id,
                                                    const ExportOptions& options) {
  KS_ASSIGN_OR_RETURN(store::CandidateRow c, store->GetCandidate(candidate_id));
  const std::string which = "candidate " + std::to_string(c.id);
  if (c.source.empty()) return FailedPrecondition(which + " has no kernel source (the model's reply held none)");
  KS_ASSIGN_OR_RETURN(store::SearchRow search, store->GetSearch(c.search_id));
  KS_ASSIGN_OR_RETURN(store::ProblemRow problem, store->GetProblem(search.problem_id));
  nlohmann::json sj = nlohmann::json::parse(problem.signature_json, nullptr, false);
  if (!sj.is_object() || sj.empty())
    return FailedPrecondition("the store has no signature for problem " + problem.name);
  auto sig = SignatureFromJson(sj);
  if (!sig.ok()) return sig.status().WithContext("problem " + problem.name + " signature");

  // The parameter kinds come from the PTX of this very source (no GPU needed).
  CompileOptions co;
  co.arch = options.arch;
  co.worker_path = options.worker_path;
  co.cuda_home = options.cuda_home;
  KS_ASSIGN_OR_RETURN(CompileResult compiled, CompileCandidate(c.source, co));
  if (!compiled.ok)
    return FailedPrecondition(which + " does not compile for " + options.arch + ": " + compiled.message +
                              (compiled.log.empty() ? "" : "\n" + compiled.log));
  auto plan = ResolvePlan(c.plan_json, *sig, compiled.kernels, PlanLimits{});
  if (!plan.ok()) return FailedPrecondition(which + ": its launch plan does not resolve: " + plan.status().message());
  KS_ASSIGN_OR_RETURN(std::string cuda_home, FindCudaHome(options.cuda_home));

  std::vector<std::string> opts = EvaluatorNvrtcOptions();
  KS_ASSIGN_OR_RETURN(std::string module,
                      Fill(kModulePy, {{"ID", std::to_string(c.id)},
                                       {"PROBLEM", DocText(problem.name)},
                                       {"SPEEDUP", DocText(Describe(c))},
                                       {"SOURCE", PyString(c.source)},
                                       {"PLAN", PyString(c.plan_json)},
                                       {"SIGNATURE", PyString(SignatureToJson(*sig).dump())},
                                       {"KERNELS", PyString(KernelParamKindsJson(compiled.kernels).dump())},
                                       {"RESOLVED", PyString(ResolvedPlanToJson(*plan).dump())},
                                       {"NVRTC_OPTIONS", PyString(nlohmann::json(opts).dump())},
                                       {"PRELUDE", PyString(NvrtcPrelude())},
                                       {"CUDA_HOME", PyString(cuda_home)}}));
  return std::vector<ExportedFile>{{"kernel.cu", c.source},
                                   {"plan.json", c.plan_json},
                                   {"problem.py", problem.source},
                                   {"ks_launch_plan.py", kLaunchPlanPy},
                                   {"kernel_module.py", module}};
}

}  // namespace ks
