"""GPU timing of a callable, by the same method the C++ worker uses.

Kept apart from bridge.py so that benchmarks (e.g. an agreement check against
triton.testing.do_bench) can import it. The method, step by step, is the
contract: change it here and in the worker together, or the speedups that
compare a candidate with PyTorch stop meaning anything.

  * An L2 flush buffer of max(2 * L2 bytes, 64 MiB) int8 is zeroed before every
    measured call, so no call finds its inputs in L2 from the call before.
  * Each call: flush.zero_(); pad(); start.record(); fn(); end.record();
    torch.cuda.synchronize(); after.record(); after.synchronize(). Two
    figures: on the stream (start to end) and device-wide (start to after).
  * pad() keeps the GPU busy for about PAD_US microseconds after the flush
    (torch.cuda._sleep here, a globaltimer spin kernel in the worker), so
    that start.record() and fn's launches are queued before the GPU reaches
    the start event. Without it, a callable whose host side takes longer than
    the flush (a Python module's forward: tens of microseconds) had that host
    time counted as GPU time: the same softmax measured 0.035 ms and 0.065 ms
    in two runs on one H100, which made small kernels' speedups look larger.
  * The result is the on-stream series, unless work outlived the stream: when
    the device-wide median exceeds the on-stream median by more than
    SYNC_SLACK_MS + 10%, the device-wide series is taken. The device-wide sync
    makes work launched on other streams count; judging on medians keeps the
    host's wake-up latency (tens of microseconds, with occasional spikes) out
    of the figure, which is what put a sync before a single end event 4-9%
    above triton.testing.do_bench (H100, 2026-11-22).
  * Warm-up: at least 3 calls and at least 25 ms of measured call time
    (capped at WARMUP_MAX_CALLS calls, so that a near-empty callable cannot
    spin for minutes). The first call may include torch.compile's compilation
    or cuDNN autotuning; the estimate is the median of the warm-up calls so one
    slow first call does not skew it.
  * n = clamp(ceil(1000 ms / estimate), 10, 200) measured calls, rotating
    through the argument sets.
"""

import math
import statistics

import torch

FLUSH_MIN_BYTES = 64 << 20
DEFAULT_L2_BYTES = 50 << 20  # when the device does not report its L2 size
WARMUP_MIN_CALLS = 3
WARMUP_MIN_MS = 25.0
WARMUP_MAX_CALLS = 1000
TARGET_MS = 1000.0
MIN_RUNS = 10
MAX_RUNS = 200
SYNC_SLACK_MS = 0.1
PAD_US = 100.0
PAD_CLOCK_HZ = 2.0e9  # torch.cuda._sleep counts SM clock cycles; an upper bound on the clock keeps the pad >= PAD_US


def l2_bytes(device=None):
    props = torch.cuda.get_device_properties(device if device is not None else 0)
    size = getattr(props, "L2_cache_size", None)
    return int(size) if size else DEFAULT_L2_BYTES


def flush_bytes(device=None):
    return max(2 * l2_bytes(device), FLUSH_MIN_BYTES)


def run_count(estimate_ms):
    if estimate_ms <= 0:
        return MAX_RUNS
    return int(min(MAX_RUNS, max(MIN_RUNS, math.ceil(TARGET_MS / estimate_ms))))


def pad(us=PAD_US):
    """GPU work queued ahead of the start event (see the method above)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None and us > 0:
        sleep(int(us * 1e-6 * PAD_CLOCK_HZ))


def stats(times_ms):
    return {
        "median_ms": statistics.median(times_ms),
        "mean_ms": statistics.fmean(times_ms),
        "min_ms": min(times_ms),
        "max_ms": max(times_ms),
        "stddev_ms": statistics.pstdev(times_ms) if len(times_ms) > 1 else 0.0,
        "runs": len(times_ms),
    }


def choose_series(on_stream, device_wide):
    """The on-stream times, unless work consistently outlived the stream."""
    a, b = statistics.median(on_stream), statistics.median(device_wide)
    return device_wide if b - a > SYNC_SLACK_MS + 0.1 * a else on_stream


class Timer:
    """Owns the flush buffer and the two events; reuse it across callables."""

    def __init__(self, device=None, pad_us=PAD_US):
        self.device = torch.device(device if device is not None else "cuda")
        self.pad_us = pad_us  # 0 only for benchmarks that show what the pad changes
        self.flush = torch.empty(flush_bytes(self.device), dtype=torch.int8, device=self.device)
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)
        self.after = torch.cuda.Event(enable_timing=True)

    def call_ms(self, fn, args):
        self.flush.zero_()
        pad(self.pad_us)
        self.start.record()
        fn(*args)
        self.end.record()
        torch.cuda.synchronize()
        self.after.record()
        self.after.synchronize()
        return self.start.elapsed_time(self.end), self.start.elapsed_time(self.after)

    def measure(self, fn, arg_sets):
        """Times fn(*args) rotating over arg_sets (a non-empty list of lists)."""
        if not arg_sets:
            raise ValueError("measure needs at least one argument set")
        warm = []
        total = 0.0
        while len(warm) < WARMUP_MIN_CALLS or (total < WARMUP_MIN_MS and len(warm) < WARMUP_MAX_CALLS):
            t, _ = self.call_ms(fn, arg_sets[len(warm) % len(arg_sets)])
            warm.append(t)
            total += t
        n = run_count(statistics.median(warm))
        pairs = [self.call_ms(fn, arg_sets[i % len(arg_sets)]) for i in range(n)]
        return stats(choose_series([p[0] for p in pairs], [p[1] for p in pairs]))


def time_model(model, arg_sets, device=None, compile_model=True, phases=None):
    """Times eager forward and torch.compile(model) on the same inputs.

    Returns (eager_stats, compiled_stats_or_None, warnings). `phases`, when
    given, receives the wall seconds of each ("eager timing", "torch.compile
    timing": compilation included).
    """
    import time
    warnings = []
    timer = Timer(device)
    phases = {} if phases is None else phases
    with torch.no_grad():
        t0 = time.monotonic()
        eager = timer.measure(model, arg_sets)
        phases["eager timing"] = time.monotonic() - t0
        t0 = time.monotonic()
        compiled = None
        if compile_model:
            if not hasattr(torch, "compile"):
                warnings.append("torch.compile timing skipped: torch %s has no torch.compile (needs >= 2.0)"
                                % torch.__version__)
            else:
                try:
                    compiled_model = torch.compile(model)
                    compiled = timer.measure(compiled_model, arg_sets)
                except Exception as e:  # noqa: BLE001 - any compile failure is a reported fact
                    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    warnings.append("torch.compile failed, no compiled timing: %s: %s"
                                    % (type(e).__name__, msg[:300]))
        phases["torch.compile timing"] = time.monotonic() - t0
    return eager, compiled, warnings
