# Long on purpose: an export is this one file (and ks_launch_plan.py), with no runtime of kernelsearch to lean on.
"""kernelsearch export: candidate @@ID@@ of problem @@PROBLEM@@ (@@SPEEDUP@@).

    import sys; sys.path.insert(0, "<this folder>")
    from kernel_module import ModelNew
    model = ModelNew(*problem.get_init_inputs()).cuda()
    out = model(*inputs)                               # the kernel, eagerly
    fast = torch.compile(model, fullgraph=True)        # one graph, no break
    graphed = torch.compile(model, mode="reduce-overhead")  # CUDA graphs
    loss = fast(*inputs).sum(); loss.backward()        # trainable

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
it runs when its plan allows, unverified. Likewise it was verified only for the
model the problem builds (Model(*get_init_inputs())): a ModelNew built with
other constructor arguments runs when its plan allows, unverified.

A PyTorch operator (torch >= 2.4). The kernel is registered with
torch.library.custom_op as OP_NAME (kernelsearch::candidate_<id>_<hash of the
kernel, plan and problem>), taking the forward's inputs and every state_dict
tensor of the module as tensor arguments, so that torch.compile sees one
operator, not Python it cannot trace: a model that uses ModelNew compiles
with fullgraph=True. Its fake implementation gives
the outputs' shapes by running the problem's own forward on the fake tensors
(at the signature's shapes, the signature's). On an older torch, OP is None,
OP_NOTE says why, and ModelNew calls the kernel as a plain eager Python call:
no autograd, and a graph break under torch.compile.

CUDA graphs (torch.cuda.CUDAGraph, mode="reduce-overhead"). A call launches on
the current stream and neither synchronizes nor allocates outside PyTorch:
outputs and scratch buffers come from PyTorch's caching allocator (inside a
capture, from the graph's pool), plans and output shapes are cached per shape.
NVRTC compiles and the driver loads the module at the first eager call on a
device (or at prepare()); a capture that would have to load it first is
refused with that advice, since module loading is not capture-safe
(reduce-overhead warms up eagerly before it records). A TMA tensor map is
encoded on the host for each call's own tensor and passed by value as a
__grid_constant__ parameter: the driver copies kernel parameters when it
launches, and a captured launch keeps its copy in the graph node, so no
descriptor memory has to outlive the call; the map names the captured
tensor's address, which a replay reads again (as every captured kernel reads
its static inputs).
Capturing a whole training step (torch.cuda.graph around forward and
backward) follows PyTorch's recipe: warm up on a side stream, and let no
autograd graph of an earlier step stay alive (drop its outputs and losses).
A parameter's gradient accumulator keeps the stream it was created on, and
while an old graph holds one made on the default stream, the backward inside
the capture must make the default stream wait on the capturing one, which
CUDA refuses (cudaErrorStreamCaptureImplicit, after PyTorch's warning that
"the AccumulateGrad node's stream does not match").

Autograd: ModelNew is trainable. The forward runs the kernel and keeps only
its inputs and parameters (references, no copies); the backward recomputes
the problem's own forward under autograd on those tensors, with the module's
non-tensor attributes and train/eval mode, and returns PyTorch's own
gradients of it (torch.autograd.grad with the incoming gradients). This is
activation checkpointing around the kernel: PyTorch's backward exactly as the
problem's Model defines it, whatever the operator is, with less activation
memory than eager; the price is one more PyTorch forward in every backward,
so a training step gains only what the kernel saves in the forward (see
benchmark()'s train_* figures). Under torch.compile the recomputation and its
backward are traced like any PyTorch code (the partitioner may run the
recomputation beside the kernel in the forward graph and save what it
computes, as it does for any forward).
Gradients reach the inputs and the parameters (the Model's own) because both
are arguments of the operator. Saving the Model's intermediates instead would
need the Model's forward run in the forward beside the kernel, which is the
cost the kernel exists to avoid.

Why ctypes and not NVIDIA's cuda-python: the module needs about fifteen
driver and NVRTC entry points whose C ABI has been stable since CUDA 12.0
(cuLaunchKernelEx, cuTensorMapEncodeTiled included). ctypes binds them in the
driver that PyTorch itself loaded, so the module runs wherever torch runs,
with nothing to install. cuda-python would add a package whose version must
match the driver's and toolkit's major version (its 12.x and 13.x bindings
differ) and give typed objects that still need converting to and from
torch's raw stream and pointer integers; its per-launch Python cost is of the
same order. What ctypes costs: the structures (CUlaunchConfig,
CUlaunchAttribute, CUtensorMap) are written out here, and every function is
declared with its argument types (_bind) so a wrong argument fails in Python
rather than in the driver. Under CUDA graphs the per-launch Python cost is
gone altogether: a replay launches from the graph.

Before trusting it in your model, verify and time it on your own data:

    from kernel_module import check, check_backward, benchmark
    print(check(model, *my_inputs))           # against the problem's Model, same weights
    print(check_backward(model, *my_inputs))  # gradients of a training step, same rule
    print(benchmark(model, *my_inputs))       # forward and training step vs PyTorch eager

All three take a torch.compile'd model as well.

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
# The candidate's id in the store (in the operator's name: kernelsearch::candidate_<id>_<hash>).
CANDIDATE_ID = "@@ID@@"

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
            if torch.cuda.is_current_stream_capturing():
                # Loading a module may allocate and synchronize: not allowed while a CUDA graph is captured.
                raise RuntimeError(
                    "kernelsearch export: the kernel is not loaded on cuda:%d yet, and it cannot be loaded while a "
                    "CUDA graph is being captured. Call the model once eagerly (or model.prepare()) before the "
                    "capture, as CUDA graph capture asks of every library." % device_index)
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


def _check_tensor(value, spec, device):
    """`value` as the signature's tensor `spec` on `device`, or the reason why not."""
    name = spec["name"]
    if not isinstance(value, torch.Tensor):
        raise TypeError("%s: expected a tensor, got %s" % (name, type(value).__name__))
    want = _DTYPES[spec["dtype"]]
    if value.dtype != want:
        raise TypeError("%s: the kernel takes %s, got %s" % (name, want, value.dtype))
    if value.device != device:
        raise ValueError("%s is on %s; the call runs on %s" % (name, value.device, device))


def _tensor_arg(value, spec, device):
    _check_tensor(value, spec, device)
    return value.detach().contiguous()


# ---- the call: inputs and state in, outputs out ----

# Forward's inputs in order; the module's state tensors (state_dict keys) as
# attribute paths ("ln.weight" -> ("ln", "weight")), read so that torch.compile
# traces them as the module's parameters and buffers.
_INPUT_NAMES = tuple(spec["name"] for spec in SIGNATURE["inputs"])
_STATE_PATHS = tuple(tuple(spec["name"].split(".")) for spec in SIGNATURE["parameters"])
_SCALAR_TYPES = {"float32": "float", "float64": "float", "float16": "float", "bfloat16": "float", "bool": "bool"}
# Per input: None for a tensor, else the schema type of the scalar ("float", "int", "bool").
_SCALAR_KINDS = tuple(None if spec["kind"] != "scalar" else _SCALAR_TYPES.get(spec["dtype"], "int")
                      for spec in SIGNATURE["inputs"])
_CACHE_LIMIT = 256


def _bind_inputs(args, kwargs):
    """forward's arguments in SIGNATURE["inputs"] order."""
    inputs = list(args)
    kwargs = dict(kwargs)
    for name in _INPUT_NAMES[len(inputs):]:
        if name not in kwargs:
            raise TypeError("missing input '%s'" % name)
        inputs.append(kwargs.pop(name))
    if kwargs or len(inputs) != len(_INPUT_NAMES):
        raise TypeError("expected the inputs %s" % list(_INPUT_NAMES))
    return inputs


def _member(module, path):
    for part in path:
        module = getattr(module, part)
    return module


def _call_device(tensors, fake=False):
    """The device a call runs on: its first tensor's. The kernel runs on CUDA
    tensors only; the fake implementation (`fake`) describes the outputs on
    any device, since torch.compile traces with fake tensors of whatever
    device the model is on, and the refusal belongs to the call that runs."""
    device = next((v.device for v in tensors if isinstance(v, torch.Tensor)), None)
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda" and not fake:
        raise ValueError("the exported kernel runs on CUDA tensors; got %s" % device)
    return device


def _same_as_signature(inputs, state):
    """Every tensor has the signature's shape and every scalar its value."""
    for spec, value in zip(SIGNATURE["inputs"] + SIGNATURE["parameters"], list(inputs) + list(state)):
        if spec["kind"] == "scalar":
            if value != spec["value"]:
                return False
        elif list(value.shape) != spec["shape"]:
            return False
    return True


class _Reference(torch.nn.Module):
    """The problem's own forward (Model.forward, never the kernel) of a
    ModelNew, for torch.func.functional_call to run with other state tensors."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def forward(self, *inputs):
        return _problem.Model.forward(self.m, *inputs)


_MODEL_LOCK = threading.RLock()  # functional_call swaps a module's tensors while it runs


def _reference_outputs(model, training, inputs, state):
    """The problem's forward of `model` in train (or eval) mode on `inputs`,
    with its state_dict tensors replaced by `state` (SIGNATURE["parameters"]
    order): fake, meta or real tensors; under autograd where grad mode is on."""
    subst = {"m." + spec["name"]: t for spec, t in zip(SIGNATURE["parameters"], state)}
    func = getattr(torch, "func", None)
    with _MODEL_LOCK:
        was = model.training
        if was != training:
            model.train(training)
        try:
            if func is not None and hasattr(func, "functional_call"):
                # Tied weights arrive as separate arguments; each is substituted on its own.
                out = func.functional_call(_Reference(model), subst, tuple(inputs), tie_weights=False)
            else:  # torch 1.x
                from torch.nn.utils import stateless
                out = stateless.functional_call(_Reference(model), subst, tuple(inputs))
        finally:
            if was != training:
                model.train(was)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if len(outs) != len(SIGNATURE["outputs"]):
        raise ValueError("the reference returned %d outputs; the signature has %d" %
                         (len(outs), len(SIGNATURE["outputs"])))
    return outs


def _output_shapes(model, training, inputs, state):
    """The outputs' shapes at these inputs: the signature's at its own shapes,
    else the problem's forward run on the meta device."""
    if _same_as_signature(inputs, state):
        return [spec["shape"] for spec in SIGNATURE["outputs"]]
    meta = lambda v: torch.empty_like(v, device="meta") if isinstance(v, torch.Tensor) else v  # noqa: E731
    try:
        with torch.no_grad():
            outs = _reference_outputs(model, training, [meta(v) for v in inputs], [meta(v) for v in state])
    except Exception as e:
        raise ValueError("cannot tell the output shapes at input shapes %s (the kernel was verified at %s): %s" %
                         ([list(v.shape) for v in inputs if isinstance(v, torch.Tensor)],
                          [s.get("shape") for s in SIGNATURE["inputs"]], e))
    return [list(o.shape) for o in outs]


_PLANS = {}  # (model key, training, shapes, scalars) -> (output shapes, resolved plan)


def _run(model_key, training, device, inputs, state):
    """Runs the plan on `device`'s current stream: outputs (a list). Capture-safe
    once the module is loaded: no synchronization, every buffer from torch."""
    pointers = {}
    shapes, scalars = [], []
    for spec, value in zip(SIGNATURE["inputs"] + SIGNATURE["parameters"], list(inputs) + list(state)):
        if spec["kind"] == "scalar":
            scalars.append(value.item() if isinstance(value, torch.Tensor) else value)
            continue
        t = _tensor_arg(value, spec, device)
        pointers.setdefault(spec["name"], t)
        shapes.append(tuple(t.shape))
    key = (model_key, bool(training), tuple(shapes), tuple(scalars))
    cached = _PLANS.get(key)
    if cached is None:
        cached = _PLANS[key] = _plan_for(_model(model_key), training, inputs, state, scalars)
        if len(_PLANS) > _CACHE_LIMIT:
            _PLANS.clear()
            _PLANS[key] = cached
    out_shapes, plan = cached
    outputs = []
    for spec, shape in zip(SIGNATURE["outputs"], out_shapes):
        t = torch.empty(shape, dtype=_DTYPES[spec["dtype"]], device=device)
        pointers.setdefault(spec["name"], t)
        outputs.append(t)
    for s in plan["scratch"]:  # not zeroed, as in the evaluator; from the caching allocator
        pointers[s["name"]] = torch.empty(s["bytes"], dtype=torch.uint8, device=device)
    entry = _loaded(device.index if device.index is not None else torch.cuda.current_device())
    # Built after the module loaded (the driver is initialised), over this call's tensors;
    # passed by value, so the launch (or the captured graph node) keeps its own copy.
    maps = {m["name"]: _encode_tensor_map(m, pointers[m["tensor"]].data_ptr())
            for m in plan.get("tensor_maps", [])}
    stream = torch.cuda.current_stream(device).cuda_stream
    for launch in plan["launches"]:
        _launch(entry, launch, pointers, stream, maps)
    return outputs


def _plan_for(model, training, inputs, state, scalars):
    """(output shapes, the plan resolved at these shapes), checked against the
    evaluator's resolution at the signature's own shapes and values."""
    out_shapes = _output_shapes(model, training, inputs, state)
    env = _plan.Env()
    values = iter(scalars)
    for spec, value in zip(SIGNATURE["inputs"] + SIGNATURE["parameters"], list(inputs) + list(state)):
        if spec["kind"] == "scalar":
            env.add_scalar(spec["name"], next(values), spec["dtype"] in _plan.FLOAT_DTYPES)
        else:
            env.add_tensor(spec["name"], tuple(value.shape), spec["dtype"])
    for spec, shape in zip(SIGNATURE["outputs"], out_shapes):
        env.add_tensor(spec["name"], tuple(shape), spec["dtype"])
    plan = _plan.resolve_plan(PLAN, KERNELS, env)
    if _same_as_signature(inputs, state) and plan != RESOLVED:
        raise AssertionError("kernelsearch export is broken: the plan resolves to\n%s\nhere but the evaluator "
                             "resolved it to\n%s" % (json.dumps(plan), json.dumps(RESOLVED)))
    return [list(s) for s in out_shapes], plan


# ---- ModelNew instances, by the key the operator carries ----

_MODELS = {}  # key -> weakref to a ModelNew
_NEXT_KEY = [0]


def _register_model(model):
    import weakref
    with _MODEL_LOCK:
        key = _NEXT_KEY[0]
        _NEXT_KEY[0] += 1
        _MODELS[key] = weakref.ref(model, lambda _ref, key=key: _MODELS.pop(key, None))
    return key


def _model(key):
    ref = _MODELS.get(key)
    model = ref() if ref is not None else None
    if model is None:
        raise RuntimeError("the ModelNew this call belongs to (key %d) no longer exists" % key)
    return model


# ---- the PyTorch custom operator (torch >= 2.4) ----
#
# kernelsearch::candidate_<id>_<hash>(int ks_model, bool ks_training, <inputs>, <state tensors>) -> outputs.
# ks_model names the ModelNew (whose problem forward gives the fake shapes and
# the backward), ks_training its mode; the rest are forward's inputs
# (tensors, or int/float/bool scalars) and every state_dict tensor.

def _op_schema():
    """The operator's schema, from the signature."""
    def arg_name(prefix, i, name):
        return "%s%d_%s" % (prefix, i, "".join(c if c.isalnum() else "_" for c in name))
    args = ["int ks_model", "bool ks_training"]
    for i, spec in enumerate(SIGNATURE["inputs"]):
        kind = "Tensor" if spec["kind"] != "scalar" else _SCALAR_TYPES.get(spec["dtype"], "int")
        args.append("%s %s" % (kind, arg_name("in", i, spec["name"])))
    for i, spec in enumerate(SIGNATURE["parameters"]):
        args.append("Tensor %s" % arg_name("state", i, spec["name"]))
    n = len(SIGNATURE["outputs"])
    returns = "Tensor" if n == 1 else "(%s)" % ", ".join(["Tensor"] * n)
    return "(%s) -> %s" % (", ".join(args), returns)


def _op_scalar(kind, value):
    """A scalar input as the operator's schema takes it (`kind`: _SCALAR_KINDS)."""
    if isinstance(value, torch.Tensor):
        value = value.item()
    return float(value) if kind == "float" else bool(value) if kind == "bool" else int(value)


def _split(args):
    n = len(SIGNATURE["inputs"])
    return list(args[:n]), list(args[n:])


def _call_kernel(model_key, training, inputs, state):
    """The kernel on the inputs' device: its outputs, one tensor or a tuple."""
    device = _call_device(inputs)
    with torch.cuda.device(device):
        outputs = _run(model_key, training, device, inputs, state)
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _op_forward(ks_model, ks_training, *args):
    """The real implementation: runs the kernel."""
    inputs, state = _split(args)
    return _call_kernel(ks_model, ks_training, inputs, state)


def _op_fake(ks_model, ks_training, *args):
    """The fake (meta) implementation: outputs of the right shapes, dtypes and
    device (any device: only the real call refuses a non-CUDA one), from the
    problem's own forward run on the fake tensors."""
    inputs, state = _split(args)
    device = _call_device(inputs + state, fake=True)
    for spec, value in zip(SIGNATURE["inputs"] + SIGNATURE["parameters"], inputs + state):
        if spec["kind"] != "scalar":
            _check_tensor(value, spec, device)
    try:
        with torch.no_grad():
            shapes = [o.shape for o in _reference_outputs(_model(ks_model), ks_training, inputs, state)]
    except Exception as e:  # noqa: BLE001 - a forward that fake tensors cannot run
        if not _same_as_signature(inputs, state):
            raise ValueError("cannot tell the output shapes at input shapes %s (the kernel was verified at %s): %s"
                             % ([list(v.shape) for v in inputs if isinstance(v, torch.Tensor)],
                                [s.get("shape") for s in SIGNATURE["inputs"]], e))
        shapes = [spec["shape"] for spec in SIGNATURE["outputs"]]
    outputs = [torch.empty(shape, dtype=_DTYPES[spec["dtype"]], device=device)
               for spec, shape in zip(SIGNATURE["outputs"], shapes)]
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _op_setup_context(ctx, inputs, output):
    """Keeps the operator's inputs (references) for the backward's recomputation."""
    ctx.ks_model, ctx.ks_training = inputs[0], inputs[1]
    args = inputs[2:]
    ctx.is_tensor = [isinstance(a, torch.Tensor) for a in args]
    ctx.scalars = [None if t else a for a, t in zip(args, ctx.is_tensor)]
    ctx.save_for_backward(*[a for a, t in zip(args, ctx.is_tensor) if t])


def _op_backward(ctx, *grads):
    """PyTorch's own gradients of the problem's forward, recomputed on the
    saved inputs and state (see the module docstring)."""
    saved = iter(ctx.saved_tensors)
    args = [next(saved) if t else s for t, s in zip(ctx.is_tensor, ctx.scalars)]
    want = [bool(n) and t for n, t in zip(ctx.needs_input_grad[2:], ctx.is_tensor)]
    if not any(want):
        return (None,) * (2 + len(args))
    create_graph = torch.is_grad_enabled()  # a double backward differentiates this one too
    with torch.enable_grad():
        leaves = [a.detach().requires_grad_(w) if t else a for a, t, w in zip(args, ctx.is_tensor, want)]
        inputs, state = _split(leaves)
        outs = _reference_outputs(_model(ctx.ks_model), ctx.ks_training, inputs, state)
        pairs = [(o, g) for o, g in zip(outs, grads)
                 if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        wanted = [leaf for leaf, w in zip(leaves, want) if w]
        if pairs:
            got = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True,
                                      create_graph=create_graph)
        else:
            got = [None] * len(wanted)
    got = iter(got)
    return (None, None) + tuple(next(got) if w else None for w in want)


def _op_exists(name):
    try:
        getattr(torch.ops.kernelsearch, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def _register_op():
    """(the operator's OpOverload, its name, "") or (None, "", why not)."""
    library = getattr(torch, "library", None)
    custom_op = getattr(library, "custom_op", None)
    if custom_op is None:
        return None, "", ("torch %s has no torch.library.custom_op (torch 2.4 and later): ModelNew calls the kernel "
                          "as a plain eager Python call, without autograd (use it for inference), and "
                          "torch.compile breaks the graph around it" % torch.__version__)
    if not any(spec["kind"] != "scalar" for spec in SIGNATURE["inputs"] + SIGNATURE["parameters"]):
        return None, "", "the operator takes no tensor, so PyTorch cannot dispatch it: ModelNew calls the kernel eagerly"
    # The content in the name: torch.compile's on-disk caches key a compiled graph by the operators it
    # calls, not by their backward formulas, so another kernel or problem must never share a name.
    import hashlib
    with open(os.path.join(_HERE, "problem.py"), "rb") as f:
        content = f.read()
    for text in (SOURCE, json.dumps(PLAN, sort_keys=True), json.dumps(SIGNATURE, sort_keys=True)):
        content += b"\0" + text.encode("utf-8", "replace")
    base = "candidate_%s_%s" % ("".join(c if c.isalnum() else "_" for c in CANDIDATE_ID),
                                hashlib.sha256(content).hexdigest()[:12])
    name, n = base, 1
    while _op_exists(name):  # another import of an export in this process: never replace its operator
        n += 1
        name = "%s_%d" % (base, n)
    try:
        op = custom_op("kernelsearch::" + name, _op_forward, mutates_args=(), schema=_op_schema())
        op.register_fake(_op_fake)
        op.register_autograd(_op_backward, setup_context=_op_setup_context)
        overload = getattr(torch.ops.kernelsearch, name).default
    except Exception as e:  # noqa: BLE001 - reported in OP_NOTE; the kernel still runs eagerly
        return None, "", ("registering the custom operator kernelsearch::%s failed (%s: %s): ModelNew calls the "
                          "kernel eagerly, without autograd" % (name, type(e).__name__, e))
    return overload, "kernelsearch::" + name, ""


OP, OP_NAME, OP_NOTE = _register_op()
_WARNED = []


class ModelNew(_problem.Model):
    """The problem's Model, running the exported kernel in forward (the
    PyTorch operator OP where there is one; see the module docstring)."""

    _ks_reference_forward = False  # check() and benchmark() set it to run the problem's forward

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._ks_key = _register_model(self)

    def __setstate__(self, state):  # copy.deepcopy and pickle: a copy is a model of its own
        super().__setstate__(state)
        self._ks_key = _register_model(self)

    def forward(self, *args, **kwargs):
        if self._ks_reference_forward:
            return super().forward(*args, **kwargs)
        inputs = _bind_inputs(args, kwargs)
        state = [_member(self, path) for path in _STATE_PATHS]
        if OP is None:
            return self._eager_call(inputs, state)
        if any(_SCALAR_KINDS):
            inputs = [v if kind is None else _op_scalar(kind, v) for kind, v in zip(_SCALAR_KINDS, inputs)]
        return OP(self._ks_key, self.training, *inputs, *state)

    def _eager_call(self, inputs, state):
        """Without the operator (OP_NOTE): the kernel as a plain call, no autograd."""
        _call_device(inputs)  # CPU tensors are refused before the warning
        if torch.is_grad_enabled() and not _WARNED and any(
                isinstance(v, torch.Tensor) and v.requires_grad for v in list(inputs) + list(state)):
            import warnings
            _WARNED.append(True)
            warnings.warn("kernelsearch export: " + OP_NOTE + "; the output has no gradient", stacklevel=3)
        with torch.no_grad():
            return _call_kernel(self._ks_key, self.training, inputs, state)

    def prepare(self, device=None):
        """Compiles and loads the kernel on `device` (default: the current CUDA
        device) now instead of at the first call: for a CUDA graph captured
        before any eager call."""
        device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        with torch.cuda.device(device):
            _loaded(device.index if device.index is not None else torch.cuda.current_device())
        return self

    def _output_shapes(self, inputs):
        """The reference's output shapes at these input shapes, on the meta device."""
        return _output_shapes(self, self.training, list(inputs), [_member(self, p) for p in _STATE_PATHS])


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


def _base(model):
    """The ModelNew inside a torch.compile wrapper (its _orig_mod), or `model`:
    the problem's forward runs on it, eagerly."""
    return getattr(model, "_orig_mod", model)


def _outputs(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


class _Float32:
    """Full float32 (TF32 off) while it lasts, as the evaluator's reference."""

    def __enter__(self):
        self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved


def _problem_forward(model, inputs):
    """The problem's own forward (not the kernel) of ModelNew `model` (a
    torch.compile wrapper's module too), eagerly, in the current grad mode."""
    base = _base(model)
    base._ks_reference_forward = True
    try:
        return _outputs(base(*inputs))
    finally:
        del base._ks_reference_forward  # the class's False again, as torch.compile's guards last saw it


def _reference(model, inputs):
    """The problem's own forward on the same module (same weights), in full
    float32 as the evaluator's reference (TF32 off)."""
    with _Float32(), torch.no_grad():
        return _problem_forward(model, inputs)


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def _float64_model(model):
    """A float64 copy of ModelNew `model`, or None where it cannot be made."""
    import copy
    try:
        return copy.deepcopy(_base(model)).double()
    except Exception:  # noqa: BLE001
        return None


def _float64_reference(model, inputs):
    """The problem's own forward on a float64 copy of the module and inputs
    (the truth the evaluator judges against), or None where float64 fails."""
    try:
        model64 = _float64_model(model)
        inputs64 = tuple(v.double() if isinstance(v, torch.Tensor) and v.dtype in _FLOATS else v for v in inputs)
        with torch.no_grad():
            return _problem_forward(model64, inputs64)
    except Exception:  # noqa: BLE001 - an op without float64: judged against float32, as the evaluator does
        return None


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


def _judge(name, dtype, got, ref32, truth):
    """compare()'s figures for one tensor by check()'s rule: against the
    float64 truth with PyTorch's own float32 error per block, or against
    PyTorch's float32 where there is no truth."""
    if truth is not None and got.is_floating_point() and truth.shape == ref32.shape:
        own = compare(ref32, truth, dtype)  # PyTorch's own float32 against float64
        figures = compare(got, truth, dtype, SIGNATURE.get("tolerance"), bound=_block_bound(ref32, truth),
                          contract=JUDGE["contract"], own_rel_norm=own["rel_norm"])
    else:
        figures = compare(got, ref32, dtype, SIGNATURE.get("tolerance"), contract=JUDGE["contract"])
    figures["name"] = name
    return figures


def check(model, *inputs):
    """Verifies the exported kernel on your own inputs (any shapes its plan
    allows, your data) by the rule it was judged by (JUDGE): ModelNew `model`
    (or torch.compile of it) against the problem's Model forward run in
    float64 on the same module, output by output (compare()), allowing per
    block of elements the contract's factor times PyTorch's own float32 error
    there; against PyTorch's float32 output where float64 is not supported.
    Returns {"ok": bool, "truth": "float64" | "float32", "contract",
    "outputs": [compare()'s figures with "name"]}; a wrong answer is
    reported, not raised."""
    with torch.no_grad():
        got = _outputs(model(*inputs))
    ref = _reference(model, inputs)
    truth = _float64_reference(model, inputs)
    outputs = []
    for i, (spec, o, r) in enumerate(zip(SIGNATURE["outputs"], got, ref)):
        t = truth[i] if truth is not None and i < len(truth) else None
        outputs.append(_judge(spec["name"], spec["dtype"], o, r, t))
    return {"ok": len(got) == len(ref) and all(f["ok"] for f in outputs),
            "truth": "float64" if truth is not None else "float32", "contract": JUDGE["contract"],
            "outputs": outputs}


_DTYPE_NAMES = {v: k for k, v in _DTYPES.items()}


def _leaf(v):
    """A floating-point tensor input as a fresh leaf that requires grad; anything else as it is."""
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.detach().clone().requires_grad_()
    return v


def _trainable(model):
    """(state_dict name, parameter) for each parameter of `model` that requires grad."""
    out = []
    for spec, path in zip(SIGNATURE["parameters"], _STATE_PATHS):
        p = _member(model, path)
        if isinstance(p, torch.nn.Parameter) and p.requires_grad:
            out.append((spec["name"], p))
    return out


def _gradients(outs, grads_out, leaves):
    """d(sum of outs * grads_out) / d(leaves); zeros where a leaf is unused."""
    pairs = [(o, g) for o, g in zip(outs, grads_out) if g is not None and o.requires_grad]
    got = (torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
           if pairs and leaves else [None] * len(leaves))
    return [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(got, leaves)]


def _seeded_normal(outs, only_differentiable=False):
    """Seeded normal values shaped as each floating-point output (None for the
    others, and with `only_differentiable` for outputs without a gradient),
    drawn from a generator of their own: the caller's random state is left as
    it was, and no draw touches the device's default generator, which a CUDA
    graph capture (torch.cuda.graph, mode="reduce-overhead") registers."""
    gens = {}
    grads = []
    for o in outs:
        if not isinstance(o, torch.Tensor) or not o.is_floating_point() or (
                only_differentiable and not o.requires_grad):
            grads.append(None)
            continue
        gen = gens.get(o.device)
        if gen is None:
            gen = gens[o.device] = torch.Generator(device=o.device)
            gen.manual_seed(0)
        grads.append(torch.randn(o.shape, generator=gen, device=o.device, dtype=o.dtype))
    return grads


def _training_grads(model, forward, inputs, grads_out=None):
    """One training step's gradients: `forward` on fresh leaves of `inputs`,
    then backward with `grads_out` (seeded normal values when None). Returns
    (input names, gradients of the floating inputs then of `model`'s trainable
    parameters, grads_out)."""
    leaves_in = [_leaf(v) for v in inputs]
    params = _trainable(model)
    with torch.enable_grad():
        outs = _outputs(forward(leaves_in))
        if grads_out is None:
            grads_out = _seeded_normal(outs)
        grads_out = [g.to(o.dtype) if g is not None else None for g, o in zip(grads_out, outs)]
        leaves = [v for v in leaves_in if isinstance(v, torch.Tensor) and v.requires_grad] + [p for _, p in params]
        grads = _gradients(outs, grads_out, leaves)
    names = [spec["name"] for spec, v in zip(SIGNATURE["inputs"], leaves_in)
             if isinstance(v, torch.Tensor) and v.requires_grad] + [n for n, _ in params]
    return names, grads, grads_out


def check_backward(model, *inputs):
    """Verifies a training step on your inputs by check()'s rule: the
    gradients of ModelNew `model` (or torch.compile of it) for every
    floating-point input and every parameter that requires grad, with seeded
    normal gradients arriving at the outputs, against the problem's Model's
    float64 gradients on the same module (PyTorch's own float32 error per
    block allowed by the contract's factor), or its float32 ones where float64
    is not supported. Returns {"ok", "truth", "contract", "gradients":
    [compare()'s figures with "name"]}, with "why" where ModelNew has no
    backward (no custom operator: OP_NOTE)."""
    if OP is None:
        return {"ok": False, "truth": None, "contract": JUDGE["contract"], "gradients": [], "why": OP_NOTE}
    base = _base(model)
    names, got, grads_out = _training_grads(base, lambda leaves: model(*leaves), inputs)
    with _Float32():
        _, ref, _ = _training_grads(base, lambda leaves: _problem_forward(base, leaves), inputs, grads_out)
    truth = None
    model64 = _float64_model(base)
    if model64 is not None:
        try:
            inputs64 = [v.double() if isinstance(v, torch.Tensor) and v.dtype in _FLOATS else v for v in inputs]
            _, truth, _ = _training_grads(model64, lambda leaves: _problem_forward(model64, leaves), inputs64,
                                          [g.double() if g is not None else None for g in grads_out])
        except Exception:  # noqa: BLE001 - an op without float64: judged against float32
            truth = None
    gradients = [_judge(name, _DTYPE_NAMES.get(g.dtype, "float32"), g, r, truth[i] if truth is not None else None)
                 for i, (name, g, r) in enumerate(zip(names, got, ref))]
    return {"ok": all(f["ok"] for f in gradients), "truth": "float64" if truth is not None else "float32",
            "contract": JUDGE["contract"], "gradients": gradients}


def _mark_step():
    """Tells CUDA graph trees (torch.compile mode="reduce-overhead") that a new
    step begins, so that a call never reads outputs a later replay overwrote;
    nothing for any other model, or on a torch without it."""
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if mark is not None:
        mark()


def benchmark(model, *inputs, runs=50, warmup=5, train=True):
    """Times ModelNew `model` (or torch.compile of it) and PyTorch eager (the
    problem's Model forward on the same module, PyTorch's default settings)
    on your inputs with CUDA events, medians in ms: the forward ("kernel_ms",
    "eager_ms", "speedup") and, with `train`, a training step ("train_kernel_ms",
    "train_eager_ms", "train_speedup"): forward, then backward into every
    floating-point input (as a layer inside a network sees them) and every
    parameter that requires grad; None where nothing is differentiable.
    Parameters' .grad are restored afterwards. Each call is a step of its own
    for a model compiled with mode="reduce-overhead" (CUDA graph trees), and
    nothing random is drawn while timing."""
    def median_ms(fn):
        for _ in range(warmup):
            _mark_step()
            fn()
        times = []
        for _ in range(runs):
            _mark_step()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        times.sort()
        return times[len(times) // 2]

    base = _base(model)
    with torch.no_grad():
        kernel_ms = median_ms(lambda: model(*inputs))
        eager_ms = median_ms(lambda: _problem_forward(base, inputs))
    result = {"kernel_ms": kernel_ms, "eager_ms": eager_ms, "speedup": eager_ms / kernel_ms if kernel_ms > 0 else None,
              "train_kernel_ms": None, "train_eager_ms": None, "train_speedup": None, "runs": runs}
    if not train:
        return result
    leaves_in = [_leaf(v) for v in inputs]
    params = [p for _, p in _trainable(base)]
    leaves = [v for v in leaves_in if isinstance(v, torch.Tensor) and v.requires_grad] + params
    if not leaves:
        return result
    _mark_step()
    with torch.enable_grad():
        grads_out = _seeded_normal(_outputs(model(*leaves_in)), only_differentiable=True)
    if all(g is None for g in grads_out):
        return result

    def step(forward):
        def run():
            pairs = [(o, g) for o, g in zip(_outputs(forward()), grads_out) if g is not None]
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            for leaf in leaves:
                leaf.grad = None
        return run

    saved = [p.grad for p in params]
    try:
        with torch.enable_grad():
            train_kernel = median_ms(step(lambda: model(*leaves_in)))
            train_eager = median_ms(step(lambda: _problem_forward(base, leaves_in)))
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    result.update(train_kernel_ms=train_kernel, train_eager_ms=train_eager,
                  train_speedup=train_eager / train_kernel if train_kernel > 0 else None)
    return result
