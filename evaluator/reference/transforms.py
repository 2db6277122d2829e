"""Distribution-shifted input sets (the bridge's part of issue 27).

get_inputs() draws every judging set from one distribution (often values in
[0, 1) or a unit normal), and the model's parameters come from one
initialisation. A kernel can be exact there and wrong for the inputs and
weights a user's model feeds it: fp32 values split into two fp16 halves lose
their low half below fp16's normal range and overflow above 65,504; an exp
without the max subtracted overflows for large logits. So besides the
get_inputs() sets the bridge makes one set per transform of input set 0: its
floating-point input tensors transformed as named below, and the model's
float32 parameters (nn.Parameter, not buffers such as running statistics) by
the same transform; integer and bool inputs, scalars, buffers and half
precision parameters stay as they are. The set carries its own copy of the
parameters it changed (the evaluator gives that set its own parameter
buffers). The reference of each is the model's float64 output on the
transformed inputs and parameters (ks_bridge/truth.py), PyTorch's own float32
output where float64 cannot run; a set where PyTorch's float32 output is
itself wrong (attention logits scaled by 1e5: a different key wins the
softmax) is kept, judged against float64 with the per-block bound PyTorch
needs there, and its note says so. Where PyTorch's output is not finite, or
forward raises, with the parameters transformed, the set is made again with
the inputs alone (parameters kept, with a note); where it still is not finite
where set 0's was (the operator's domain: log of a negated input), or forward raises
(binary_cross_entropy of inputs above 1), the transform is dropped for that
problem, with a note. A candidate that fails one of these sets but passes
every get_inputs() set is still correct, and marked specialised with the first
transform that broke it (evaluator/gpu_evaluator_robust.cc).

A problem narrows or switches them off with INPUT_TRANSFORMS, a list of the
names below (the empty list: none); the default is all of them. The
parameters follow the inputs unless the problem says PARAMETER_TRANSFORMS, a
list of names as well ([]: parameters are never transformed).
"""

import math

# In the order the evaluator checks them: the first that breaks a kernel is named.
TRANSFORMS = ("scale_up", "scale_down", "sign_flip", "outliers")

# The scale factors by dtype: fp16's range ends at 65,504, so its inputs are
# scaled less (x 1e3 keeps a unit normal's tail finite); bf16 has fp32's range.
_SCALES = {
    "float16": (1e3, 1e-3),
    "default": (1e5, 1e-5),
}
# Outliers: one element in OUTLIER_EVERY (at least one per tensor), at seeded
# random positions, set to OUTLIER_FACTOR times the tensor's largest magnitude,
# keeping the element's sign (a positive-only input stays positive).
OUTLIER_EVERY = 1024
OUTLIER_FACTOR = 1e3

DESCRIPTIONS = {
    "scale_up": "floating-point inputs x 1e5 (x 1e3 for float16)",
    "scale_down": "floating-point inputs x 1e-5 (x 1e-3 for float16)",
    "sign_flip": "floating-point inputs negated",
    "outliers": "one element in %d of each floating-point input set to %g x the tensor's largest magnitude, "
                "sign kept" % (OUTLIER_EVERY, OUTLIER_FACTOR),
}


def check_metadata(value, what="INPUT_TRANSFORMS"):
    """None when INPUT_TRANSFORMS (or PARAMETER_TRANSFORMS) is well formed, else what is wrong with it."""
    if not isinstance(value, (list, tuple)) or any(not isinstance(v, str) for v in value):
        return "%s must be a list of transform names (%s), or [] for none; got %r" % (
            what, ", ".join(TRANSFORMS), value)
    unknown = [v for v in value if v not in TRANSFORMS]
    if unknown:
        return "%s names unknown transform(s) %s; known: %s" % (
            what, ", ".join(repr(u) for u in unknown), ", ".join(TRANSFORMS))
    return None


def chosen(module):
    """The transforms a problem module asks for, in TRANSFORMS' order."""
    value = getattr(module, "INPUT_TRANSFORMS", None)
    if value is None:
        return list(TRANSFORMS)
    return [t for t in TRANSFORMS if t in value]


def parameters_chosen(module):
    """The transforms that change the model's parameters too: PARAMETER_TRANSFORMS
    where the problem says it, else every transform the inputs have."""
    value = getattr(module, "PARAMETER_TRANSFORMS", None)
    if value is None:
        return chosen(module)
    return [t for t in TRANSFORMS if t in value]


def _floating(t):
    import torch
    return isinstance(t, torch.Tensor) and t.is_floating_point()


def has_floating_inputs(inputs):
    return any(_floating(v) for v in inputs)


def _scale(name, t):
    up, down = _SCALES.get(str(t.dtype).replace("torch.", ""), _SCALES["default"])
    return up if name == "scale_up" else down


def _absmax(t):
    """The largest finite magnitude of t, chunked (no multi-GB temporary)."""
    flat = t.detach().reshape(-1)
    best = 0.0
    step = 1 << 24
    for i in range(0, flat.numel(), step):
        c = flat[i:i + step].float().abs()
        c = c[c == c]  # no NaN
        if c.numel():
            best = max(best, float(c.max()))
    return best if math.isfinite(best) else 0.0


def _transform_tensor(name, v, seed, in_place):
    """Tensor v under transform `name` (v itself when in_place, else a new tensor)."""
    import torch
    if name in ("scale_up", "scale_down"):
        return v.mul_(_scale(name, v)) if in_place else v * _scale(name, v)
    if name == "sign_flip":
        return v.neg_() if in_place else -v
    if name == "outliers":
        t = v.detach() if in_place and v.is_contiguous() else v.detach().clone().contiguous()
        flat = t.reshape(-1)
        n = flat.numel()
        if n:
            count = max(1, n // OUTLIER_EVERY)
            g = torch.Generator()
            g.manual_seed(seed)
            idx = torch.randint(0, n, (count,), generator=g).to(flat.device)
            big = OUTLIER_FACTOR * (_absmax(t) or 1.0)
            finfo = torch.finfo(t.dtype)
            big = min(big, finfo.max / 4)  # an outlier, not an infinity
            values = torch.full((count,), big, dtype=t.dtype, device=flat.device)
            values[flat[idx] < 0] = -big
            flat[idx] = values
        return t
    raise ValueError("unknown transform %r" % name)


def apply(name, inputs, seed, in_place=False):
    """A new list: `inputs` (forward's arguments) with transform `name` applied
    to every floating-point tensor. Deterministic in (inputs, seed): the outlier
    positions come from a CPU generator seeded with `seed`. `in_place`: the
    tensors themselves are changed (no second copy of a multi-GB input)."""
    return [_transform_tensor(name, v, seed * 1000 + k, in_place) if _floating(v) else v
            for k, v in enumerate(inputs)]


# Parameters of these dtypes are transformed: a half-precision weight scaled
# by 1e-3 falls into fp16's subnormal range, where PyTorch's own rounding is
# as coarse as the error the check looks for.
_PARAMETER_DTYPES = ("torch.float32", "torch.float64")


def transformable_parameters(model):
    """Names of the model's parameters a transform changes: float32 and float64
    nn.Parameters, in named_parameters() order (buffers, such as BatchNorm's running
    statistics, describe the data and stay as they are)."""
    return [k for k, p in model.named_parameters() if str(p.dtype) in _PARAMETER_DTYPES and p.numel() > 0]


def apply_to_parameters(name, model, seed):
    """Transforms the model's transformable parameters in place (after the
    caller restored them): deterministic in (parameters, seed). Returns their
    names."""
    import torch
    names = transformable_parameters(model)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, pname in enumerate(names):
            p = params[pname].data
            t = _transform_tensor(name, p, seed * 1000 + 500 + k, in_place=True)
            if t.data_ptr() != p.data_ptr():  # a non-contiguous parameter's outliers: made in a copy
                p.copy_(t)
    return names


def nonfinite_count(t):
    """NaN and Inf elements of a floating tensor (0 for other dtypes), chunked."""
    import torch
    if not t.is_floating_point():
        return 0
    flat = t.detach().reshape(-1)
    n = 0
    step = 1 << 24
    for i in range(0, flat.numel(), step):
        c = flat[i:i + step]
        n += int(c.numel() - int(torch.isfinite(c).sum()))
    return n
