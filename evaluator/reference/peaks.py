"""Measured dense-matmul peaks of one GPU, with torch (cuBLAS).

The evaluator's compute floor is FLOPS / the peak of the problem's compute
class, so the peak must be what this GPU really does, not a datasheet figure.
Used by `bridge.py peaks` (the evaluator, cached per GPU) and by
bench/peaks.py (the baseline table).

Classes, each an n x n x n matmul (2 n^3 FLOP):
  fp32   float32 with TF32 off (torch's default for matmul)
  tf32   float32 with TF32 on
  bf16   bfloat16 (fp32 accumulation)
  fp16   float16 (fp32 accumulation)

Each figure is the median of `runs` calls timed with events around each call,
after a warm-up of at least 3 calls and `warm_ms` milliseconds.
"""

import statistics
import time

CLASSES = ("fp32", "tf32", "bf16", "fp16")


def time_ms(torch, fn, runs, warm_ms=200.0):
    """Median event time of fn over `runs` calls, after the warm-up."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    t0 = time.time()
    calls = 0
    while calls < 3 or (time.time() - t0) * 1000 < warm_ms:
        fn()
        torch.cuda.synchronize()
        calls += 1
    out = []
    for _ in range(runs):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return statistics.median(out)


def matmul_peaks(torch, device_index=0, n=8192, runs=10, warm_ms=200.0):
    """{"tflops": {class: TFLOP/s}, "matmul_ms": {class: ms}, ...} for one GPU."""
    device = torch.device("cuda", device_index)
    dtypes = {"fp32": (torch.float32, False), "tf32": (torch.float32, True),
              "bf16": (torch.bfloat16, False), "fp16": (torch.float16, False)}
    flops = 2.0 * n * n * n
    saved_tf32 = torch.backends.cuda.matmul.allow_tf32
    res = {"device": torch.cuda.get_device_name(device), "device_index": device_index, "torch": torch.__version__,
           "n": n, "runs": runs, "tflops": {}, "matmul_ms": {}}
    t_start = time.time()
    try:
        with torch.cuda.device(device):
            for name in CLASSES:
                dtype, tf32 = dtypes[name]
                torch.backends.cuda.matmul.allow_tf32 = tf32
                a = torch.randn(n, n, device=device, dtype=dtype)
                b = torch.randn(n, n, device=device, dtype=dtype)
                c = torch.empty(n, n, device=device, dtype=dtype)
                ms = time_ms(torch, lambda: torch.matmul(a, b, out=c), runs, warm_ms)
                res["matmul_ms"][name] = ms
                res["tflops"][name] = flops / (ms * 1e-3) / 1e12
                del a, b, c
            torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
    res["seconds"] = time.time() - t_start
    return res
