"""Whether a reference can judge a kernel: the tolerance the evaluator will use,
degenerate outputs (a wrong kernel would pass), near-degenerate ones (notes),
and determinism (two runs of one input set must agree)."""

import math

from ks_bridge.errors import CHUNK_ELEMENTS
from ks_bridge.judge import DEFAULT_TOLERANCE, MAX_ROUNDING_REL_NORM, ROUNDING_FACTOR, base_tolerance  # noqa: F401
from ks_bridge.problem_file import _restore_state, _seed_everything
from ks_bridge.signature import _dtype_name


# The degenerate check asks "would a wrong kernel pass?", so it uses the
# tolerance the evaluator will use: judge.py's defaults (Signature::ToleranceFor
# in evaluator/signature.cc), widened for PyTorch's rounding as it does.
def _tolerance_for(problem, dtype, rounding=None):
    """(atol, rtol) of an output; `rounding` ({"rms", "rel_norm"}, float32
    outputs only) widens atol as the evaluator does."""
    atol, rtol = base_tolerance(problem.tolerance, dtype)
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
