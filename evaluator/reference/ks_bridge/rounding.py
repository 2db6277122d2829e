"""The float64 machinery (the same model and input set in float64, its
time and memory budget: truth.py runs it on every set) and the distance of
PyTorch's default precision (TF32) from the fp32 reference; the settings a
baseline is timed under (timing_precision)."""

import contextlib
import math

from ks_bridge.errors import BridgeError, CHUNK_ELEMENTS
from ks_bridge.judge import MAX_ROUNDING_REL_NORM, ROUNDING_FACTOR  # noqa: F401 - re-exported
from ks_bridge.problem_file import _restore_state, _seed_everything


# PyTorch's own rounding error (the reference in float32 against the same model
# run in float64) widens a float32 output's tolerance: a candidate may be at
# most ROUNDING_FACTOR times as inaccurate as PyTorch itself (a sum over 8192
# cancelling terms differs by ~1e-4 between two honest summation orders).
# Beyond MAX_ROUNDING_REL_NORM the float64 run is not measuring rounding (a
# data-dependent branch, a problem that needs its own TOLERANCE) and nothing is
# widened. The constants are judge.py's, the rule Signature::ToleranceFor(const
# TensorSpec&) in evaluator/signature.cc.


# The float64 run is skipped when it would take longer than this (seconds;
# $KS_FP64_CHECK_MAX_S): a first evaluation has a budget of its own.
FP64_CHECK_MAX_S = 3.0


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


_SPEED_RATIO = {}  # device -> _float64_speed_ratio's answer, measured once per process


def _float64_speed_ratio(device):
    """How many times longer float64 work takes than float32 here, at least 2
    (twice the bytes): a 1024^3 matmul of each, timed after one warm-up (once
    per device and process)."""
    import time
    import torch
    if device.type != "cuda":
        return 2.0
    if str(device) in _SPEED_RATIO:
        return _SPEED_RATIO[str(device)]
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
    _SPEED_RATIO[str(device)] = max(2.0, times[1] / max(times[0], 1e-9))
    return _SPEED_RATIO[str(device)]


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


# The precision contracts whose baselines are timed with lower-precision
# matmuls and convolutions (issue 36): torch.set_float32_matmul_precision(level)
# with cuDNN TF32 on. Under the others (highest, kernelbench) eager and
# torch.compile are timed at PyTorch's defaults.
TIMING_LEVELS = ("high", "medium")


@contextlib.contextmanager
def timing_precision(level):
    """PyTorch's settings for timing a baseline under precision contract
    `level` ("high" or "medium": torch.set_float32_matmul_precision(level) and
    torch.backends.cudnn.allow_tf32 = True; None: left as they are), the
    previous settings restored afterwards. torch.compile reads them when it
    compiles, so it compiles inside as well as times."""
    import torch
    if level is None:
        yield
        return
    if level not in TIMING_LEVELS:
        raise BridgeError("bad_arguments", "timing precision must be one of %s, not %r" % (", ".join(TIMING_LEVELS),
                                                                                          level))
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32,
             torch.backends.cuda.matmul.allow_tf32)
    try:
        torch.set_float32_matmul_precision(level)
        torch.backends.cudnn.allow_tf32 = True
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]
        if torch.backends.cuda.matmul.allow_tf32 != saved[2]:  # where the two are not one setting
            torch.backends.cuda.matmul.allow_tf32 = saved[2]


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
