#!/usr/bin/env python3
"""Measured peaks of this GPU, with torch: dense matmul TFLOP/s per dtype and
device-to-device copy bandwidth. Used by baselines.sh for compute floors
(FLOPS / peak of the problem's dtype). The matmul figures come from
evaluator/reference/peaks.py, the same measurement the evaluator caches per
GPU for its own roofline.

  fp32       8192^3 matmul, TF32 off (torch.backends.cuda.matmul.allow_tf32 = False)
  tf32       the same with TF32 on
  bf16/fp16  8192^3 matmul in that dtype (fp32 accumulation, cuBLAS)
  copy       1 GiB dst.copy_(src); bandwidth = (read + write bytes) / time

Each figure: median over RUNS timed calls (events around each call, one warm-up
phase first). Writes JSON to --out and prints a table.

  python3 bench/peaks.py --out FILE.json [--n 8192] [--runs 10]
"""

import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--copy-bytes", type=int, default=1 << 30)
    args = ap.parse_args()
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        sys.exit("peaks: cannot import torch: %s" % e)
    if not torch.cuda.is_available():
        sys.exit("peaks: torch %s sees no CUDA device" % torch.__version__)

    t_start = time.time()
    # The matmul peaks are the evaluator's own measurement (bridge.py peaks).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "evaluator", "reference"))
    import peaks
    res = peaks.matmul_peaks(torch, 0, args.n, args.runs)

    src = torch.empty(args.copy_bytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    ms = peaks.time_ms(torch, lambda: dst.copy_(src), args.runs)
    res["copy_ms"] = ms
    res["copy_bytes"] = args.copy_bytes
    res["copy_gbps"] = 2.0 * args.copy_bytes / (ms * 1e-3) / 1e9
    res["seconds"] = time.time() - t_start
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print("peaks on %s (torch %s): %s; copy %.0f GB/s (read + write)" % (
        res["device"], res["torch"], ", ".join("%s %.1f TFLOP/s" % kv for kv in res["tflops"].items()),
        res["copy_gbps"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
