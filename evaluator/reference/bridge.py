#!/usr/bin/env python3
"""The reference bridge: trusted Python that turns a problem file into data.

A problem file is in the KernelBench format (DESIGN.md, contract 1):
`class Model(torch.nn.Module)`, `get_inputs()`, `get_init_inputs()`, and the
optional module-level names TOLERANCE, FLOPS and DESCRIPTION.

Subcommands (each prints exactly one JSON object on stdout; anything the
problem prints goes to stderr so it cannot corrupt that object):

  signature PROBLEM.py [--device D]
      the signature (names, dtypes, shapes) that SignatureFromJson in
      evaluator/signature.cc reads.
  reference PROBLEM.py --out DIR --sets K --seed S [--device D] [--time]
      reference inputs, parameters and outputs as raw little-endian bytes, and
      DIR/manifest.json (written last, atomically); prints the manifest.
  reference PROBLEM.py --resident --sets K --seed S --device cuda [--time]
      the same data kept on the GPU in this process, not written anywhere: the
      manifest's sets name each tensor's CUDA IPC handle, offset and size, for
      the evaluator to map (a multi-GB problem needs no disk and no copy
      through the host). After printing the manifest the bridge holds the
      tensors until its stdin is closed, then exits. With
      --resident-min-bytes N, a problem whose sets hold fewer bytes is not
      kept: the answer is {"resident": false, "signature": ...}.
  reference PROBLEM.py [--resident ...] --then-files --sets K --seed S [--device D]
      one process for a reference that goes to files: after shape inference
      the bridge prints {"resident": false, "signature": ...} (unless it
      keeps the problem on the GPU, as above), reads one line
      {"out": DIR, "sets": K, "time": bool} from stdin (the caller has sized
      and made room for the cache entry meanwhile), writes DIR as
      reference --out does and prints the manifest. EOF instead of the line
      ends it quietly.
      With --time and --device cuda, torch.compile's timing is done by a
      helper started at once (time-compiled, below).
  time-compiled PROBLEM.py --seed S --sets K --device cuda
      the helper of CompileHelper: compiles torch.compile(model) while the
      reference is computed, prints {"compiled": true}, waits for a line on
      stdin, then times the compiled model (timing.py) and prints the figures.
  check PROBLEM.py [--sets K] [--seed S] [--device D]
      {"warnings": [...]}: outputs that would let a wrong kernel pass.
  peaks [--index I] [--n N] [--runs R]
      measured dense-matmul TFLOP/s of CUDA device I per compute class
      (fp32, tf32, bf16, fp16; see peaks.py); needs a GPU.

A bad problem file prints {"error": {"kind", "message", "detail"}} and exits
with status 2. Runs on torch 1.13 (CPU) and torch 2.x (GPU).
"""

import argparse
import errno
import hashlib
import inspect
import json
import math
import numbers
import os
import random
import sys
import traceback

EXIT_BAD_PROBLEM = 2
EXIT_INTERNAL = 3

SUPPORTED_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool")

# Per-dtype defaults, the same as Signature::ToleranceFor in evaluator/signature.cc:
# the degenerate check asks "would a wrong kernel pass?", so it must use the
# tolerance the evaluator will use.
# atol/rtol are element-wise; rel_norm, large_rel and large_share bound the
# relative norm of the error and the share of large relative errors (see
# Tolerance in evaluator/signature.h). Absent keys take the evaluator's rule.
TOLERANCE_KEYS = ("atol", "rtol", "rel_norm", "large_rel", "large_share")

DEFAULT_TOLERANCE = {
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
    "float64": (1e-8, 1e-6),
    "float32": (1e-4, 1e-4),
}

# PyTorch's own rounding error (the reference in float32 against the same model
# run in float64, input set 0) widens a float32 output's tolerance: a candidate
# may be at most ROUNDING_FACTOR times as inaccurate as PyTorch itself (a sum
# over 8192 cancelling terms differs by ~1e-4 between two honest summation
# orders). Beyond MAX_ROUNDING_REL_NORM the float64 run is not measuring
# rounding (a data-dependent branch, a problem that needs its own TOLERANCE)
# and nothing is widened. The same constants and rule as
# Signature::ToleranceFor(const TensorSpec&) in evaluator/signature.cc.
ROUNDING_FACTOR = 16.0
MAX_ROUNDING_REL_NORM = 1e-3
# The float64 run is skipped when it would take longer than this (seconds;
# $KS_FP64_CHECK_MAX_S): a first evaluation has a budget of its own.
FP64_CHECK_MAX_S = 3.0

# Reductions over huge outputs go chunk by chunk so that a 4 GiB output does
# not need 4 GiB of temporaries on top of itself.
CHUNK_ELEMENTS = 1 << 24


class BridgeError(Exception):
    """A problem-file defect, reported to the caller as {"error": ...}."""

    def __init__(self, kind, message, detail=""):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.detail = detail


def _traceback_tail(exc, max_lines=12, max_chars=2000):
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    tail = "\n".join(lines[-max_lines:])
    return tail[-max_chars:]


def _first_line(exc, limit=500):
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return line[:limit]


class Problem:
    """A loaded problem module and where it came from."""

    def __init__(self, path):
        self.path = path                    # as given: messages name the file this way
        self.abspath = os.path.abspath(path)
        self.name = os.path.splitext(os.path.basename(path))[0]
        self.module = None
        # Which of get_inputs_variants()'s input lists inputs() returns (other
        # shapes, issue 27); None: get_inputs() itself.
        self.variant = None

    # -- errors -------------------------------------------------------------------

    def _line_in_file(self, exc):
        """(line, function) of the innermost frame inside the problem file, or None."""
        found = None
        for frame in traceback.extract_tb(exc.__traceback__):
            if os.path.abspath(frame.filename) == self.abspath:
                found = (frame.lineno, frame.name)
        return found

    def error(self, kind, stage, exc):
        """A BridgeError for exception `exc` raised while doing `stage`."""
        where = self._line_in_file(exc)
        prefix = "%s: line %d: " % (self.path, where[0]) if where else "%s: " % self.path
        msg = "%s%s raised %s: %s" % (prefix, stage, type(exc).__name__, _first_line(exc))
        return BridgeError(kind, msg, _traceback_tail(exc))

    def fail(self, kind, text):
        return BridgeError(kind, "%s: %s" % (self.path, text))

    # -- loading ------------------------------------------------------------------

    def load(self):
        if not os.path.exists(self.path):
            raise self.fail("file_not_found", "no such file")
        if os.path.isdir(self.path):
            raise self.fail("file_not_found", "is a directory, not a problem file")
        try:
            with open(self.path, "rb") as f:
                source = f.read()
        except OSError as e:
            raise self.fail("file_not_found", "cannot read: %s" % e.strerror)
        try:
            code = compile(source, self.abspath, "exec")
        except SyntaxError as e:
            line = "line %d: " % e.lineno if e.lineno else ""
            detail = (e.text or "").rstrip()
            raise BridgeError("syntax_error", "%s: %s%s" % (self.path, line, e.msg), detail)
        except ValueError as e:  # e.g. null bytes in the source
            raise self.fail("syntax_error", str(e))

        import types
        mod_name = "ks_problem_" + "".join(c if c.isalnum() else "_" for c in self.name)
        module = types.ModuleType(mod_name)
        module.__file__ = self.abspath
        sys.modules[mod_name] = module  # dataclasses and pickling look modules up here
        # Problems may import helpers that sit beside them.
        sys.path.insert(0, os.path.dirname(self.abspath))
        try:
            exec(code, module.__dict__)
        except ImportError as e:
            raise self.error("import_error", "loading the module", e)
        except Exception as e:  # noqa: BLE001 - any failure of user code is a report
            raise self.error("load_error", "loading the module", e)
        self.module = module

        import torch
        model_cls = getattr(module, "Model", None)
        if model_cls is None:
            raise self.fail("no_model", "defines no 'Model' class (expected class Model(torch.nn.Module))")
        if not (inspect.isclass(model_cls) and issubclass(model_cls, torch.nn.Module)):
            raise self.fail("no_model", "'Model' is not a subclass of torch.nn.Module")
        if not callable(getattr(module, "get_inputs", None)):
            raise self.fail("no_get_inputs", "defines no get_inputs() function")
        init = getattr(module, "get_init_inputs", None)
        if init is not None and not callable(init):
            raise self.fail("bad_metadata", "get_init_inputs is not a function")
        self._check_metadata()
        return self

    def _check_metadata(self):
        m = self.module
        tol = getattr(m, "TOLERANCE", None)
        if tol is not None:
            ok = isinstance(tol, dict) and set(tol) <= set(TOLERANCE_KEYS) and tol and all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                for v in tol.values())
            if not ok:
                raise self.fail("bad_metadata", "TOLERANCE must be a dict like {'atol': 1e-4, 'rtol': 1e-4} "
                                "with non-negative numbers (keys: %s), got %r" % (", ".join(TOLERANCE_KEYS), tol))
        flops = getattr(m, "FLOPS", None)
        if flops is not None and (isinstance(flops, bool) or not isinstance(flops, numbers.Real)
                                  or not math.isfinite(flops) or flops < 0):
            raise self.fail("bad_metadata", "FLOPS must be a non-negative number, got %r" % (flops,))
        desc = getattr(m, "DESCRIPTION", None)
        if desc is not None and not isinstance(desc, str):
            raise self.fail("bad_metadata", "DESCRIPTION must be a string, got %s" % type(desc).__name__)
        variants = getattr(m, "get_inputs_variants", None)
        if variants is not None and not callable(variants):
            raise self.fail("bad_metadata", "get_inputs_variants is not a function (it returns a list of input lists, "
                            "each like get_inputs()'s at other shapes)")
        for what in ("INPUT_TRANSFORMS", "PARAMETER_TRANSFORMS"):
            if getattr(m, what, None) is not None:
                import transforms
                why = transforms.check_metadata(getattr(m, what), what)
                if why:
                    raise self.fail("bad_metadata", why)

    @property
    def tolerance(self):
        tol = getattr(self.module, "TOLERANCE", None)
        if tol is None:
            return None
        out = {k: float(v) for k, v in tol.items()}  # checked by _check_metadata
        out.setdefault("atol", 0.0)
        out.setdefault("rtol", 0.0)
        return out

    @property
    def flops(self):
        flops = getattr(self.module, "FLOPS", None)
        if flops is None:
            return None
        return int(flops) if float(flops).is_integer() else float(flops)

    @property
    def description(self):
        return getattr(self.module, "DESCRIPTION", None) or ""

    # -- running user code --------------------------------------------------------

    def init_inputs(self):
        fn = getattr(self.module, "get_init_inputs", None)
        if fn is None:
            return []
        try:
            args = fn()
        except Exception as e:  # noqa: BLE001
            raise self.error("init_error", "get_init_inputs()", e)
        if not isinstance(args, (list, tuple)):
            raise self.fail("init_error", "get_init_inputs() must return a list, got %s" % type(args).__name__)
        return list(args)

    def build_model(self, seed, device):
        import contextlib
        import torch
        _seed_everything(seed)
        args = self.init_inputs()
        # Weights are drawn where they will live, as inputs are (_creating_on):
        # a 4 GiB nn.Linear initialises in milliseconds on a GPU, in seconds on
        # the CPU. A constructor that cannot run there (it calls .numpy() on a
        # tensor, say) is built on the CPU, from the same seed, and moved.
        where = _creating_on(device)
        try:
            with where:
                model = self.module.Model(*args)
        except Exception as e:  # noqa: BLE001
            if isinstance(where, contextlib.nullcontext):
                raise self.error("init_error", "Model(*get_init_inputs())", e)
            model = None
        if model is None:
            _seed_everything(seed)
            args = self.init_inputs()
            try:
                model = self.module.Model(*args)
            except Exception as e:  # noqa: BLE001
                raise self.error("init_error", "Model(*get_init_inputs())", e)
        if device is not None:
            try:
                model = model.to(device)
            except Exception as e:  # noqa: BLE001
                raise self.error("device_error", "moving Model to %s" % device, e)
        if not isinstance(model, torch.nn.Module):
            raise self.fail("no_model", "Model(...).to() did not return a module")
        return model

    def variant_count(self):
        """How many input lists get_inputs_variants() returns (0 without it),
        counted on the meta device where it can be: nothing is allocated."""
        fn = getattr(self.module, "get_inputs_variants", None)
        if fn is None:
            return 0
        try:
            with _meta_mode_class()():
                values = fn()
        except Exception:  # noqa: BLE001 - counted for real below, errors reported there
            try:
                values = fn()
            except Exception as e:  # noqa: BLE001
                raise self.error("get_inputs_error", "get_inputs_variants()", e)
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, (list, tuple)) for v in values):
            raise self.fail("bad_inputs", "get_inputs_variants() must return a list of input lists (each like "
                            "get_inputs()'s), got %s" % type(values).__name__)
        return len(values)

    def inputs(self, seed, device):
        import torch
        _seed_everything(seed)
        what = "get_inputs()" if self.variant is None else "get_inputs_variants()"
        try:
            with _creating_on(device):
                if self.variant is None:
                    values = self.module.get_inputs()
                else:
                    variants = self.module.get_inputs_variants()
                    values = variants[self.variant] if isinstance(variants, (list, tuple)) and \
                        len(variants) > self.variant else None
        except Exception as e:  # noqa: BLE001
            raise self.error("get_inputs_error", what, e)
        if values is None:
            raise self.fail("bad_inputs", "get_inputs_variants() has no input list %d" % self.variant)
        if not isinstance(values, (list, tuple)):
            raise self.fail("bad_inputs", "get_inputs() must return a list, got %s" % type(values).__name__)
        out = []
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                if device is not None and v.device != device:
                    try:
                        v = v.to(device)
                    except Exception as e:  # noqa: BLE001
                        raise self.error("device_error", "moving input %d to %s" % (i, device), e)
                out.append(v)
            elif isinstance(v, (bool, numbers.Integral, numbers.Real)):
                out.append(v)
            else:
                raise self.fail("bad_inputs", "get_inputs() item %d is a %s; only tensors, ints, floats and "
                                "bools are supported" % (i, type(v).__name__))
        return out

    def forward(self, model, inputs):
        import torch
        try:
            with torch.no_grad():
                result = model(*inputs)
            if any(isinstance(t, torch.Tensor) and t.is_cuda for t in _as_list(result)):
                torch.cuda.synchronize()  # surface asynchronous CUDA errors here, inside the try
        except Exception as e:  # noqa: BLE001
            raise self.error("forward_error", "forward()", e)
        return self._outputs(result)

    def _outputs(self, result):
        import torch
        if isinstance(result, torch.Tensor):
            return [("out", result)]
        if isinstance(result, (list, tuple)):
            if not result:
                raise self.fail("bad_output", "forward() returned an empty %s" % type(result).__name__)
            outs = []
            for i, t in enumerate(result):
                if not isinstance(t, torch.Tensor):
                    raise self.fail("bad_output", "forward() output %d is a %s; outputs must be tensors"
                                    % (i, type(t).__name__))
                outs.append(("out%d" % i, t))
            return outs
        raise self.fail("bad_output", "forward() returned a %s; it must return a tensor or a tuple of tensors"
                        % type(result).__name__)

    def input_names(self, model, count):
        """forward's parameter names for `count` positional arguments."""
        try:
            params = list(inspect.signature(model.forward).parameters.values())
        except (TypeError, ValueError):
            return ["in%d" % i for i in range(count)]
        names, var = [], None
        for p in params:
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
                names.append(p.name)
            elif p.kind == p.VAR_POSITIONAL:
                var = p.name
                break
        if count > len(names):
            if var is None:
                raise self.fail("bad_inputs", "get_inputs() returns %d values but forward() takes %d (%s)"
                                % (count, len(names), ", ".join(names)))
            names += ["%s%d" % (var, i) for i in range(count - len(names))]
        return names[:count]


def _creating_on(device):
    """Where get_inputs() and Model() create their tensors: on a GPU with torch >= 2, on the
    GPU itself (torch.device as a context manager), so that gigabytes of
    torch.rand are drawn there in milliseconds instead of on the CPU in tens of
    seconds and then copied. Elsewhere (CPU, torch 1.13): where the problem puts
    them, moved afterwards."""
    import contextlib
    import torch
    if device is not None and device.type == "cuda" and hasattr(torch.device, "__enter__"):
        return device
    return contextlib.nullcontext()


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _seed_everything(seed):
    import torch
    torch.manual_seed(seed)  # CPU and every CUDA device
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed % (1 << 32))
    except ImportError:
        pass


def _dtype_name(t):
    import torch
    names = {
        torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
        torch.float64: "float64", torch.int32: "int32", torch.int64: "int64",
        torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool",
    }
    return names.get(t.dtype)


def _contiguous_strides(shape):
    strides, s = [], 1
    for d in reversed(shape):
        strides.append(s)
        s *= d
    return list(reversed(strides))


def tensor_spec(problem, role, name, t):
    dtype = _dtype_name(t)
    if dtype is None:
        raise problem.fail("unsupported_dtype", "%s '%s' has dtype %s, which kernelsearch does not support "
                           "(supported: %s)" % (role, name, str(t.dtype).replace("torch.", ""),
                                                 ", ".join(SUPPORTED_DTYPES)))
    shape = [int(d) for d in t.shape]
    # Data is always written contiguously, so the strides are the contiguous ones.
    return {"name": name, "dtype": dtype, "kind": "tensor", "shape": shape, "strides": _contiguous_strides(shape)}


def scalar_spec(problem, name, v):
    if isinstance(v, bool):
        return {"name": name, "dtype": "bool", "kind": "scalar", "value": int(v)}
    if isinstance(v, numbers.Integral):
        return {"name": name, "dtype": "int64", "kind": "scalar", "value": int(v)}
    f = float(v)
    if not math.isfinite(f):
        raise problem.fail("bad_inputs", "scalar input '%s' is %r; scalars must be finite" % (name, f))
    return {"name": name, "dtype": "float64", "kind": "scalar", "value": f}


def input_specs(problem, model, inputs):
    import torch
    names = problem.input_names(model, len(inputs))
    return [tensor_spec(problem, "input", n, v) if isinstance(v, torch.Tensor) else scalar_spec(problem, n, v)
            for n, v in zip(names, inputs)]


def parameter_specs(problem, model):
    return [tensor_spec(problem, "parameter", k, v) for k, v in model.state_dict().items()]


def output_specs(problem, outputs):
    return [tensor_spec(problem, "output", n, t) for n, t in outputs]


def make_signature(problem, inputs, params, outputs):
    sig = {
        "file": problem.path,
        "name": problem.name,
        "description": problem.description,
        "tolerance": problem.tolerance,
        "flops": problem.flops,
        "inputs": inputs,
        "parameters": params,
        "outputs": outputs,
    }
    names = {}
    for group in ("inputs", "parameters", "outputs"):
        for e in sig[group]:
            if e["name"] in names:
                raise problem.fail("name_collision", "the name '%s' is used by both %s and %s; every input, "
                                   "parameter and output needs its own name" % (e["name"], names[e["name"]], group))
            names[e["name"]] = group
    return sig


def resolve_device(problem, requested):
    import torch
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise BridgeError("device_error", "%s: --device cuda was asked for but torch %s sees no CUDA device"
                          % (problem.path, torch.__version__))
    return torch.device(requested)


# -- signature -----------------------------------------------------------------------

# torch functions that create a tensor and take `device=`: while shapes are
# inferred they are sent to the "meta" device, so building the model and calling
# get_inputs() allocate nothing. (`torch.device` as a context manager does this
# on torch >= 2; a TorchFunctionMode does it on 1.13 as well.)
_FACTORIES = frozenset((
    "rand", "randn", "randint", "randperm", "empty", "empty_strided", "zeros", "ones", "full", "arange",
    "linspace", "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "normal", "bernoulli",
    "rand_like", "randn_like", "randint_like", "zeros_like", "ones_like", "empty_like", "full_like",
))


def _meta_mode_class():
    """A TorchFunctionMode that keeps everything on the meta device."""
    import torch
    from torch.overrides import TorchFunctionMode

    meta = torch.device("meta")

    def on_meta(x):
        return isinstance(x, torch.Tensor) and x.device == meta

    class MetaMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            name = getattr(func, "__name__", "")
            if name in _FACTORIES and getattr(torch, name, None) is func:
                kwargs["device"] = meta
                kwargs.pop("generator", None)  # a CPU generator cannot draw on meta
            elif name in ("cuda", "cpu") and args and on_meta(args[0]):
                return args[0]  # problems that place their tensors explicitly
            elif name == "to" and args and on_meta(args[0]):
                # Keep a dtype change, drop a device change: x.to("cuda"), x.to(device, dtype).
                kwargs.pop("device", None)
                rest = [a for a in args[1:] if not isinstance(a, (str, torch.device))]
                if not rest and not kwargs:
                    return args[0]
                args = (args[0],) + tuple(rest)
            return func(*args, **kwargs)

    return MetaMode


def _pool_out(size, k, s, p, d, ceil):
    """PyTorch's pooling output length (ATen pooling_output_shape)."""
    num = size + 2 * p - d * (k - 1) - 1 + ((s - 1) if ceil else 0)
    out = num // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


_META_KERNELS_ADDED = []


def _add_missing_meta_kernels():
    """Meta kernels for the few ops KernelBench uses that torch 1.13 lacks one for.

    Registered only where the op really fails on meta (a newer torch has its
    own), and only for the shape: nothing here ever computes a value.
    """
    import torch
    if _META_KERNELS_ADDED:
        return
    _META_KERNELS_ADDED.append(True)
    try:
        torch.nn.functional.max_pool3d(torch.empty(1, 1, 2, 2, 2, device="meta"), 2)
        return
    except NotImplementedError:
        pass
    except Exception:  # noqa: BLE001 - a torch that fails differently: leave it to the real run
        return

    def triple(v, default):
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        if not v:
            v = list(default)
        return v * 3 if len(v) == 1 else v

    def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        k = triple(kernel_size, ())
        s = triple(stride, k)
        p = triple(padding, ())
        d = triple(dilation, ())
        spatial = [_pool_out(x.shape[-3 + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(3)]
        shape = list(x.shape[:-3]) + spatial
        return (torch.empty(shape, dtype=x.dtype, device="meta"), torch.empty(shape, dtype=torch.int64, device="meta"))

    lib = torch.library.Library("aten", "IMPL", "Meta")
    lib.impl("max_pool3d_with_indices", max_pool3d_with_indices)
    _META_KERNELS_ADDED.append(lib)  # the registration lives as long as the library object


def _signature_on_meta(problem, seed):
    """Shapes and dtypes without computing anything (the "meta" device).

    Returns None when shape inference fails for this problem (an op without a
    meta kernel, .item() or another data-dependent shape, a non-tensor
    result): the caller then runs the forward for real.
    """
    import torch
    if os.environ.get("KS_BRIDGE_NO_META"):
        return None
    try:
        _add_missing_meta_kernels()
        with _meta_mode_class()():
            model = problem.build_model(seed, None)
            inputs = problem.inputs(seed + 1, None)
            with torch.no_grad():
                result = model(*inputs)
        meta = torch.device("meta")
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)] + list(model.state_dict().values())
        if any(t.device != meta for t in tensors):
            return None
        if any(isinstance(t, torch.Tensor) and t.device != meta for t in _as_list(result)):
            return None
        problem._outputs(result)  # a bad result is reported by the real run, with its line
    except Exception:  # noqa: BLE001 - any failure on meta means "run it for real"
        return None
    return model, inputs, result


# -- FLOPs (the compute floor) -------------------------------------------------------

# Op names that do matrix work: one of these without a FLOP formula makes the
# count an undercount, and the figure says so.
_MATRIX_OP_WORDS = ("mm", "conv", "attention", "linear", "matmul", "dot", "einsum")

# The dtype of an op's operands -> the compute class whose measured peak
# (peaks.py) bounds it. Classes without a measured peak get no compute floor.
_FLOP_CLASS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


def _attention_flops(q, k, v):
    """QK^T and PV of scaled-dot-product attention, 2 FLOPs per multiply-add
    (torch's own sdpa formula); q, k, v are shapes [..., s, d]."""
    batch = 1
    for d in q[:-2]:
        batch *= int(d)
    s_q, d_q, s_k, d_v = int(q[-2]), int(q[-1]), int(k[-2]), int(v[-1])
    return 2 * batch * s_q * s_k * (d_q + d_v)


def _flop_counter_class():
    """A FlopCounterMode that also books each op's FLOPs under its operands'
    dtype (the compute class), and names matrix ops it has no formula for.
    None where torch has no torch.utils.flop_counter (torch < 2.1)."""
    import torch
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None

    class DtypeFlopCounter(FlopCounterMode):
        def __init__(self):
            mapping = {}
            # The CPU's fused attention has no formula in some torch versions.
            cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
            if cpu_sdpa is not None:
                # FlopCounterMode hands a custom formula shapes, not tensors.
                mapping[cpu_sdpa] = lambda q, k, v, *a, out_shape=None, **kw: _attention_flops(q, k, v)
            super().__init__(display=False, custom_mapping=mapping)
            self.by_dtype = {}
            self.uncounted = set()
            self.paused = False  # inside an op counted as a whole (attention, below)

        def add(self, dtype, n):
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + int(n)

        def _count_flops(self, func_packet, out, args, kwargs):
            if self.paused:
                return out
            name = str(getattr(func_packet, "__name__", func_packet))
            if func_packet in self.flop_registry:
                n = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
                dtype = next((_dtype_name(a) or str(a.dtype) for a in args if isinstance(a, torch.Tensor)), "unknown")
                self.add(dtype, n)
            elif any(w in name for w in _MATRIX_OP_WORDS):
                self.uncounted.add(name)
            return super()._count_flops(func_packet, out, args, kwargs)

    return DtypeFlopCounter


def _attention_mode_class():
    """A TorchFunctionMode that counts scaled-dot-product attention as a whole,
    in its operands' dtype. Off a GPU (the meta device) torch runs attention as
    its math fallback, which computes half-precision attention in float32: the
    counter would see fp32 matmuls and book the work in the wrong class."""
    import torch
    from torch.overrides import TorchFunctionMode
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)

    class AttentionMode(TorchFunctionMode):
        def __init__(self, counter):
            super().__init__()
            self.counter = counter

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if sdpa is None or func is not sdpa or self.counter.paused:
                return func(*args, **kwargs)
            qkv = list(args[:3]) + [kwargs.get(n) for n in ("query", "key", "value")[len(args[:3]):]]
            q, k, v = qkv
            self.counter.add(_dtype_name(q) or str(q.dtype), _attention_flops(q.shape, k.shape, v.shape))
            self.counter.paused = True
            try:
                return func(*args, **kwargs)
            finally:
                self.counter.paused = False

    return AttentionMode


def count_flops(problem, seed):
    """The problem's FLOPs, for the compute floor: the keys merged into the signature.

    {"flops": N or None, "flops_source": "FLOPS" | "counted" | None,
     "flops_by_class": {"fp32": N, ...} (counted only), "flops_note": "..."}.
    Counted with torch's own FLOP counter (matmul, convolution, attention; 2
    FLOPs per multiply-add) over one forward on the meta device, so nothing is
    computed and nothing allocated. A FLOPS in the problem file overrides the
    count. Where counting is not possible the note says why, and the evaluator's
    floor is then the memory floor alone.
    """
    import torch
    declared = problem.flops
    counter_cls = _flop_counter_class()
    result = {"flops": declared, "flops_source": "FLOPS" if declared is not None else None,
              "flops_by_class": {}, "flops_note": ""}
    if counter_cls is None:
        why = "torch %s has no torch.utils.flop_counter (it needs torch >= 2.1)" % torch.__version__
        if declared is None:
            result["flops_note"] = "FLOPs not counted: " + why
        return result
    try:
        _add_missing_meta_kernels()
        with _meta_mode_class()():
            model = problem.build_model(seed, None)
            inputs = problem.inputs(seed + 1, None)
            counter = counter_cls()
            with torch.no_grad(), counter, _attention_mode_class()(counter):
                model(*inputs)
    except Exception as e:  # noqa: BLE001 - the problem still runs; only its FLOPs are unknown
        if declared is None:
            result["flops_note"] = ("FLOPs not counted: the forward does not run on the meta device (%s: %s)"
                                    % (type(e).__name__, _first_line(e, 200)))
        return result
    by_class, notes = {}, []
    for dtype, n in sorted(counter.by_dtype.items()):
        cls = _FLOP_CLASS.get(dtype)
        if cls is None:
            notes.append("%d FLOPs on %s operands have no compute class" % (n, dtype))
            cls = dtype
        by_class[cls] = by_class.get(cls, 0) + n
    if counter.uncounted:
        notes.append("no FLOP formula for %s: the count leaves their work out" % ", ".join(sorted(counter.uncounted)))
    counted = sum(by_class.values())
    if declared is None:
        result.update(flops=counted, flops_source="counted", flops_by_class=by_class)
    else:
        # The file's figure wins; the count is kept as a cross-check and for
        # the dtype split (scaled to the declared total).
        if counted > 0:
            result["flops_by_class"] = {k: declared * v / counted for k, v in by_class.items()}
        notes.insert(0, "FLOPS from the problem file (counted: %d)" % counted)
    result["flops_note"] = "; ".join(notes)
    return result


def cmd_signature(problem, args):
    meta = _signature_on_meta(problem, args.seed)
    if meta is not None:
        model, inputs, result = meta
        outputs = problem._outputs(result)
        how = "meta"
    else:
        device = resolve_device(problem, args.device)
        model = problem.build_model(args.seed, device)
        inputs = problem.inputs(args.seed + 1, device)
        outputs = problem.forward(model, inputs)
        how = "forward on %s" % device.type
    sig = make_signature(problem, input_specs(problem, model, inputs), parameter_specs(problem, model),
                         output_specs(problem, outputs))
    sig.update(count_flops(problem, args.seed))
    # How the shapes were found, for `--verbose` and the tests; SignatureFromJson ignores it.
    sig["inferred_by"] = how
    return sig


# -- reference data and the degenerate-output check -------------------------------------


def _host_array(t):
    """A contiguous numpy array of t's bytes (bf16 viewed as int16: numpy has no bf16)."""
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().cpu().numpy()


def store_tensor(t, path):
    """Writes t to path (when given) and returns the SHA-1 of its bytes."""
    arr = _host_array(t)
    if path is not None:
        arr.tofile(path)
    digest = hashlib.sha1(arr.reshape(-1).view("uint8")).hexdigest() if arr.size else hashlib.sha1().hexdigest()
    del arr
    return digest


def _tolerance_for(problem, dtype, rounding=None):
    """(atol, rtol) of an output; `rounding` ({"rms", "rel_norm"}, float32
    outputs only) widens atol as the evaluator does."""
    tol = problem.tolerance
    atol, rtol = (tol["atol"], tol["rtol"]) if tol is not None else DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))
    if rounding and dtype == "float32" and rounding["rel_norm"] <= MAX_ROUNDING_REL_NORM:
        atol += ROUNDING_FACTOR * rounding["rms"]
    return atol, rtol


def output_stats(t, atol, rtol):
    """One pass over t in chunks: NaN/Inf counts, finite min/max/max|x|, and how
    many elements a kernel writing zeros would get right."""
    import torch
    flat = t.detach().reshape(-1)
    st = {"numel": flat.numel(), "nan": 0, "inf": 0, "min": None, "max": None, "absmax": 0.0, "zero_ok": 0,
          "zeros": 0, "finite": 0, "sum": 0.0, "sumsq": 0.0}
    floating = flat.is_floating_point()
    for i in range(0, flat.numel(), CHUNK_ELEMENTS):
        c = flat[i:i + CHUNK_ELEMENTS]
        if floating:
            if c.dtype in (torch.float16, torch.bfloat16):
                c = c.float()
            finite = torch.isfinite(c)
            nfinite = int(finite.sum())
            if nfinite != c.numel():
                nan = int(torch.isnan(c).sum())
                st["nan"] += nan
                st["inf"] += c.numel() - nfinite - nan
                c = c[finite]
            if c.numel():
                lo, hi = float(c.min()), float(c.max())
                a = c.abs()
                st["absmax"] = max(st["absmax"], float(a.max()))
                # |0 - ref| <= atol + rtol * |ref|: the evaluator's test for a zeros output.
                st["zero_ok"] += int((a <= atol + rtol * a).sum())
                st["zeros"] += int((a == 0).sum())
                d = c.double()
                st["finite"] += c.numel()
                st["sum"] += float(d.sum())
                st["sumsq"] += float((d * d).sum())
                del a, d
            else:
                continue
        else:
            if c.dtype == torch.bool:
                c = c.to(torch.uint8)
            lo, hi = float(c.min()), float(c.max())
            st["absmax"] = max(st["absmax"], abs(lo), abs(hi))
            st["zero_ok"] += int((c == 0).sum())
            st["zeros"] = st["zero_ok"]
        st["min"] = lo if st["min"] is None else min(st["min"], lo)
        st["max"] = hi if st["max"] is None else max(st["max"], hi)
    return st


def degenerate_reasons(name, st, atol, rtol):
    """(key, message) pairs for one output of one input set."""
    n = st["numel"]
    if n == 0:
        return [("empty", "output '%s' is empty (0 elements)" % name)]
    reasons = []
    if st["nan"] or st["inf"]:
        reasons.append(("nonfinite", "output '%s' contains NaN or Inf (%d NaN, %d Inf of %d elements): those "
                        "elements cannot tell a right kernel from a wrong one" % (name, st["nan"], st["inf"], n)))
    if st["zero_ok"] == n and st["absmax"] == 0:
        reasons.append(("zero", "output '%s' is all zeros: a kernel that writes zeros would pass" % name))
    elif st["zero_ok"] == n:
        # Within atol of zero everywhere, not zero: zeros fail the relative-norm
        # bound, so this is a note (near_degenerate_notes), not a refusal.
        pass
    elif n >= 100 and st["zeros"] >= 0.99 * n:
        # Exact zeros, not "within atol of zero": a wide softmax is mostly below
        # atol yet perfectly meaningful, while a 99%-zero output tests little.
        reasons.append(("zero", "output '%s' is nearly all zeros (%.2f%% of elements are exactly 0)"
                        % (name, 100.0 * st["zeros"] / n)))
    elif n > 1 and st["min"] is not None:
        span = st["max"] - st["min"]
        if span <= max(atol, rtol * st["absmax"]):
            reasons.append(("constant", "output '%s' is constant (every element %.6g): a kernel that writes one "
                            "value would pass" % (name, st["min"])))
    return reasons


def near_degenerate_notes(name, st):
    """(key, message) pairs for an output the element-wise tolerance barely tests.

    Not refusals: a wide softmax is mostly below atol and still a fair problem,
    because the relative-norm bound and the large-error cap (evaluator/signature.h)
    constrain those elements. The share tells a user how much rests on them.
    """
    n, notes = st["numel"], []
    if n == 0 or st["finite"] == 0:
        return notes
    share = st["zero_ok"] / n
    if share >= 0.5 and st["absmax"] > 0:
        notes.append(("small", "output '%s': %.1f%% of elements are within the element-wise tolerance of zero, "
                      "which does not constrain them (zeros there pass atol/rtol); only the relative-norm bound "
                      "and the large-error cap do" % (name, 100.0 * share)))
    mean = st["sum"] / st["finite"]
    rms = math.sqrt(st["sumsq"] / st["finite"])
    if st["finite"] > 1 and rms > 0:
        spread = math.sqrt(max(st["sumsq"] / st["finite"] - mean * mean, 0.0)) / rms
        if spread < 1e-2 and st["max"] != st["min"]:
            notes.append(("almost_constant", "output '%s' is almost constant (std / RMS = %.2g): a kernel that "
                          "writes its mean, %.6g, has a relative error norm of %.2g" % (name, spread, mean, spread)))
    return notes


class WarningLog:
    """Warnings deduplicated by (output, reason), naming the input sets they occur in."""

    def __init__(self):
        self._entries = {}  # key -> [message, sets]
        self._plain = []

    def add(self, key, message, set_index):
        entry = self._entries.setdefault(key, [message, []])
        entry[1].append(set_index)

    def add_plain(self, message):
        self._plain.append(message)

    def messages(self, total_sets):
        out = []
        for message, sets in self._entries.values():
            if total_sets > 1 and len(sets) < total_sets:
                message += " (input set%s %s)" % ("s" if len(sets) > 1 else "", ", ".join(map(str, sets)))
            out.append(message)
        return out + self._plain


def _fits_for_timing(kept_bytes, new_bytes, device):
    """Whether another input set may stay on the device for timing (the first always does)."""
    import torch
    if kept_bytes == 0:
        return True
    try:
        free, _ = torch.cuda.mem_get_info(device)
    except Exception:  # noqa: BLE001 - old torch: keep one set only
        return False
    return kept_bytes + new_bytes <= 0.3 * free


def _state_snapshot(model):
    """A copy of every parameter and buffer: forward may change buffers
    (BatchNorm's running statistics in training mode), and every set's reference
    and the candidate must start from the same state."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _restore_state(model, snapshot):
    import torch
    with torch.no_grad():
        for k, v in model.state_dict().items():
            v.copy_(snapshot[k])


def _outputs_agree(a, b, problem, rounding=None):
    """Whether two runs' outputs are the same within the evaluator's tolerance
    (`rounding`: measure_rounding's errors by output name)."""
    import torch
    for (name, x), (_, y) in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if not x.is_floating_point():
            if not torch.equal(x, y):
                return False
            continue
        atol, rtol = _tolerance_for(problem, _dtype_name(x), (rounding or {}).get(name))
        fx, fy = x.reshape(-1), y.reshape(-1)
        for i in range(0, fx.numel(), CHUNK_ELEMENTS):
            cx, cy = fx[i:i + CHUNK_ELEMENTS].double(), fy[i:i + CHUNK_ELEMENTS].double()
            if not torch.allclose(cx, cy, atol=atol, rtol=rtol, equal_nan=True):
                return False
    return True


def check_deterministic(problem, model, snapshot, set_seed, device, first, rounding=None):
    """Refuses a problem whose reference differs between two runs of the same
    input set: no kernel can be judged against it.

    The second run starts from the same parameters and buffers with a
    different random seed; when a third run with the first run's seed agrees
    again, forward draws random numbers (Dropout in training mode,
    torch.rand inside forward), and the message says so. Returns the wall
    seconds of the second run's forward (warm: no first-call setup).
    """
    import time
    forward_s = []

    def run(rng_seed):
        _restore_state(model, snapshot)
        inputs = problem.inputs(set_seed, device)
        _seed_everything(rng_seed)
        t0 = time.monotonic()
        out = problem.forward(model, inputs)  # synchronizes
        forward_s.append(time.monotonic() - t0)
        return out

    second = run(set_seed + 7919)
    if _outputs_agree(first, second, problem, rounding):
        return forward_s[0]
    third = run(set_seed + 1000003)
    del second
    same_seed_agrees = _outputs_agree(third, run(set_seed + 1000003), problem, rounding)
    if same_seed_agrees:
        import torch
        dropouts = [n or type(m).__name__ for n, m in model.named_modules()
                    if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.training and m.p > 0]
        if dropouts:
            cause = "Dropout in training mode (%s) zeroes different elements on every run" % ", ".join(dropouts)
        else:
            cause = "forward draws random numbers (torch.rand, randn, dropout or bernoulli inside forward)"
    else:
        cause = "forward gives different results even with the same random seed (a non-deterministic op or state " \
                "kept between calls)"
    raise problem.fail("nondeterministic", "the reference is not deterministic: two runs on the same input set "
                       "differ beyond the tolerance; %s. No kernel can be judged against it: make forward "
                       "deterministic (e.g. model.eval(), or draw the randomness in get_inputs())" % cause)


def _float64_copy(model):
    """A copy of model with its float parameters and buffers in float64 (the
    model itself is left as it is). Its tensors are converted one by one, not
    cloned first, so the copy costs the float64 bytes alone."""
    import copy
    import torch
    memo = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) in memo:
            continue
        d = t.detach().to(torch.float64) if t.dtype in (torch.float32, torch.float16, torch.bfloat16) \
            else t.detach().clone()
        memo[id(t)] = torch.nn.Parameter(d, requires_grad=False) if isinstance(t, torch.nn.Parameter) else d
    return copy.deepcopy(model, memo)


def _float64_speed_ratio(device):
    """How many times longer float64 work takes than float32 here, at least 2
    (twice the bytes): a 1024^3 matmul of each, timed after one warm-up."""
    import time
    import torch
    if device.type != "cuda":
        return 2.0
    times = []
    for dtype in (torch.float32, torch.float64):
        a = torch.ones(1024, 1024, device=device, dtype=dtype)
        torch.matmul(a, a)
        torch.cuda.synchronize(device)
        t0 = time.monotonic()
        for _ in range(3):
            torch.matmul(a, a)
        torch.cuda.synchronize(device)
        times.append(time.monotonic() - t0)
        del a
    return max(2.0, times[1] / max(times[0], 1e-9))


def _float_bytes64(tensors):
    """Bytes of the float tensors among `tensors` once converted to float64."""
    import torch
    floats = (torch.float32, torch.float16, torch.bfloat16)
    return sum(t.numel() * 8 for t in tensors if isinstance(t, torch.Tensor) and t.dtype in floats)


def _float64_fits(need, device):
    """(fits, available): whether `need` bytes fit in 80% of what this
    process's GPU allocator can still get."""
    import torch
    if device.type != "cuda":
        return True, 0
    try:
        free, _ = torch.cuda.mem_get_info(device)
    except Exception:  # noqa: BLE001 - old torch: assume nothing is free
        return False, 0
    available = free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return need <= 0.8 * available, available


def _forward_float64(problem, model, set_seed, device, make_inputs=None):
    """forward of a float64 copy of model on input set `set_seed` converted to
    float64 (integer inputs and scalars unchanged). Its own frame holds the
    copies, so they are freed when it returns or raises."""
    import torch
    floats = (torch.float32, torch.float16, torch.bfloat16)
    model64 = _float64_copy(model)
    inputs = make_inputs() if make_inputs is not None else problem.inputs(set_seed, device)
    for i, v in enumerate(inputs):
        if isinstance(v, torch.Tensor) and v.dtype in floats:
            inputs[i] = v.to(torch.float64)
            del v
    _seed_everything(set_seed)
    with torch.no_grad():
        result = model64(*inputs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return problem._outputs(result)


def measure_rounding(problem, model, set_seed, device, outputs, inputs, forward_s, peak_forward_bytes,
                     make_inputs=None, max_s=None):
    """PyTorch's own rounding error for each float32 output of one input set:
    the same model and inputs in float64, compared with the float32 outputs.

    `inputs` are the set's (for their sizes), `forward_s` the float32
    forward's wall time and `peak_forward_bytes` what it allocated on the GPU.
    Returns ({name: {"rms": RMS of ref32 - ref64, "rel_norm": ||ref32 -
    ref64|| / ||ref64||}}, note): the note (or None) says why the run was
    skipped or an output left out. Skipped when no output is float32, when
    forward fails in float64 (an op without float64 support, a dtype check),
    when it would take longer than FP64_CHECK_MAX_S (from the float32
    forward's time and the device's float64 speed) or not fit in GPU memory.
    Nothing of the float32 model or its outputs changes.
    """
    import torch
    names = [name for name, t in outputs if t.dtype == torch.float32]
    if not names:
        return {}, None
    what = "the float64 run that measures PyTorch's own float32 rounding"
    keep = "float32 outputs keep the default tolerance"
    limit = float(os.environ.get("KS_FP64_CHECK_MAX_S", FP64_CHECK_MAX_S)) if max_s is None else max_s
    ratio = _float64_speed_ratio(device)
    if forward_s * ratio > limit:
        return {}, ("%s was skipped: it would take about %.1f s (float32 forward %.2f s, float64 %.0fx slower on "
                    "this device; limit %.1f s, $KS_FP64_CHECK_MAX_S); %s"
                    % (what, forward_s * ratio, forward_s, ratio, limit, keep))
    # The float parameters and inputs again in float64, and forward's own allocations twice over.
    need = _float_bytes64(list(model.parameters()) + list(model.buffers()) + list(inputs)) + 2 * peak_forward_bytes
    fits, available = _float64_fits(need, device)
    if not fits:
        return {}, ("%s was skipped: it needs about %s of GPU memory and %s is available; %s"
                    % (what, _human(need), _human(available), keep))
    oom = getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    errors, left_out, note = {}, [], None
    try:
        result = _forward_float64(problem, model, set_seed, device, make_inputs)
        if len(result) != len(outputs):
            raise ValueError("forward returns %d outputs in float64, %d in float32" % (len(result), len(outputs)))
        for (name, t32), (_, t64) in zip(outputs, result):
            if name not in names:
                continue
            if t64.dtype != torch.float64 or t64.shape != t32.shape:
                left_out.append(name)
                continue
            errors[name] = _rounding_error(t32, t64)
        del result
    except oom:
        errors, note = {}, "%s ran out of GPU memory; %s" % (what, keep)
    except Exception as e:  # noqa: BLE001 - any failure in float64 means "not measured"
        errors, note = {}, "%s failed (%s: %s); %s" % (what, type(e).__name__, _first_line(e, 200), keep)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the float64 copies, before the next input sets
    if left_out:
        note = ("%s gave no float64 result of the same shape for %s (does forward cast to float32?); %s"
                % (what, ", ".join("'%s'" % n for n in left_out), "it keeps the default tolerance"
                   if len(left_out) == 1 else "they keep the default tolerance"))
    for name, e in errors.items():
        if e["rel_norm"] > MAX_ROUNDING_REL_NORM:
            extra = ("output '%s': the float32 and float64 references differ by %.3g (relative norm), more than "
                     "float32 rounding explains (%g): its tolerance is not widened (a problem this ill-conditioned "
                     "needs a TOLERANCE of its own)" % (name, e["rel_norm"], MAX_ROUNDING_REL_NORM))
            note = extra if note is None else note + "; " + extra
    return errors, note


def measure_default_precision(problem, model, snapshot, set_seed, device, outputs, tf32_defaults):
    """The precision contract (issue 27): the reference runs in full fp32
    (TF32 off), while PyTorch's defaults, which users run and eager and
    torch.compile are timed with, compute cuDNN convolutions (and matmuls, where
    torch.backends.cuda.matmul.allow_tf32 is on) in TF32. This runs input set
    `set_seed` once more with the defaults and returns ({name: {"rms",
    "rel_norm", "max_abs"}} of default - fp32 for each float32 output that
    differs, note). {} when every output has the same bits (no TF32 path: no
    convolution, a CPU, defaults off): the two baselines are then one. The
    model's state is restored before, the flags after."""
    import torch
    if device.type != "cuda" or not any(tf32_defaults):
        return {}, None
    names = [name for name, t in outputs if t.dtype == torch.float32]
    if not names:
        return {}, None
    what = "the run with PyTorch's default precision (TF32)"
    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    oom = getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32_defaults
        _restore_state(model, snapshot)
        inputs = problem.inputs(set_seed, device)
        _seed_everything(set_seed)
        result = problem.forward(model, inputs)
        del inputs
    except oom:
        return {}, "%s ran out of GPU memory: only the fp32 baseline is known" % what
    except BridgeError as e:
        return {}, "%s failed (%s): only the fp32 baseline is known" % (what, e.message[:200])
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved
        _restore_state(model, snapshot)
    errors = {}
    for (name, t32), (_, td) in zip(outputs, result):
        if name not in names or td.shape != t32.shape or td.dtype != t32.dtype or torch.equal(td, t32):
            continue
        e = _rounding_error(td, t32)
        a, b = td.detach().reshape(-1), t32.detach().reshape(-1)
        worst = 0.0
        for i in range(0, a.numel(), CHUNK_ELEMENTS):
            d = (a[i:i + CHUNK_ELEMENTS].double() - b[i:i + CHUNK_ELEMENTS].double()).abs()
            d = d[torch.isfinite(d)]
            if d.numel():
                worst = max(worst, float(d.max()))
        e["max_abs"] = worst
        errors[name] = e
    del result
    return errors, None


def _rounding_error(t32, t64):
    """{"rms", "rel_norm"} of t32 - t64 over the elements finite in both (chunked)."""
    import torch
    a, b = t32.detach().reshape(-1), t64.detach().reshape(-1)
    ssd = ssr = 0.0
    count = 0
    for i in range(0, a.numel(), CHUNK_ELEMENTS):
        x, y = a[i:i + CHUNK_ELEMENTS].to(torch.float64), b[i:i + CHUNK_ELEMENTS]
        finite = torch.isfinite(x) & torch.isfinite(y)
        if not bool(finite.all()):
            x, y = x[finite], y[finite]
        d = x - y
        ssd += float((d * d).sum())
        ssr += float((y * y).sum())
        count += x.numel()
        del x, y, d, finite
    rms = math.sqrt(ssd / count) if count else 0.0
    # A float64 reference of zeros that float32 misses: as far from rounding as it gets.
    rel = math.sqrt(ssd / ssr) if ssr > 0 else (0.0 if ssd == 0 else 1.0)
    return {"rms": rms, "rel_norm": rel}


def _with_scalars(problem, specs, tensors):
    """The argument list of forward: kept tensors, and scalar inputs from the signature."""
    out, it = [], iter(tensors)
    for spec in specs:
        out.append(next(it) if spec["kind"] == "tensor" else spec["value"])
    return out


def _keep_inputs_pristine(problem, specs, kept, prints, i, set_seed, device):
    """Resident mode: set i's kept inputs must be what the reference saw. When
    forward changed one in place, the set is generated again from its seed (and
    must give the same bytes as the first time)."""
    if all(_fingerprint(t) == p for t, p in zip(kept[i], prints[i])):
        return
    fresh = [v.contiguous() for spec, v in zip(specs, problem.inputs(set_seed, device)) if spec["kind"] == "tensor"]
    if [_fingerprint(t) for t in fresh] != prints[i]:
        raise problem.fail("inputs_vary", "forward() changes its inputs in place, and get_inputs() does not give "
                           "the same tensors again for seed %d: the reference cannot be kept" % set_seed)
    kept[i] = fresh


class _Resident:
    """Tensors kept on the GPU for the evaluator to map (reference --resident).

    Nothing is written: each tensor stays alive here, and the manifest names it
    by the CUDA IPC handle of its allocation and its offset in it. The driver is
    called through ctypes: the IPC handle of an allocation of torch's caching
    allocator, whatever torch's version.
    """

    def __init__(self):
        import ctypes
        self._ct = ctypes
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise BridgeError("device_error", "--resident needs the CUDA driver (libcuda.so.1): %s" % e)
        self.tensors = []   # kept alive until the bridge exits
        self._handles = {}  # allocation base -> base64 IPC handle

    def _call(self, name, *args):
        rc = getattr(self._cuda, name)(*args)
        if rc != 0:
            raise BridgeError("device_error", "%s failed with CUDA error %d while exporting the reference "
                              "(is PYTORCH_CUDA_ALLOC_CONF asking for expandable segments? they cannot be "
                              "shared)" % (name, rc))

    def export(self, t):
        """Keeps t (contiguous) and returns {"handle", "offset", "bytes"}."""
        import base64
        t = t.detach().contiguous()
        nbytes = t.numel() * t.element_size()
        self.tensors.append(t)
        if nbytes == 0:
            return {"handle": "", "offset": 0, "bytes": 0}
        ct = self._ct
        ptr = t.data_ptr()
        base, size = ct.c_uint64(0), ct.c_size_t(0)
        self._call("cuMemGetAddressRange_v2", ct.byref(base), ct.byref(size), ct.c_uint64(ptr))
        if base.value not in self._handles:
            handle = (ct.c_char * 64)()
            self._call("cuIpcGetMemHandle", handle, ct.c_uint64(base.value))
            self._handles[base.value] = base64.b64encode(handle.raw).decode()
        return {"handle": self._handles[base.value], "offset": ptr - base.value, "bytes": nbytes}


def _fingerprint(t):
    """A cheap digest of t's bytes computed where t lives (chunked: no copy of a
    multi-GB tensor): tells whether forward changed an input in place."""
    import torch
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return (0, 0)
    b = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    total, weighted = 0, 0
    step = CHUNK_ELEMENTS * 4
    for i in range(0, b.numel(), step):
        c = b[i:i + step].to(torch.int64)
        w = torch.arange(i, i + c.numel(), device=c.device, dtype=torch.int64) % 65521 + 1
        total += int(c.sum())
        weighted = (weighted + int((c * w).sum())) % (1 << 61)
    return (total, weighted)


def _same_data(a, b):
    """Digests (file mode: SHA-1 strings) or kept tensors (resident mode) compare equal."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def run_reference(problem, out_dir, sets, seed, device_name, do_time, resident=None, transform_room=None):
    """Builds the model, runs K input sets, writes them when out_dir is given,
    or keeps them on the GPU when `resident` (a _Resident) is given; then up
    to `transform_room` distribution-shifted sets (transforms.py,
    add_transformed_sets), after the K sets, each marked with its transform.

    Returns the manifest dict (without "files" when out_dir is None; with "ipc"
    per set when resident). torch.compile is timed by the CompileHelper
    when one runs (reference --time), else here.
    """
    import torch
    if sets < 1:
        raise BridgeError("bad_arguments", "--sets must be at least 1")
    import time
    phases = {}
    clock = [time.monotonic()]

    def phase(name):
        """Adds the wall time since the previous mark to `name`: --verbose shows what dominates."""
        now = time.monotonic()
        phases[name] = phases.get(name, 0.0) + now - clock[0]
        clock[0] = now

    device = resolve_device(problem, device_name)
    # Reference outputs in full fp32: cuDNN convolutions default to TF32 on
    # Ampere and later, whose 10-bit mantissa would make an exact fp32 kernel
    # look wrong. PyTorch's defaults come back for the eager and torch.compile
    # timing, so that the speed baseline is what users run.
    tf32_defaults = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    model = problem.build_model(seed, device)
    params = parameter_specs(problem, model)
    snapshot = _state_snapshot(model)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    phase("model build")  # the state before any forward: given to the candidate, restored per set

    files_params = {}
    ipc_params = {}
    if resident is not None:
        if device.type != "cuda":
            raise BridgeError("bad_arguments", "--resident keeps the reference on a GPU: it needs --device cuda")
        for k, v in snapshot.items():
            ipc_params[k] = resident.export(v)
    if out_dir is not None:
        os.makedirs(os.path.join(out_dir, "params"), exist_ok=True)
        # Written before any forward: a forward that updates buffers (BatchNorm in
        # training mode) must not change what the candidate is given.
        for k, v in model.state_dict().items():
            rel = "params/%s.bin" % k
            store_tensor(v, os.path.join(out_dir, rel))
            files_params[k] = rel

    warnings = WarningLog()
    notes = WarningLog()
    sig_inputs = sig_outputs = None
    scalars = {}
    manifest_sets = []
    input_hashes, output_hashes = [], []
    input_prints = []  # resident: fingerprints of each set's tensor inputs before forward
    timing_sets, kept_bytes = [], 0
    base_nonfinite = {}  # output name -> NaN/Inf elements in set 0's reference
    for i in range(sets):
        set_seed = seed + 1 + i
        phase("writing files")  # the parameters, before the first set
        inputs = problem.inputs(set_seed, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        phase("input generation")
        specs = input_specs(problem, model, inputs)
        if sig_inputs is None:
            sig_inputs = specs
            scalars = {s["name"]: s["value"] for s in specs if s["kind"] == "scalar"}
        elif specs != sig_inputs:
            raise problem.fail("inputs_vary", "get_inputs() returns different names, dtypes, shapes or scalar "
                               "values for seeds %d and %d; only tensor values may change" % (seed + 1, set_seed))
        set_dir = None
        if out_dir is not None:
            set_dir = os.path.join(out_dir, "set%d" % i)
            os.makedirs(set_dir, exist_ok=True)
        files = dict(files_params)
        hashes = []
        prints = []
        # Inputs are written before forward runs, in case forward changes them in
        # place; kept ones are fingerprinted for the same reason.
        for spec, v in zip(specs, inputs):
            if spec["kind"] != "tensor":
                continue
            if resident is not None:
                v = v.contiguous()
                hashes.append(v)
                prints.append(_fingerprint(v))
                continue
            path = os.path.join(set_dir, spec["name"] + ".bin") if set_dir else None
            hashes.append(store_tensor(v, path))
            if path:
                files[spec["name"]] = "set%d/%s.bin" % (i, spec["name"])
        input_hashes.append(hashes)
        input_prints.append(prints)
        phase("writing files")

        _restore_state(model, snapshot)
        _seed_everything(set_seed)  # randomness inside forward, if any, is seeded per set too
        if i == 0 and device.type == "cuda":
            allocated = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        outputs = problem.forward(model, inputs)
        phase("forward")
        if i == 0:
            peak_forward = torch.cuda.max_memory_allocated(device) - allocated if device.type == "cuda" else 0
            forward_s = check_deterministic(problem, model, snapshot, set_seed, device, outputs)
            phase("determinism check")
            _restore_state(model, snapshot)
            rounding, note = measure_rounding(problem, model, set_seed, device, outputs, inputs, forward_s,
                                              peak_forward)
            if note:
                notes.add_plain(note)
            phase("float64 rounding check")
            default_error, note = measure_default_precision(problem, model, snapshot, set_seed, device, outputs,
                                                            tf32_defaults)
            if note:
                notes.add_plain(note)
            phase("PyTorch's default precision (TF32) check")
        ospecs = output_specs(problem, outputs)
        if sig_outputs is None:
            sig_outputs = ospecs
        elif ospecs != sig_outputs:
            raise problem.fail("inputs_vary", "forward() returns different output shapes or dtypes for seeds "
                               "%d and %d" % (seed + 1, set_seed))
        ohashes = []
        for (name, t), spec in zip(outputs, ospecs):
            atol, rtol = _tolerance_for(problem, spec["dtype"], rounding.get(name))
            st = output_stats(t, atol, rtol)
            if i == 0:
                base_nonfinite[name] = st["nan"] + st["inf"]
            for key, msg in degenerate_reasons(name, st, atol, rtol):
                warnings.add((name, key), msg, i)
            for key, msg in near_degenerate_notes(name, st):
                notes.add((name, key), msg, i)
            if resident is not None:
                ohashes.append(t.detach().contiguous())
                continue
            path = os.path.join(set_dir, name + ".bin") if set_dir else None
            ohashes.append(store_tensor(t, path))
            if path:
                files[name] = "set%d/%s.bin" % (i, name)
        output_hashes.append(ohashes)
        phase("writing files")  # with the degenerate-output statistics
        del outputs
        manifest_sets.append({"seed": set_seed, "files": files})
        if resident is not None:
            _keep_inputs_pristine(problem, specs, input_hashes, input_prints, i, set_seed, device)
            phase("input fingerprints")
            timing_sets.append(input_hashes[i] if len(timing_sets) < 2 else None)
            del inputs
            continue

        if do_time and device.type == "cuda":
            nbytes = sum(v.numel() * v.element_size() for v in inputs if isinstance(v, torch.Tensor))
            if _fits_for_timing(kept_bytes, nbytes, device):
                timing_sets.append(inputs)
                kept_bytes += nbytes
        del inputs

    if sets > 1:
        if all(len(h) == len(input_hashes[0]) and all(_same_data(a, b) for a, b in zip(h, input_hashes[0]))
               for h in input_hashes[1:]):
            if input_hashes[0]:
                warnings.add_plain("get_inputs() returns the same tensors for seeds %d..%d: the input sets do "
                                   "not differ (does it draw from torch's random generator?)"
                                   % (seed + 1, seed + sets))
        else:
            for j, spec in enumerate(sig_outputs):
                if all(_same_data(h[j], output_hashes[0][j]) for h in output_hashes[1:]):
                    warnings.add_plain("output '%s' is identical for all %d input sets although the inputs differ: "
                                       "it does not depend on the inputs" % (spec["name"], sets))

    # What makes the reference unable to judge (the GPU side of a search stops on
    # these), apart from the timing warnings that follow.
    degenerate = warnings.messages(sets)
    transform_info, t_kept = add_transformed_sets(problem, model, snapshot, sig_inputs, sig_outputs, seed, device,
                                                  out_dir, resident, sets, transform_room, base_nonfinite,
                                                  manifest_sets, files_params, notes, forward_s, peak_forward)
    phase("distribution-shifted input sets")

    timing = {"eager": None, "compiled": None}
    if do_time and device.type == "cuda":
        import timing as ks_timing
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32_defaults
        _restore_state(model, snapshot)
        phase("writing files")
        helper = _COMPILE_HELPER[0]
        ready = False
        if helper is not None:
            ready, note = helper.wait_compiled()
            if note:
                notes.add_plain(note)
            phase("waiting for torch.compile in the helper process")
        if resident is not None:
            # The kept inputs themselves, with the scalars in their places.
            timing_sets = [_with_scalars(problem, sig_inputs, t) for t in timing_sets if t is not None]
        eager, compiled, timing_warnings = ks_timing.time_model(model, timing_sets, device, compile_model=not ready,
                                                                phases=phases)
        if ready:
            # The helper measures while this process waits: the GPU is one
            # process's at a time whenever something is timed.
            t0 = time.monotonic()
            compiled, note = helper.time_compiled()
            phases["torch.compile timing (helper process, compiled before)"] = time.monotonic() - t0
            if note:  # it failed after compiling: timed here, as without a helper
                notes.add_plain(note)
                eager, compiled, timing_warnings = ks_timing.time_model(model, timing_sets, device, phases=phases)
        eager_fp32 = None
        if default_error:
            # The defaults compute in TF32 here: eager at the precision the
            # candidate is held to as well, so that a speedup can name either.
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
            t0 = time.monotonic()
            with torch.no_grad():
                eager_fp32 = ks_timing.Timer(device).measure(model, timing_sets)
            phases["eager timing with TF32 off"] = time.monotonic() - t0
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = tf32_defaults
        clock[0] = time.monotonic()
        timing = {"eager": eager, "compiled": compiled, "eager_fp32": eager_fp32}
        for w in timing_warnings:
            warnings.add_plain(w)
    del timing_sets
    if resident is not None:
        # Timing ran forward on the kept inputs: they must still be the ones the
        # reference outputs were computed from.
        for i in range(sets):
            _keep_inputs_pristine(problem, sig_inputs, input_hashes, input_prints, i, seed + 1 + i, device)
        torch.cuda.empty_cache()
        names = [spec["name"] for spec in sig_inputs if spec["kind"] == "tensor"]
        for i, entry in enumerate(manifest_sets[:sets]):
            ipc = dict(ipc_params)
            for name, t in zip(names, input_hashes[i]):
                ipc[name] = resident.export(t)
            for spec, t in zip(sig_outputs, output_hashes[i]):
                ipc[spec["name"]] = resident.export(t)
            entry["ipc"] = ipc
        for entry, (t_inputs, t_outputs) in zip(manifest_sets[sets:], t_kept):
            ipc = dict(ipc_params)
            for name, t in t_inputs.items():
                ipc[name] = resident.export(t)
            for name, t in t_outputs.items():
                ipc[name] = resident.export(t)
            entry["ipc"] = ipc
        del input_hashes, output_hashes, t_kept
        phase("export (CUDA IPC)")

    manifest = {
        "signature": dict(make_signature(problem, sig_inputs, params, sig_outputs),
                          # PyTorch's own float32 rounding by output (measure_rounding): widens its tolerance.
                          reference_error=rounding, **count_flops(problem, seed)),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "sets": manifest_sets,
        "timing": timing,
        "warnings": warnings.messages(sets),
        "degenerate": degenerate,
        "notes": notes.messages(sets),
        # The precision contract: how far PyTorch's defaults (TF32 in cuDNN convolutions)
        # are from the full-fp32 reference, by float32 output; {} where they give the same bits.
        "default_precision": {"tf32_defaults": list(tf32_defaults), "errors": default_error},
        # Other shapes (get_inputs_variants()): how many the problem declares
        # (each is a reference of its own, bridge.py reference --variant I), or
        # which one this reference is.
        "shape_variants": problem.variant_count() if problem.variant is None else 0,
        "shape_variant": problem.variant,
        # Each transform of transforms.TRANSFORMS: its set's index, or why it has none.
        "transforms": transform_info,
        "scalars": scalars,
        # Wall seconds per phase of this bridge run, in order (not part of any result).
        "phases": [[k, round(v, 3)] for k, v in phases.items()],
    }
    return manifest


def _shifted_state(model, snapshot, name, seed, params_too):
    """The model as a shifted set runs it: the pre-forward state, its float32
    parameters transformed by `name` when params_too (transforms.py)."""
    import transforms
    _restore_state(model, snapshot)
    if params_too:
        transforms.apply_to_parameters(name, model, seed)


def _shifted_forward(problem, model, inputs, sig_outputs, base_nonfinite):
    """forward on a shifted set: (outputs, None), or (outputs or None, why the
    set cannot judge: forward raised, other shapes, NaN/Inf where set 0 has none)."""
    import transforms
    try:
        outputs = problem.forward(model, inputs)
    except BridgeError as e:
        return None, "forward() raised on these inputs (%s)" % e.message.split(" raised ", 1)[-1][:300]
    if output_specs(problem, outputs) != sig_outputs:
        return outputs, "forward() returns other output shapes or dtypes on these inputs"
    for (oname, t) in outputs:
        bad, before = transforms.nonfinite_count(t), base_nonfinite.get(oname, 0)
        if bad > before:
            return outputs, ("PyTorch's output '%s' has %d NaN/Inf elements on these inputs where input set 0's has "
                             "%d (outside the operator's domain or range)" % (oname, bad, before))
    return outputs, None


def add_transformed_sets(problem, model, snapshot, sig_inputs, sig_outputs, seed, device, out_dir, resident, sets,
                         room, base_nonfinite, manifest_sets, files_params, notes, forward_s=0.0, peak_forward=0):
    """The distribution-shifted input sets (transforms.py), appended to
    manifest_sets after the K get_inputs() sets: at most `room` of them (None:
    not asked for, as by `check`), each input set 0 transformed, with
    PyTorch's output on it as its reference; files in out_dir, or kept on the
    GPU (resident: exported by the caller). Returns (info, kept): info has
    one entry per transform, {"name", "set": its index or None, "note": what
    it does, or why it has no set, and "reference_error": PyTorch's own float32
    rounding on that set, as measure_rounding measures set 0's, where it was
    measured}; kept, per set made (resident only), the ({input name: tensor},
    {output name: tensor}) to export. The float64 runs of all shifted sets
    together stay within one $KS_FP64_CHECK_MAX_S."""
    import time
    import torch
    import transforms
    info, kept = [], []
    if room is None:
        return info, kept
    wanted = transforms.chosen(problem.module)
    set_seed = seed + 1  # input set 0, transformed
    tensor_specs = [spec for spec in sig_inputs if spec["kind"] == "tensor"]

    def fresh(name):
        # Set 0's inputs made again and, on a GPU, transformed in place: one copy
        # of a multi-GB input in memory. There get_inputs() draws its tensors on
        # the device or they are moved there, a new tensor each call; on the CPU a
        # problem may hand back one module-level tensor every time, which must
        # not change under the other sets (they are small there: copied).
        return transforms.apply(name, problem.inputs(set_seed, device), set_seed, in_place=device.type == "cuda")

    no_floats = not any(spec["kind"] == "tensor" and spec["dtype"] in ("float32", "float16", "bfloat16", "float64")
                        for spec in sig_inputs)
    # A shifted set rounds differently from set 0 (outliers dominate a variance,
    # a scaled sum cancels otherwise): its own float64 run widens its tolerance.
    fp64_left = float(os.environ.get("KS_FP64_CHECK_MAX_S", FP64_CHECK_MAX_S))
    p_wanted = transforms.parameters_chosen(problem.module)
    p_names = transforms.transformable_parameters(model)
    for name in transforms.TRANSFORMS:
        if name not in wanted:
            info.append({"name": name, "set": None, "note": "not checked: the problem's INPUT_TRANSFORMS leaves it out"})
            continue
        if no_floats:
            info.append({"name": name, "set": None, "note": "not checked: the problem has no floating-point input "
                         "tensor to transform"})
            continue
        if len(manifest_sets) - sets >= room:
            note = ("not checked: no room for another input set (the cache cap, the free disk or the GPU's free "
                    "memory)")
            info.append({"name": name, "set": None, "note": note})
            notes.add_plain("transform '%s' %s" % (name, note))
            continue
        index = len(manifest_sets)
        inputs = fresh(name)
        files, t_inputs, prints = dict(files_params), {}, []
        set_dir = os.path.join(out_dir, "set%d" % index) if out_dir is not None else None
        if set_dir:
            os.makedirs(set_dir, exist_ok=True)
        for spec, v in zip(tensor_specs, [v for v in inputs if isinstance(v, torch.Tensor)]):
            if resident is not None:
                t_inputs[spec["name"]] = v.contiguous()
                prints.append(_fingerprint(t_inputs[spec["name"]]))
            elif set_dir:
                store_tensor(v, os.path.join(set_dir, spec["name"] + ".bin"))
                files[spec["name"]] = "set%d/%s.bin" % (index, spec["name"])
        # The parameters change with the inputs where the problem has float32
        # ones; where PyTorch's output is then not finite (or forward raises),
        # the set is made again with the inputs alone.
        tries = [True, False] if (name in p_wanted and p_names) else [False]
        param_note = ("" if not p_names else "; parameters kept as they are: the problem's PARAMETER_TRANSFORMS "
                      "leaves it out" if name not in p_wanted else "")
        for params_too in tries:
            if not params_too and tries[0]:
                inputs = fresh(name)  # the first forward may have changed them in place
            _shifted_state(model, snapshot, name, set_seed, params_too)
            _seed_everything(set_seed)
            outputs, why = _shifted_forward(problem, model, inputs, sig_outputs, base_nonfinite)
            if why is None:
                break
            if params_too:
                param_note = "; parameters kept as they are: with them transformed too, %s" % why
                del outputs
        if why is not None:
            note = "dropped: %s" % why
            info.append({"name": name, "set": None, "note": note})
            notes.add_plain("transform '%s' (%s) %s" % (name, transforms.DESCRIPTIONS[name], note))
            if set_dir:
                import shutil
                shutil.rmtree(set_dir, ignore_errors=True)
            del outputs
            _restore_state(model, snapshot)
            continue
        t_params = {}
        if params_too:
            # The set's own parameters, as forward saw them.
            for pname, v in model.state_dict().items():
                if pname not in p_names:
                    continue
                if resident is not None:
                    t_params[pname] = v.detach().clone()
                elif set_dir:
                    store_tensor(v, os.path.join(set_dir, pname + ".bin"))
                    files[pname] = "set%d/%s.bin" % (index, pname)
        rounding = {}
        if fp64_left > 0:
            t0 = time.monotonic()
            _shifted_state(model, snapshot, name, set_seed, params_too)
            rounding, _ = measure_rounding(problem, model, set_seed, device, outputs, inputs, forward_s, peak_forward,
                                           make_inputs=lambda: fresh(name), max_s=fp64_left)
            fp64_left -= time.monotonic() - t0
        _restore_state(model, snapshot)
        t_outputs = {}
        for oname, t in outputs:
            if resident is not None:
                t_outputs[oname] = t.detach().contiguous()
            elif set_dir:
                store_tensor(t, os.path.join(set_dir, oname + ".bin"))
                files[oname] = "set%d/%s.bin" % (index, oname)
        del outputs
        if resident is not None:
            # forward changed an input in place: the transform is deterministic, so make it again.
            if [_fingerprint(t) for t in t_inputs.values()] != prints:
                again = [v for v in fresh(name) if isinstance(v, torch.Tensor)]
                t_inputs = {spec["name"]: v.contiguous() for spec, v in zip(tensor_specs, again)}
            t_inputs.update(t_params)  # exported with the inputs, in place of the shared parameters
            kept.append((t_inputs, t_outputs))
        entry = {"seed": set_seed, "files": files, "transform": name}
        note = transforms.DESCRIPTIONS[name]
        if params_too:
            entry["parameters"] = list(p_names)
            note += "; the model's float32 parameters likewise (%s)" % ", ".join(p_names)
        manifest_sets.append(entry)
        info.append({"name": name, "set": index, "note": note + param_note, "reference_error": rounding,
                     "parameters": list(p_names) if params_too else []})
    return info, kept


def write_manifest(out_dir, manifest):
    # Written last and atomically: a directory without manifest.json is incomplete.
    path = os.path.join(out_dir, "manifest.json")
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


_RESIDENT = None  # reference --resident: what the evaluator maps, alive until stdin closes
_ANSWER = [None]  # the caller's stdout (main): JSON lines only


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "int8": 1,
                "uint8": 1, "bool": 1}


def _spec_bytes(specs):
    total = 0
    for spec in specs:
        if spec.get("kind", "tensor") != "tensor":
            continue
        n = 1
        for d in spec["shape"]:
            n *= d
        total += n * _DTYPE_BYTES.get(spec["dtype"], 8)
    return total


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0


def fit_resident(sig, asked, budget, shifted=0):
    """How many input sets a resident reference may have on `budget` bytes of
    GPU memory (0 = no limit): the bridge keeps each set's inputs and outputs
    and the parameters twice (the model's and the pre-forward copy); the
    evaluator's arena and pristine copy take the inputs twice more and the
    arena one output; one more output is margin for what forward allocates.
    Returns (sets, why) with why naming the limit when sets < asked."""
    inp, out, par = _spec_bytes(sig["inputs"]), _spec_bytes(sig["outputs"]), _spec_bytes(sig["parameters"])
    # A distribution-shifted set (the last `shifted` of `asked`) may have its
    # own float32 parameters (transforms.py): kept here, in the arena and its pristine copy.
    own = _spec_bytes([p for p in sig["parameters"] if p.get("dtype") in ("float32", "float64")])
    per_set = 3 * inp + out
    judging = asked - shifted

    def need(k):
        shifted_in = max(0, min(shifted, k - max(min(judging, 2), k - shifted)))
        return 4 * par + 2 * out + k * per_set + 3 * own * shifted_in

    sets = 0
    for k in range(asked, 0, -1):
        if budget == 0 or need(k) <= budget:
            sets = k
            break
    why = ""
    if sets < asked:
        k = sets + 1
        why = ("%d set(s) need %s of GPU memory (%s per set: the reference's inputs and outputs, the candidate's "
               "inputs and their pristine copy), but %s is free" % (k, _human(need(k)), _human(per_set),
                                                                   _human(budget)))
    return sets, why


_COMPILE_HELPER = [None]  # reference --time on a GPU: the CompileHelper, started by main before torch loads


class CompileHelper:
    """torch.compile timed by a helper process that compiles while this one
    computes the reference.

    torch.compile's first call costs 10-20 s (dynamo, inductor, Triton), on
    the CPU mostly. The helper (bridge.py time-compiled) starts with this
    process, imports torch alongside it, builds the same model from the same
    seed on the same device and the timing input sets from the same seeds,
    and compiles torch.compile(model) with one call, while this process
    computes and writes the reference. Then the timings are taken one process
    at a time, so that nothing else runs on the GPU while either measures:
    this process waits for the helper's "compiled", times eager, and waits
    while the helper times the compiled model by timing.py's method (the same
    Timer.measure, warm-up included; compilation was never inside a measured
    call). Where the helper skips (too little GPU memory beside the
    reference, no torch.compile) or fails, this process compiles and times as
    it would without it. The helper dies with this process.
    """

    def __init__(self, proc):
        self._proc = proc

    @staticmethod
    def start(args):
        import subprocess
        if os.environ.get("KS_NO_COMPILE_HELPER"):
            return None

        def die_with_parent():
            import ctypes
            try:
                ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
            except Exception:  # noqa: BLE001
                pass

        try:
            proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "time-compiled", args.problem,
                                     "--seed", str(args.seed), "--sets", str(args.sets), "--device", "cuda"],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent)
        except OSError:
            return None
        return CompileHelper(proc)

    def _read(self):
        line = self._proc.stdout.readline()
        try:
            return json.loads(line) if line.strip() else {"skip": "the helper ended without an answer"}
        except ValueError:
            return {"skip": "the helper answered %r" % line[:200]}

    def _give_up(self, why):
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        return "torch.compile was timed in this process, not in the helper: %s" % why

    def wait_compiled(self):
        """(ready, note): waits until the helper has compiled (or given up)."""
        msg = self._read()
        if msg.get("compiled") is True:
            return True, None
        return False, self._give_up(msg.get("skip") or msg.get("error", {}).get("message") or str(msg)[:300])

    def time_compiled(self):
        """(stats, note): lets the helper time, waits for its figures."""
        try:
            self._proc.stdin.write(b"go\n")
            self._proc.stdin.flush()
        except OSError as e:
            return None, self._give_up("it went away (%s)" % e)
        msg = self._read()
        self._proc.wait()
        if isinstance(msg.get("timing"), dict):
            return msg["timing"], None
        return None, self._give_up(msg.get("skip") or msg.get("error", {}).get("message") or str(msg)[:300])


def cmd_time_compiled(problem, args):
    """The helper of CompileHelper (see there): {"skip": why} when it does
    not fit beside the reference or torch cannot compile; else
    {"compiled": true} as an intermediate line, then, after a line on stdin,
    {"timing": timing.py's figures for torch.compile(model)}."""
    import torch
    import timing as ks_timing
    if not hasattr(torch, "compile"):
        return {"skip": "torch %s has no torch.compile" % torch.__version__}
    meta = _signature_on_meta(problem, args.seed)
    if meta is None:
        return {"skip": "the problem's sizes are not known without running it"}
    device = resolve_device(problem, args.device)
    model, inputs, result = meta
    sig = {"inputs": input_specs(problem, model, inputs), "parameters": parameter_specs(problem, model),
           "outputs": output_specs(problem, problem._outputs(result))}
    del model, inputs, result
    par, inp, out = _spec_bytes(sig["parameters"]), _spec_bytes(sig["inputs"]), _spec_bytes(sig["outputs"])
    free, _ = torch.cuda.mem_get_info(device)
    # What the reference process will hold (fit_resident's rule, whichever
    # path it takes) comes first; the helper takes what is left, with margin.
    # (The judging sets and the distribution-shifted ones, transforms.py.)
    main_sets, _ = fit_resident(sig, args.sets + 4, int(0.9 * free))
    spare = 0.9 * free - (4 * par + 2 * out + max(main_sets, 1) * (3 * inp + out))
    k = min(2, args.sets)
    while k > 1 and par + k * inp + 2 * out > 0.5 * spare:
        k -= 1
    if par + k * inp + 2 * out > 0.5 * spare:
        return {"skip": "its copy of the model and an input set (%s) would not fit beside the reference"
                % _human(par + k * inp + 2 * out)}
    model = problem.build_model(args.seed, device)
    sets = [problem.inputs(args.seed + 1 + i, device) for i in range(k)]
    try:
        compiled = torch.compile(model)
        with torch.no_grad():
            compiled(*sets[0])
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - the reference process compiles again and reports it
        return {"skip": "torch.compile failed here: %s: %s" % (type(e).__name__, _first_line(e, 200))}
    _answer_line({"compiled": True})
    if not sys.stdin.readline().strip():
        return {"skip": "cancelled"}
    with torch.no_grad():
        stats = ks_timing.Timer(device).measure(compiled, sets)
    return {"timing": stats}


def _answer_line(obj):
    """One JSON line on the caller's stdout, before the final answer (main's emit)."""
    _ANSWER[0].write(json.dumps(obj, allow_nan=False) + "\n")
    _ANSWER[0].flush()


def _files_request():
    """reference --then-files: the caller's one-line request on stdin after
    the signature: {"out": DIR, "sets": K, "time": bool, "transform_sets": T
    (room for T distribution-shifted sets; absent: none)}, or None when it
    closed stdin (it found what it needed elsewhere, or gave up)."""
    line = sys.stdin.readline()
    if not line.strip():
        return None
    try:
        req = json.loads(line)
        return str(req["out"]), int(req["sets"]), bool(req.get("time", False)), int(req.get("transform_sets", 0))
    except (ValueError, KeyError, TypeError) as e:
        raise BridgeError("bad_arguments", "bridge.py: bad request after the signature: %s: %r" % (e, line[:200]))


def cmd_reference(problem, args):
    global _RESIDENT
    if args.resident or args.then_files:
        if args.out:
            raise BridgeError("bad_arguments", "reference takes --out DIR, or --resident / --then-files, not both")
        sets, warning = args.sets, None
        if args.resident_min_bytes is not None or args.device_budget or args.then_files:
            # The caller has no signature yet: shape inference here, in the
            # process that has torch imported already, decides.
            sig = cmd_signature(problem, args)
            total = _spec_bytes(sig["parameters"]) + args.sets * (_spec_bytes(sig["inputs"]) +
                                                                  _spec_bytes(sig["outputs"]))
            stays = args.resident and (args.resident_min_bytes is None or total >= args.resident_min_bytes)
            if not stays and not args.then_files:
                return {"resident": False, "signature": sig}
            if not stays:
                # Too small to keep on the GPU: the caller sizes the file
                # cache entry from the signature and asks this process, which
                # has torch imported already, to write it (one python start,
                # not two).
                _answer_line({"resident": False, "signature": sig})
                req = _files_request()
                if req is None:
                    return None
                out, sets, do_time, room = req
                manifest = run_reference(problem, out, sets, args.seed, args.device, do_time, transform_room=room)
                write_manifest(out, manifest)
                return manifest
            plain, why = fit_resident(sig, args.sets, args.device_budget)
            if plain < min(args.sets, 2):
                raise BridgeError("out_of_memory", "%s: %s" % (problem.path, why))
            # The distribution-shifted sets share the room: where it is short,
            # judging sets beyond two make way for them (PrepareReference's rule).
            total, why_all = fit_resident(sig, args.sets + args.transform_sets, args.device_budget,
                                          args.transform_sets)
            sets = min(args.sets, max(min(args.sets, 2), total - args.transform_sets))
            room = max(0, min(args.transform_sets, total - sets))
            if sets < args.sets:
                warning = "using %d of the %d input sets asked for%s: %s" % (
                    sets, args.sets, " (and %d distribution-shifted set(s) in the room of the others)" % room
                    if sets < plain else "", why or why_all)
        else:
            room = args.transform_sets
        _RESIDENT = _Resident()
        manifest = run_reference(problem, None, sets, args.seed, args.device, args.time, resident=_RESIDENT,
                                 transform_room=room)
        manifest["resident"] = True
        if warning:
            manifest["warnings"].insert(0, warning)
        return manifest
    if not args.out:
        raise BridgeError("bad_arguments", "reference needs --out DIR (or --resident / --then-files)")
    manifest = run_reference(problem, args.out, args.sets, args.seed, args.device, args.time,
                             transform_room=args.transform_sets)
    write_manifest(args.out, manifest)
    return manifest


def hold_resident():
    """After the manifest: keep the tensors until the caller closes our stdin
    (it has copied or mapped them; it is also how the caller ends us)."""
    if _RESIDENT is None:
        return
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass


def cmd_check(problem, args):
    manifest = run_reference(problem, None, max(args.sets, 2), args.seed, args.device, False)
    return {"warnings": manifest["warnings"], "notes": manifest["notes"]}


def cmd_peaks(args):
    import torch
    import peaks
    if not torch.cuda.is_available():
        raise BridgeError("device_error", "measuring peaks needs a GPU, but torch %s sees no CUDA device"
                          % torch.__version__)
    count = torch.cuda.device_count()
    if not 0 <= args.index < count:
        raise BridgeError("device_error", "there is no CUDA device %d (torch sees %d)" % (args.index, count))
    if args.n < 256 or args.runs < 1:
        raise BridgeError("bad_arguments", "peaks needs --n >= 256 and --runs >= 1")
    return peaks.matmul_peaks(torch, args.index, args.n, args.runs)


# -- main ------------------------------------------------------------------------------


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _ArgumentError(message)


def _parser():
    p = _Parser(prog="bridge.py", description="kernelsearch reference bridge")
    sub = p.add_subparsers(dest="command")
    for name in ("signature", "reference", "check", "time-compiled"):
        s = sub.add_parser(name)
        s.add_argument("problem")
        s.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
        s.add_argument("--seed", type=int, default=42)
        s.add_argument("--sets", type=int, default=3 if name == "reference" else 2)
        if name == "reference":
            s.add_argument("--out")
            s.add_argument("--time", action="store_true")
            s.add_argument("--resident", action="store_true")
            s.add_argument("--then-files", action="store_true")
            s.add_argument("--resident-min-bytes", type=int, default=None)
            s.add_argument("--device-budget", type=int, default=0)
            # Room for this many distribution-shifted sets (transforms.py); 0: none.
            s.add_argument("--transform-sets", type=int, default=4)
        if name in ("signature", "reference"):
            # The problem's input list I of get_inputs_variants() instead of get_inputs() (other shapes).
            s.add_argument("--variant", type=int, default=None)
    s = sub.add_parser("peaks")
    s.add_argument("--index", type=int, default=0)
    s.add_argument("--n", type=int, default=8192)
    s.add_argument("--runs", type=int, default=10)
    return p


def main(argv):
    # The JSON answer goes to the original stdout; everything else (the problem's
    # prints, torch's warnings, C extensions writing to fd 1) goes to stderr.
    answer = os.fdopen(os.dup(1), "w")
    _ANSWER[0] = answer
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing.py

    def emit(obj, code):
        answer.write(json.dumps(obj, allow_nan=False) + "\n")
        answer.flush()
        return code

    try:
        args = _parser().parse_args(argv)
        if args.command is None:
            raise _ArgumentError("a subcommand is required: signature, reference, check or peaks")
    except _ArgumentError as e:
        return emit({"error": {"kind": "bad_arguments", "message": "bridge.py: %s" % e, "detail": ""}},
                    EXIT_BAD_PROBLEM)
    if args.command == "reference" and args.time and args.device == "cuda":
        # Before torch loads here: the helper's own import runs alongside.
        _COMPILE_HELPER[0] = CompileHelper.start(args)
    try:
        import torch  # noqa: F401 - fail here, clearly, when torch is missing
    except ImportError as e:
        return emit({"error": {"kind": "no_torch", "message": "%s cannot import torch: %s" % (sys.executable, e),
                               "detail": ""}}, EXIT_INTERNAL)
    what = "peaks" if args.command == "peaks" else args.problem
    try:
        if args.command == "peaks":
            return emit(cmd_peaks(args), 0)
        problem = Problem(args.problem).load()
        problem.variant = getattr(args, "variant", None)
        result = {"signature": cmd_signature, "reference": cmd_reference, "check": cmd_check,
                  "time-compiled": cmd_time_compiled}[args.command](
            problem, args)
        if result is None:  # the caller closed stdin instead of asking for more
            return 0
        code = emit(result, 0)
        hold_resident()
        return code
    except BridgeError as e:
        return emit({"error": {"kind": e.kind, "message": e.message, "detail": e.detail}}, EXIT_BAD_PROBLEM)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            return emit({"error": {"kind": "internal", "message": "%s: reference bridge failed: %s: %s"
                                   % (what, type(e).__name__, _first_line(e)), "detail": _traceback_tail(e)}},
                        EXIT_INTERNAL)
        return emit({"error": {"kind": "disk_full", "message": "%s: the disk filled while writing the reference (%s); "
                               "lower the cache cap (--cache-cap) or free space" % (what, _first_line(e)),
                               "detail": _traceback_tail(e)}}, EXIT_BAD_PROBLEM)
    except MemoryError as e:
        return emit({"error": {"kind": "out_of_memory", "message": "%s: out of host memory" % what,
                               "detail": _traceback_tail(e)}}, EXIT_BAD_PROBLEM)
    except Exception as e:  # noqa: BLE001 - a bug here must still answer in JSON
        return emit({"error": {"kind": "internal", "message": "%s: reference bridge failed: %s: %s"
                               % (what, type(e).__name__, _first_line(e)), "detail": _traceback_tail(e)}},
                    EXIT_INTERNAL)


if __name__ == "__main__":
    status = main(sys.argv[1:])
    # The answer is out and the files are written: the interpreter's teardown
    # (CUDA, torch, inductor's compile workers) would only keep the caller waiting.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
