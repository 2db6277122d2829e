"""kernelsearch export: candidate @@ID@@ of problem @@PROBLEM@@ (@@SPEEDUP@@).

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
verified at the problem's shapes (SIGNATURE) on get_inputs()'s data and on
distribution-shifted copies of it (ROBUSTNESS says what held); at other shapes
it runs when its plan allows, unverified. No autograd: use it for inference.

Before trusting it in your model, verify and time it on your own data:

    from kernel_module import check, benchmark
    print(check(model, *my_inputs))      # against the problem's Model, same weights
    print(benchmark(model, *my_inputs))  # medians of the kernel and of PyTorch eager

The kernel was compiled for @@TARGET@@. An arch-specific target (sm_90a:
Hopper's wgmma, setmaxnreg) runs only on that architecture, so on any other
GPU this module refuses to run rather than compile something else. TMA tensor
maps in the plan are built on each call with the driver's
cuTensorMapEncodeTiled from the call's own tensors, as the evaluator built them.
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

SOURCE = "@@SOURCE@@"
PLAN = json.loads("@@PLAN@@")
SIGNATURE = json.loads("@@SIGNATURE@@")
# What held beyond get_inputs() when the evaluator judged it (inputs scaled,
# negated, with outliers): {"specialised", "broken_by", "checks"}; null when not recorded.
ROBUSTNESS = json.loads("@@ROBUSTNESS@@")
# The judging rule this kernel was held to (evaluator/judge/judge.h): its
# precision contract and the judge's constants; check() applies the same rule.
JUDGE = json.loads("@@JUDGE@@")
# Parameter kinds of each kernel, from the PTX NVRTC produced at export time.
KERNELS = json.loads("@@KERNELS@@")
# The plan as the evaluator resolved it at the signature's shapes.
RESOLVED = json.loads("@@RESOLVED@@")
# The evaluator's NVRTC options (after -arch=sm_XY, before the -I folders) and
# the header it pre-includes.
NVRTC_OPTIONS = json.loads("@@NVRTC_OPTIONS@@")
PRELUDE_NAME = "@@PRELUDE_NAME@@"
PRELUDE = "@@PRELUDE@@"
EXPORT_CUDA_HOME = "@@CUDA_HOME@@"
# The NVRTC target the evaluation compiled for ("sm_90a", or "sm_90" and older).
TARGET = "@@TARGET@@"

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


class _TensorMap(ctypes.Structure):  # CUtensorMap: 128 opaque bytes
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


class _TensorMapParam:
    """A CUtensorMap in a 64-byte aligned buffer: the driver copies a kernel's
    by-value parameter from the address it is given, and TMA descriptors must
    be 64-byte aligned where they are encoded."""

    def __init__(self):
        self._buf = ctypes.create_string_buffer(128 + 64)
        off = (-ctypes.addressof(self._buf)) % 64
        self.map = _TensorMap.from_buffer(self._buf, off)

    def address(self):
        return ctypes.addressof(self.map)


def _encode_tensor_map(m, pointer):
    """The plan's map `m` (the evaluator's resolved form) over memory at `pointer`."""
    cu = _cuda()
    if not hasattr(cu, "cuTensorMapEncodeTiled"):
        raise RuntimeError("this CUDA driver has no cuTensorMapEncodeTiled (TMA needs CUDA 12 and a Hopper GPU)")
    align = 32 if m["interleave"] == 2 else 16
    if pointer % align:
        raise RuntimeError("tensor map %s: the global address of '%s' is not %d-byte aligned" %
                           (m["name"], m["tensor"], align))
    rank = len(m["dims"])
    param = _TensorMapParam()
    dims = (ctypes.c_uint64 * rank)(*m["dims"])
    strides = (ctypes.c_uint64 * max(rank - 1, 1))(*(m["byte_strides"] or [0]))
    box = (ctypes.c_uint32 * rank)(*m["box"])
    estr = (ctypes.c_uint32 * rank)(*m["element_strides"])
    _check(cu.cuTensorMapEncodeTiled(ctypes.byref(param.map), m["dtype"], rank, ctypes.c_void_p(pointer), dims,
                                     strides, box, estr, m["interleave"], m["swizzle"], m["l2_promotion"],
                                     m["oob_fill"]), "cuTensorMapEncodeTiled " + m["name"])
    return param


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
        if hasattr(lib, "cuTensorMapEncodeTiled"):
            u64p, u32p = _P(ctypes.c_uint64), _P(ctypes.c_uint32)
            _bind(lib, "cuTensorMapEncodeTiled", i,
                  [_P(_TensorMap), i, u, v, u64p, u64p, u32p, u32p, i, i, i, i])
        _cuda_lib = lib
    return _cuda_lib


def _check(rc, what):
    if rc != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError("%s failed: %s" % (what, name.value.decode() if name.value else rc))


def target_for(major, minor, target=None):
    """The NVRTC target for a GPU of compute capability major.minor: the
    exported one when it is arch-specific (refusing any other architecture),
    else the GPU's own."""
    target = TARGET if target is None else target
    arch = "sm_%d%d" % (major, minor)
    if target.endswith("a"):
        if target[:-1] != arch:
            raise RuntimeError(
                "this kernel was compiled for %s, an arch-specific target whose instructions (wgmma, setmaxnreg, "
                "...) exist only on that architecture; this GPU is %s (compute capability %d.%d). Export it again "
                "from an evaluation on this GPU." % (target, arch, major, minor))
        return target
    return arch


def _compile(device_index):
    """CUBIN for this device, compiled as the evaluator compiles."""
    major, minor = torch.cuda.get_device_capability(device_index)
    home = _cuda_home()
    opts = ["-arch=" + target_for(major, minor)] + NVRTC_OPTIONS + ["-I" + d for d in _include_dirs(home)]
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


def _launch(entry, launch, pointers, stream, maps=None):
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
        elif kind == "tensor_map":
            values.append(maps[a["name"]].map)
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
            env.add_tensor(spec["name"], t.shape, spec["dtype"])
            pointers.setdefault(spec["name"], t)
            same_shapes = same_shapes and list(t.shape) == spec["shape"]
        state = self.state_dict()
        for spec in SIGNATURE["parameters"]:
            t = _tensor_arg(state[spec["name"]], spec, device)
            env.add_tensor(spec["name"], t.shape, spec["dtype"])
            pointers.setdefault(spec["name"], t)
            same_shapes = same_shapes and list(t.shape) == spec["shape"]
        shapes = ([spec["shape"] for spec in SIGNATURE["outputs"]] if same_shapes
                  else self._output_shapes(inputs))
        outputs = []
        for spec, shape in zip(SIGNATURE["outputs"], shapes):
            t = torch.empty(shape, dtype=_DTYPES[spec["dtype"]], device=device)
            env.add_tensor(spec["name"], t.shape, spec["dtype"])
            pointers.setdefault(spec["name"], t)
            outputs.append(t)
        plan = _plan.resolve_plan(PLAN, KERNELS, env)
        if same_shapes and same_scalars and plan != RESOLVED:
            raise AssertionError("kernelsearch export is broken: the plan resolves to\n%s\nhere but the evaluator "
                                 "resolved it to\n%s" % (json.dumps(plan), json.dumps(RESOLVED)))
        for s in plan["scratch"]:  # not zeroed, as in the evaluator
            pointers[s["name"]] = torch.empty(s["bytes"], dtype=torch.uint8, device=device)
        entry = _loaded(device.index if device.index is not None else torch.cuda.current_device())
        # Built after the module loaded (the driver is initialised), over this call's tensors.
        maps = {m["name"]: _encode_tensor_map(m, pointers[m["tensor"]].data_ptr())
                for m in plan.get("tensor_maps", [])}
        stream = torch.cuda.current_stream(device).cuda_stream
        for launch in plan["launches"]:
            _launch(entry, launch, pointers, stream, maps)
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


# The evaluator's default bounds per dtype (evaluator/signature.cc): element-wise
# atol/rtol, and the relative error norm ||out - ref|| / ||ref||.
_DEFAULT_BOUNDS = {"float32": (1e-4, 1e-4, 1e-5), "float16": (1e-2, 1e-2, 5e-3), "bfloat16": (2e-2, 2e-2, 1e-2),
                   "float64": (1e-8, 1e-6, 1e-9)}


def compare(out, ref, dtype, tolerance=None, bound=None, contract=None, own_rel_norm=None):
    """One output against its reference by the evaluator's rules: {"numel",
    "mismatches" (outside atol + rtol * |ref| + bound, NaN where the reference
    is finite included), "max_abs", "rel_norm", "rel_norm_bound", "ok"}.
    `tolerance` is the problem's TOLERANCE, if any; `bound` (per element, or
    None) what PyTorch's own error allows on top (_block_bound); `contract`
    the precision contract ("kernelbench": atol = rtol = 1e-2 and nothing
    else); `own_rel_norm` PyTorch's own relative error against float64, which
    widens the norm bound by the contract's factor."""
    atol, rtol, rel_norm_bound = _DEFAULT_BOUNDS.get(dtype, (0.0, 0.0, 0.0))
    if tolerance:
        atol, rtol = tolerance.get("atol", atol), tolerance.get("rtol", rtol)
        rel_norm_bound = tolerance.get("rel_norm", max(rel_norm_bound, rtol / 4))
    if contract == "kernelbench" and out.is_floating_point():
        atol, rtol, rel_norm_bound = JUDGE["kernelbench_atol"], JUDGE["kernelbench_rtol"], 0.0
    elif own_rel_norm is not None and rel_norm_bound > 0:
        rel_norm_bound = max(rel_norm_bound, max(JUDGE["factor"], JUDGE["highest_factor"]) * own_rel_norm)
    o, r = out.detach().double().reshape(-1), ref.detach().double().reshape(-1)
    if o.shape != r.shape:
        return {"numel": r.numel(), "mismatches": r.numel(), "max_abs": float("inf"), "rel_norm": float("inf"),
                "rel_norm_bound": rel_norm_bound, "ok": False, "why": "shape %s, expected %s" %
                (list(out.shape), list(ref.shape))}
    if not out.is_floating_point():
        bad = int((o != r).sum())
        return {"numel": r.numel(), "mismatches": bad, "max_abs": float((o - r).abs().max()) if r.numel() else 0.0,
                "rel_norm": 0.0, "rel_norm_bound": 0.0, "ok": bad == 0}
    finite = torch.isfinite(r)
    d = (o - r).abs()
    limit = atol + rtol * r.abs()
    if bound is not None:
        limit = limit + bound.to(limit.device, torch.float64).reshape(-1)
    bad = (~torch.isfinite(o) & finite) | (finite & (d > limit))
    bad = bad | (~finite & ~((o == r) | (torch.isnan(o) & torch.isnan(r))))
    df, rf = d[finite & torch.isfinite(o)], r[finite & torch.isfinite(o)]
    ref_norm = float(rf.norm()) if rf.numel() else 0.0
    rel_norm = float(df.norm()) / ref_norm if ref_norm > 0 else float(df.norm()) if df.numel() else 0.0
    mismatches = int(bad.sum())
    return {"numel": r.numel(), "mismatches": mismatches, "max_abs": float(df.max()) if df.numel() else 0.0,
            "rel_norm": rel_norm, "rel_norm_bound": rel_norm_bound,
            "ok": mismatches == 0 and (rel_norm_bound <= 0 or rel_norm <= rel_norm_bound)}


def _reference(model, inputs):
    """The problem's own forward on the same module (same weights), in full
    float32 as the evaluator's reference (TF32 off)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    model._ks_reference_forward = True
    try:
        with torch.no_grad():
            out = model(*inputs)
    finally:
        model._ks_reference_forward = False
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _float64_reference(model, inputs):
    """The problem's own forward on a float64 copy of the module and inputs
    (the truth the evaluator judges against), or None where float64 fails."""
    import copy
    floats = (torch.float32, torch.float16, torch.bfloat16)
    try:
        model64 = copy.deepcopy(model).double()
        inputs64 = tuple(v.double() if isinstance(v, torch.Tensor) and v.dtype in floats else v for v in inputs)
        model64._ks_reference_forward = True
        with torch.no_grad():
            out = model64(*inputs64)
    except Exception:  # noqa: BLE001 - an op without float64: judged against float32, as the evaluator does
        return None
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _block_bound(pt32, pt64):
    """Per element, what PyTorch's own error allows (evaluator/judge/judge.h):
    the highest factor times the largest |PyTorch - float64| of its block of
    BOUND_BLOCK elements, or the contract's factor times it, whichever is
    larger; +inf where PyTorch is not finite and float64 is."""
    a, b = pt32.detach().double().reshape(-1), pt64.detach().double().reshape(-1)
    d = (a - b).abs()
    d = torch.where(torch.isfinite(b) & ~torch.isfinite(a), torch.full_like(d, float("inf")), d)
    d = torch.where(torch.isfinite(b), d, torch.zeros_like(d))
    block = int(JUDGE["bound_block"])
    n = d.numel()
    pad = (-n) % block
    blocks = torch.cat([d, d.new_zeros(pad)]).view(-1, block).amax(dim=1) if n else d
    factor = max(JUDGE["factor"], JUDGE["highest_factor"])
    return (blocks * factor).repeat_interleave(block)[:n]


def check(model, *inputs):
    """Verifies the exported kernel on your own inputs (any shapes its plan
    allows, your data) by the rule it was judged by (JUDGE): ModelNew `model`
    against the problem's Model forward run in float64 on the same module,
    output by output (compare()), allowing per block of elements the
    contract's factor times PyTorch's own float32 error there; against
    PyTorch's float32 output where float64 is not supported. Returns {"ok":
    bool, "truth": "float64" | "float32", "contract", "outputs": [compare()'s
    figures with "name"]}; a wrong answer is reported, not raised."""
    got = model(*inputs)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    ref = _reference(model, inputs)
    truth = _float64_reference(model, inputs)
    outputs = []
    for i, (spec, o, r) in enumerate(zip(SIGNATURE["outputs"], got, ref)):
        t = truth[i] if truth is not None and i < len(truth) else None
        if t is not None and o.is_floating_point() and t.shape == r.shape:
            own = compare(r, t, spec["dtype"])  # PyTorch's own float32 against float64
            figures = compare(o, t, spec["dtype"], SIGNATURE.get("tolerance"), bound=_block_bound(r, t),
                              contract=JUDGE["contract"], own_rel_norm=own["rel_norm"])
        else:
            figures = compare(o, r, spec["dtype"], SIGNATURE.get("tolerance"), contract=JUDGE["contract"])
        figures["name"] = spec["name"]
        outputs.append(figures)
    return {"ok": len(got) == len(ref) and all(f["ok"] for f in outputs),
            "truth": "float64" if truth is not None else "float32", "contract": JUDGE["contract"],
            "outputs": outputs}


def benchmark(model, *inputs, runs=50, warmup=5):
    """Times the exported kernel and PyTorch eager (the problem's Model forward,
    PyTorch's default settings) on your inputs with CUDA events: {"kernel_ms",
    "eager_ms" (medians), "speedup", "runs"}."""
    def median_ms(fn):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(runs):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        return times[len(times) // 2]

    def eager():
        model._ks_reference_forward = True
        try:
            with torch.no_grad():
                model(*inputs)
        finally:
            model._ks_reference_forward = False

    with torch.no_grad():
        kernel_ms = median_ms(lambda: model(*inputs))
    eager_ms = median_ms(eager)
    return {"kernel_ms": kernel_ms, "eager_ms": eager_ms, "speedup": eager_ms / kernel_ms if kernel_ms > 0 else None,
            "runs": runs}
