"""Loading a problem file (DESIGN.md, contract 1) and running its code: the
module, its metadata, the model, input sets by seed, forward, and the model's
state to restore between runs. Every failure of user code becomes a
BridgeError naming the file and line."""

import inspect
import math
import numbers
import os
import random
import sys
import traceback

from ks_bridge.errors import BridgeError, _first_line, _traceback_tail
from ks_bridge.meta import _meta_mode_class


# The keys a problem's TOLERANCE may have. atol/rtol are element-wise; rel_norm, large_rel and large_share bound the
# relative norm of the error and the share of large relative errors (see
# Tolerance in evaluator/signature.h). Absent keys take the evaluator's rule.
TOLERANCE_KEYS = ("atol", "rtol", "rel_norm", "large_rel", "large_share")


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


def resolve_device(problem, requested):
    import torch
    if requested in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise BridgeError("device_error", "%s: --device cuda was asked for but torch %s sees no CUDA device"
                          % (problem.path, torch.__version__))
    return torch.device(requested)


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
