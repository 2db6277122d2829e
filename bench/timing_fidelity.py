#!/usr/bin/env python3
"""Benchmark A, part (a): our reference timing method against triton.testing.do_bench.

For each op, the same PyTorch call on the same tensors is timed by
  ours    evaluator/reference/timing.py Timer.measure (L2 flush, events around the
          call with a device-wide synchronize before the end event, warm-up,
          adaptive run count, median), and by
  triton  triton.testing.do_bench(fn, warmup, rep, return_mode="median") (flushes
          L2 itself by zeroing a 256 MB buffer before every call; events only).
in ROUNDS alternating rounds; each method's figure is the median of its per-round
medians. Two diagnostic columns time our method without the device-wide
synchronize (events only, what do_bench does) and without the pad before the
start event (the method before 2026-11-22), to attribute a difference. Difference = (ours - triton) / triton; target |difference| <= 3% on
every op that is not marked informational.

  python3 bench/timing_fidelity.py --out FILE.json [--rounds 2] [--rep-ms 500]

Needs torch with CUDA and triton. timing.py is imported from
dist/share/kernelsearch/reference when present, else evaluator/reference.
"""

import argparse
import inspect
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def import_timing():
    for d in (os.environ.get("KS_REFERENCE_DIR", ""), os.path.join(ROOT, "dist", "share", "kernelsearch", "reference"),
              os.path.join(ROOT, "evaluator", "reference")):
        if d and os.path.isfile(os.path.join(d, "timing.py")):
            sys.path.insert(0, d)
            import timing  # noqa: E402
            return timing, os.path.join(d, "timing.py")
    sys.exit("timing_fidelity: timing.py not found (looked in dist/share/kernelsearch/reference and evaluator/reference)")


def make_ops(torch):
    F = torch.nn.functional
    dev = "cuda"
    g = torch.Generator(device=dev)
    g.manual_seed(0)

    def rnd(*shape):
        return torch.randn(*shape, device=dev, generator=g)

    ops = []
    x = rnd(4096, 16384)
    ops.append(("softmax", "softmax(x, dim=1), x 4096x16384 fp32", lambda x=x: torch.softmax(x, dim=1), False))
    xl, w, b = rnd(16384, 4096), rnd(4096), rnd(4096)
    ops.append(("layernorm", "layer_norm(x, (4096,), w, b), x 16384x4096 fp32",
                lambda: F.layer_norm(xl, (4096,), w, b), False))
    xg = rnd(8192, 16384)
    ops.append(("gelu", "gelu(x, tanh), x 8192x16384 fp32", lambda: F.gelu(xg, approximate="tanh"), False))
    a, bm = rnd(4096, 4096), rnd(4096, 4096)
    ops.append(("matmul", "A @ B, 4096x4096 fp32, TF32 off", lambda: a @ bm, False))
    xs = rnd(16384, 16384)
    ops.append(("row_sum", "sum(x, dim=1), x 16384x16384 fp32", lambda: xs.sum(dim=1), False))
    xm = rnd(2048, 4096)
    softmax_module = torch.nn.Softmax(dim=1).cuda()
    ops.append(("softmax_module", "nn.Softmax(dim=1) module, x 2048x4096 fp32 (informational: ~35 us, below the 50 us "
                "the target covers; shows a module call's host time is not counted)",
                lambda: softmax_module(xm), True))
    xt = rnd(1024, 1024)
    ops.append(("tiny_scale", "x * 2 + 1, x 1024x1024 fp32 (informational: launch-bound, a few us)",
                lambda: xt * 2 + 1, True))
    return ops


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("FIDELITY_ROUNDS", "2")))
    ap.add_argument("--warmup-ms", type=int, default=100, help="do_bench warmup (ms)")
    ap.add_argument("--rep-ms", type=int, default=500, help="do_bench rep (ms)")
    ap.add_argument("--target-pct", type=float, default=3.0)
    args = ap.parse_args()

    try:
        import torch
    except Exception as e:  # noqa: BLE001
        sys.exit("timing_fidelity: cannot import torch: %s" % e)
    if not torch.cuda.is_available():
        sys.exit("timing_fidelity: torch %s sees no CUDA device" % torch.__version__)
    try:
        import triton
        from triton.testing import do_bench
    except Exception as e:  # noqa: BLE001
        sys.exit("timing_fidelity: cannot import triton.testing.do_bench: %s" % e)
    timing, timing_path = import_timing()

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    params = inspect.signature(do_bench).parameters
    kw = {"warmup": args.warmup_ms, "rep": args.rep_ms}
    if "return_mode" in params:
        kw["return_mode"] = "median"
    else:
        kw["quantiles"] = [0.5]
    if "fast_flush" in params:  # triton 2.x / early 3.x; later versions always flush
        kw["fast_flush"] = True
    do_bench_sig = "do_bench%s" % (inspect.signature(do_bench),)

    timer = timing.Timer()

    class NoSyncTimer(timing.Timer):
        """Diagnostic only: our method without any device-wide sync (events around
        the call, like do_bench), to attribute a difference. (Until 2026-11-22
        11:30 UTC this column had no pad either.)"""

        def call_ms(self, fn, args):
            self.flush.zero_()
            timing.pad(self.pad_us)
            self.start.record()
            fn(*args)
            self.end.record()
            self.end.synchronize()
            t = self.start.elapsed_time(self.end)
            return t, t  # (on-stream, device-wide), as Timer.call_ms returns

    nosync = NoSyncTimer()
    nopad = timing.Timer(pad_us=0)  # diagnostic: the method before the pad (host time may count)
    results = []
    t_start = time.time()
    with torch.no_grad():
        for name, desc, fn, informational in make_ops(torch):
            fn()
            torch.cuda.synchronize()
            ours, theirs, ours_stats, nos, nop = [], [], [], [], []
            for r in range(args.rounds):
                order = ("ours", "triton", "nosync", "nopad") if r % 2 == 0 else ("nopad", "nosync", "triton", "ours")
                for m in order:
                    if m == "ours":
                        s = timer.measure(fn, [[]])
                        ours.append(s["median_ms"])
                        ours_stats.append(s)
                    elif m == "nosync":
                        nos.append(nosync.measure(fn, [[]])["median_ms"])
                    elif m == "nopad":
                        nop.append(nopad.measure(fn, [[]])["median_ms"])
                    else:
                        v = do_bench(fn, **kw)
                        theirs.append(float(v[0] if isinstance(v, (list, tuple)) else v))
            o, t, ns, npd = (statistics.median(ours), statistics.median(theirs), statistics.median(nos),
                             statistics.median(nop))
            diff = (o - t) / t * 100.0 if t > 0 else float("nan")
            row = {"op": name, "what": desc, "informational": informational,
                   "ours_ms": o, "triton_ms": t, "diff_pct": diff,
                   "ours_rounds_ms": ours, "triton_rounds_ms": theirs,
                   "ours_nosync_ms": ns, "nosync_diff_pct": (ns - t) / t * 100.0 if t > 0 else float("nan"),
                   "ours_nopad_ms": npd, "nopad_diff_pct": (npd - t) / t * 100.0 if t > 0 else float("nan"),
                   "ours_runs": [s["runs"] for s in ours_stats],
                   "ours_stddev_ms": [s["stddev_ms"] for s in ours_stats],
                   "within_target": abs(diff) <= args.target_pct}
            results.append(row)
            print("%-14s ours %.4f ms  triton %.4f ms  diff %+.2f%%  (without the sync %.4f ms, without the pad "
                  "%.4f ms)%s" % (name, o, t, diff, ns, npd, "  (informational)" if informational else ""),
                  file=sys.stderr)
            del fn
    gated = [r for r in results if not r["informational"]]
    out = {
        "torch": torch.__version__, "triton": getattr(triton, "__version__", "?"),
        "device": torch.cuda.get_device_name(0), "timing_py": timing_path,
        "do_bench_signature": do_bench_sig, "do_bench_kwargs": kw, "rounds": args.rounds,
        "flush_bytes_ours": timing.flush_bytes(), "target_pct": args.target_pct,
        "ops": results,
        "max_abs_diff_pct": max(abs(r["diff_pct"]) for r in gated) if gated else None,
        "all_within_target": all(r["within_target"] for r in gated),
        "seconds": time.time() - t_start,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
