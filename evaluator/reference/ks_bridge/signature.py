"""The signature: each input, parameter and output by name, dtype and shape
(SignatureFromJson in evaluator/signature.cc reads it), inferred on the meta
device where the problem allows."""

import math
import numbers
import os

from ks_bridge.meta import _add_missing_meta_kernels, _meta_mode_class
from ks_bridge.problem_file import _as_list


SUPPORTED_DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8", "bool")


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
