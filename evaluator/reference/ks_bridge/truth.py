"""The truth of an input set (issue 36): the same model and inputs in
float64, cast to each floating output's dtype, is the set's reference; and how
far PyTorch's own result is from it, per block of judge.BOUND_BLOCK elements
and per precision level (judge.BOUND_LEVELS), which bounds how far a kernel
held to that level may be.

PyTorch's float32 output is not the truth where the problem is ill-conditioned
(attention logits scaled by 1e5: one ulp of a logit picks another key): an
exact kernel would be rejected for agreeing with float64. Where float64 cannot
run (over the time or memory budget, an op without float64 support) the set
keeps PyTorch's output as its reference and has no bounds ("truth":
"float32", with the reason).
"""

import math
import os

from ks_bridge.errors import BridgeError, CHUNK_ELEMENTS, _first_line, _human
from ks_bridge.judge import BOUND_BLOCK, BOUND_LEVELS, MAX_ROUNDING_REL_NORM, base_tolerance
from ks_bridge.problem_file import _seed_everything
from ks_bridge.rounding import (FP64_CHECK_MAX_S, _float64_fits, _float64_speed_ratio, _float_bytes64,
                                _forward_float64)
from ks_bridge.signature import _dtype_name

FLOATING = ("float32", "float16", "bfloat16")


def bound_key(output, level):
    """The name under which a set's files (or resident tensors) hold the bounds
    of `output` at precision level `level`: "out@highest"."""
    return "%s@%s" % (output, level)


class SetTruth:
    """One set's truth and PyTorch's distance from it (compute_truth).

    truth     "float64" when the float64 run gave at least one output, else "float32"
    note      why float64 was not run, or which outputs it left out (None: nothing to say)
    refs      {output: the float64 result cast to the output's dtype}, outputs with a truth only
    bounds    {output: {level: float32 tensor of per-block bounds, or None where
              that level gives the bits of "highest" (the same file)}}
    errors    {output: {"rms", "rel_norm", "max_abs", "ill_conditioned"}}: PyTorch's
              "highest" output against the float64 one
    """

    def __init__(self, truth="float32", note=None):
        self.truth, self.note = truth, note
        self.refs, self.bounds, self.errors = {}, {}, {}
        self.seconds = 0.0  # the float64 run and the lower levels' runs

    def reference(self, name, pytorch_out):
        """What the set's file for output `name` holds: the truth, or PyTorch's output."""
        return self.refs.get(name, pytorch_out)

    def bound_tensors(self, name):
        """[(key, tensor)] of output `name`'s bounds: a level with the bits of
        "highest" gets highest's tensor (the same object: one file, one export)."""
        levels = self.bounds.get(name)
        if not levels:
            return []
        return [(bound_key(name, level), levels[level] if levels.get(level) is not None else levels["highest"])
                for level in BOUND_LEVELS]

    def rounding(self, dtype_of):
        """{output: {"rms", "rel_norm"}} of the float32 outputs: PyTorch's own
        float32 rounding, which widens their tolerance (Signature::reference_error)."""
        return {name: {"rms": e["rms"], "rel_norm": e["rel_norm"]} for name, e in self.errors.items()
                if dtype_of[name] == "float32"}

    def ill_conditioned(self):
        return sum(e["ill_conditioned"] for e in self.errors.values())

    def manifest_fields(self):
        """The set's manifest entry's part: truth, truth_note, pytorch_error, bound_block."""
        return {"truth": self.truth, "truth_note": self.note, "pytorch_error": self.errors,
                "bound_block": BOUND_BLOCK}

    def release(self):
        """Drops the tensors (the caller wrote or kept what it needs)."""
        self.refs, self.bounds = {}, {}


def _up_to_float32(v):
    """float64 tensor v in float32, rounded up where the nearest float32 is
    smaller: a bound must never understate PyTorch's error."""
    import torch
    f = v.to(torch.float32)
    low = f.to(torch.float64) < v
    if bool(low.any()):
        f = torch.where(low, torch.nextafter(f, torch.full_like(f, math.inf)), f)
    return f


def compare(pt, t64, atol, rtol, stats=True):
    """PyTorch's output pt against the float64 truth t64 (same shape), chunked:
    (per-block bounds, a float32 tensor of ceil(numel / BOUND_BLOCK) entries on
    pt's device, each the largest |pt - t64| of its block computed in float64,
    +inf where one side is not finite and they differ, 0 where both are the
    same NaN/Inf; stats or None: {"rms", "rel_norm", "max_abs"} over the
    elements finite in both, and "ill_conditioned", the elements where pt fails
    |pt - t64| <= atol + rtol * |t64|)."""
    import torch
    a, b = pt.detach().reshape(-1), t64.detach().reshape(-1)
    n = a.numel()
    bounds = torch.zeros((n + BOUND_BLOCK - 1) // BOUND_BLOCK, dtype=torch.float32, device=a.device)
    ssd = ssr = worst = 0.0
    count = ill = 0
    step = CHUNK_ELEMENTS - CHUNK_ELEMENTS % BOUND_BLOCK  # whole blocks per chunk
    for i in range(0, n, step):
        x, y = a[i:i + step].to(torch.float64), b[i:i + step].to(torch.float64)
        d = (x - y).abs()
        finite = torch.isfinite(x) & torch.isfinite(y)
        all_finite = bool(finite.all())
        if not all_finite:
            same = (x == y) | (torch.isnan(x) & torch.isnan(y))
            d = d.masked_fill(~finite, math.inf).masked_fill(~finite & same, 0.0)
        if stats:
            ill += int((d > atol + rtol * y.abs()).sum())
            fd, fy = (d, y) if all_finite else (d[finite], y[finite])
            if fd.numel():
                ssd += float((fd * fd).sum())
                ssr += float((fy * fy).sum())
                worst = max(worst, float(fd.max()))
                count += fd.numel()
            del fd, fy
        pad = (-d.numel()) % BOUND_BLOCK
        if pad:
            d = torch.cat([d, d.new_zeros(pad)])
        first = i // BOUND_BLOCK
        blocks = d.view(-1, BOUND_BLOCK).amax(1)
        bounds[first:first + blocks.numel()] = _up_to_float32(blocks)
        del x, y, d, finite, blocks
    if not stats:
        return bounds, None
    rms = math.sqrt(ssd / count) if count else 0.0
    # A float64 result of zeros that float32 misses: as far from rounding as it gets.
    rel = math.sqrt(ssd / ssr) if ssr > 0 else (0.0 if ssd == 0 else 1.0)
    return bounds, {"rms": rms, "rel_norm": rel, "max_abs": worst, "ill_conditioned": ill}


def _forward_at_level(problem, model, set_seed, device, level, prepare, make_inputs):
    """forward in float32 at precision level `level` ("high": TF32 matmuls and
    cuDNN convolutions; "medium": bf16-pass matmuls, cuDNN in TF32), from the
    set's pre-forward state (prepare) on its inputs. The flags are restored after."""
    import torch
    matmul = torch.backends.cuda.matmul
    saved = (torch.get_float32_matmul_precision(), matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.set_float32_matmul_precision(level)
        torch.backends.cudnn.allow_tf32 = True
        prepare()
        inputs = make_inputs()
        _seed_everything(set_seed)
        return problem.forward(model, inputs)
    finally:
        torch.set_float32_matmul_precision(saved[0])
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[1], saved[2]


def _levels_here(device):
    """The levels other than "highest" at which PyTorch may compute otherwise here."""
    import torch
    if device.type != "cuda" or not hasattr(torch, "set_float32_matmul_precision"):
        return []
    return [level for level in BOUND_LEVELS if level != "highest"]


def compute_truth(problem, model, set_seed, device, outputs, inputs, forward_s, peak_forward_bytes, prepare,
                  make_inputs=None, max_s=None, dtypes=FLOATING, levels=True):
    """The truth of one set (a SetTruth): `outputs`, PyTorch's [(name,
    tensor)] at "highest" (TF32 off); `inputs` the set's (for their sizes);
    `forward_s` a float32 forward's wall time and `peak_forward_bytes` what it
    allocated on the GPU. prepare() puts the model in the set's pre-forward
    state (parameters transformed, for a shifted set); make_inputs() makes the
    set's inputs again (forward may have changed them; default: get_inputs()
    with the set's seed). Outputs of `dtypes` only; with `levels`, on a GPU,
    the model runs again at "high" and "medium" for their bounds.

    float64 is skipped (truth "float32", a note) when it would take longer
    than max_s (default $KS_FP64_CHECK_MAX_S or FP64_CHECK_MAX_S), from the
    float32 forward's time and the device's float64 speed, would not fit the
    GPU's memory, or fails (an op without float64 support, a dtype check).
    The float64 copies are freed before it returns. The model's state is left
    to the caller to restore."""
    import time
    import torch
    if make_inputs is None:
        def make_inputs():
            return problem.inputs(set_seed, device)
    dtype_of = {name: _dtype_name(t) for name, t in outputs}
    names = [name for name, _ in outputs if dtype_of[name] in dtypes]
    if not names:
        return SetTruth("float32", "no %s output: PyTorch's output is the reference" % " or ".join(dtypes))
    what = "the float64 run that makes this set's reference"
    keep = "PyTorch's float32 output is the reference"
    limit = float(os.environ.get("KS_FP64_CHECK_MAX_S", FP64_CHECK_MAX_S)) if max_s is None else max_s
    ratio = _float64_speed_ratio(device)
    extra = len(_levels_here(device)) if levels else 0
    if forward_s * (ratio + extra) > limit:
        return SetTruth("float32", "%s was skipped: it would take about %.1f s (float32 forward %.2f s, float64 %.0fx "
                        "slower on this device%s; limit %.1f s, $KS_FP64_CHECK_MAX_S); %s"
                        % (what, forward_s * (ratio + extra), forward_s, ratio,
                           ", %d more float32 runs at lower precision levels" % extra if extra else "", limit, keep))
    # The float parameters and inputs again in float64, and forward's own allocations twice over.
    need = _float_bytes64(list(model.parameters()) + list(model.buffers()) + list(inputs)) + 2 * peak_forward_bytes
    fits, available = _float64_fits(need, device)
    if not fits:
        return SetTruth("float32", "%s was skipped: it needs about %s of GPU memory and %s is available; %s"
                        % (what, _human(need), _human(available), keep))
    oom = getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    t0 = time.monotonic()
    try:
        prepare()
        result = _forward_float64(problem, model, set_seed, device, make_inputs)
        if len(result) != len(outputs):
            raise ValueError("forward returns %d outputs in float64, %d in float32" % (len(result), len(outputs)))
    except oom:
        _free(device)
        return SetTruth("float32", "%s ran out of GPU memory; %s" % (what, keep))
    except Exception as e:  # noqa: BLE001 - any failure in float64 means "no truth"
        _free(device)
        return SetTruth("float32", "%s failed (%s: %s); %s" % (what, type(e).__name__, _first_line(e, 200), keep))
    st = SetTruth("float64")
    truth64, left_out = {}, []
    for (name, pt), (_, t64) in zip(outputs, result):
        if name not in names:
            continue
        # A forward that casts its output to half precision itself returns that
        # dtype from the float64 model too: the float64 computation, rounded
        # once by the model's own cast, is the truth there. (A float32 result
        # from the float64 model is not: forward computed it in float32.)
        half = pt.dtype in (torch.float16, torch.bfloat16) and t64.dtype == pt.dtype
        if t64.shape != pt.shape or not (t64.dtype == torch.float64 or half):
            left_out.append(name)
            continue
        t64 = t64.double()
        truth64[name] = t64
        atol, rtol = base_tolerance(getattr(problem, "tolerance", None), dtype_of[name])
        st.refs[name] = t64.to(pt.dtype)
        bounds, st.errors[name] = compare(pt, t64, atol, rtol)
        st.bounds[name] = {"highest": bounds}
    del result
    if left_out:
        st.note = ("%s gave no float64 result of the same shape for %s (does forward cast to float32?): PyTorch's "
                   "output is %s reference" % (what, ", ".join("'%s'" % n for n in left_out),
                                                "its" if len(left_out) == 1 else "their"))
    if not truth64:
        st.truth = "float32"
    elif levels:
        st.note = _level_bounds(st, problem, model, set_seed, device, outputs, truth64, prepare, make_inputs,
                                st.note)
    del truth64
    _free(device)
    st.seconds = time.monotonic() - t0
    return st


def _level_bounds(st, problem, model, set_seed, device, outputs, truth64, prepare, make_inputs, note):
    """st.bounds[output][level] for the levels other than "highest": None
    where PyTorch gives the same bits as at "highest" (a CPU, no matmul or
    convolution, a GPU without TF32). Returns the note, extended where a
    level's run failed (its bounds are then highest's)."""
    import torch
    oom = getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    pt = dict(outputs)
    for level in _levels_here(device):
        try:
            result = _forward_at_level(problem, model, set_seed, device, level, prepare, make_inputs)
        except (BridgeError, oom) as e:
            why = e.message[:200] if isinstance(e, BridgeError) else "out of GPU memory"
            extra = "the run at precision level '%s' failed (%s): its bounds are those of 'highest'" % (level, why)
            note = extra if note is None else note + "; " + extra
            continue
        for name, t in result:
            if name not in truth64 or t.shape != pt[name].shape or t.dtype != pt[name].dtype or \
                    torch.equal(t, pt[name]):
                continue
            st.bounds[name][level], _ = compare(t, truth64[name], 0.0, 0.0, stats=False)
        del result
    return note


def _free(device):
    import torch
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the float64 copies, before the next input set


def ill_conditioned_note(count):
    """The note of a shifted set where PyTorch's own float32 result fails the element rule against float64."""
    return ("PyTorch's own float32 result differs from float64 on %d element%s: ill-conditioned; judged against "
            "float64 with the bound PyTorch itself needs there" % (count, "" if count == 1 else "s"))


def rounding_notes(errors):
    """Notes for float32 outputs whose float32 and float64 results differ by
    more than rounding explains (their tolerance is not widened)."""
    return ["output '%s': the float32 and float64 references differ by %.3g (relative norm), more than float32 "
            "rounding explains (%g): its tolerance is not widened (a problem this ill-conditioned needs a "
            "TOLERANCE of its own)" % (name, e["rel_norm"], MAX_ROUNDING_REL_NORM)
            for name, e in errors.items() if e["rel_norm"] > MAX_ROUNDING_REL_NORM]


def measure_rounding(problem, model, set_seed, device, outputs, inputs, forward_s, peak_forward_bytes,
                     make_inputs=None, max_s=None):
    """PyTorch's own rounding error for each float32 output of one input set
    (the model as it is, the set's float64 run without the other levels):
    ({name: {"rms", "rel_norm"}}, note or None), the note saying why the run
    was skipped or an output left out, or which outputs are beyond rounding."""
    if not any(_dtype_name(t) == "float32" for _, t in outputs):
        return {}, None
    st = compute_truth(problem, model, set_seed, device, outputs, inputs, forward_s, peak_forward_bytes,
                       prepare=lambda: None, make_inputs=make_inputs, max_s=max_s, dtypes=("float32",),
                       levels=False)
    errors = st.rounding({name: _dtype_name(t) for name, t in outputs})
    notes = ([st.note] if st.note else []) + rounding_notes(errors)
    return errors, "; ".join(notes) if notes else None
