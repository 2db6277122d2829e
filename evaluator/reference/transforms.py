"""Distribution-shifted input sets (the bridge's part of issue 27).

get_inputs() draws every judging set from one distribution (often values in
[0, 1) or a unit normal). A kernel can be exact there and wrong for the inputs
a user's model feeds it: fp32 values split into two fp16 halves lose their
low half below fp16's normal range and overflow above 65,504; an exp without
the max subtracted overflows for large logits. So besides the get_inputs()
sets the bridge makes one set per transform of input set 0: its floating-point
input tensors transformed as named below, integer and bool inputs, scalars and
parameters as they are (parameters live once in the evaluator's arena, shared
by every set). The reference of each is PyTorch's own output on the
transformed inputs. A transform whose reference is not finite where set 0's
was (the operator's domain: log of a negated input), or whose forward raises
(binary_cross_entropy of inputs above 1), is dropped for that problem, with a
note. A candidate that fails one of these sets but passes every get_inputs()
set is still correct, and marked specialised with the first transform that
broke it (evaluator/gpu_evaluator.cc).

A problem narrows or switches them off with INPUT_TRANSFORMS, a list of the
names below (the empty list: none). The default is all of them.
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


def check_metadata(value):
    """None when INPUT_TRANSFORMS is well formed, else what is wrong with it."""
    if not isinstance(value, (list, tuple)) or any(not isinstance(v, str) for v in value):
        return "INPUT_TRANSFORMS must be a list of transform names (%s), or [] for none; got %r" % (
            ", ".join(TRANSFORMS), value)
    unknown = [v for v in value if v not in TRANSFORMS]
    if unknown:
        return "INPUT_TRANSFORMS names unknown transform(s) %s; known: %s" % (
            ", ".join(repr(u) for u in unknown), ", ".join(TRANSFORMS))
    return None


def chosen(module):
    """The transforms a problem module asks for, in TRANSFORMS' order."""
    value = getattr(module, "INPUT_TRANSFORMS", None)
    if value is None:
        return list(TRANSFORMS)
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


def apply(name, inputs, seed, in_place=False):
    """A new list: `inputs` (forward's arguments) with transform `name` applied
    to every floating-point tensor. Deterministic in (inputs, seed): the outlier
    positions come from a CPU generator seeded with `seed`. `in_place`: the
    tensors themselves are changed (no second copy of a multi-GB input)."""
    import torch
    out = []
    for k, v in enumerate(inputs):
        if not _floating(v):
            out.append(v)
            continue
        if name in ("scale_up", "scale_down"):
            out.append(v.mul_(_scale(name, v)) if in_place else v * _scale(name, v))
        elif name == "sign_flip":
            out.append(v.neg_() if in_place else -v)
        elif name == "outliers":
            t = v.detach() if in_place and v.is_contiguous() else v.detach().clone().contiguous()
            flat = t.reshape(-1)
            n = flat.numel()
            if n:
                count = max(1, n // OUTLIER_EVERY)
                g = torch.Generator()
                g.manual_seed(seed * 1000 + k)
                idx = torch.randint(0, n, (count,), generator=g).to(flat.device)
                big = OUTLIER_FACTOR * (_absmax(t) or 1.0)
                finfo = torch.finfo(t.dtype)
                big = min(big, finfo.max / 4)  # an outlier, not an infinity
                values = torch.full((count,), big, dtype=t.dtype, device=flat.device)
                values[flat[idx] < 0] = -big
                flat[idx] = values
            out.append(t)
        else:
            raise ValueError("unknown transform %r" % name)
    return out


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
