#!/usr/bin/env bash
# Issue 23's benchmark on a Hopper GPU (bench/hopper/README.md): two
# candidates written for sm_90a, each judged by `kernelsearch eval` against
# PyTorch timed in the same run, by the evaluator's unchanged rules.
#
#   KB_PROBLEM=<KernelBench level1/1_Square_matrix_multiplication_.py> OUT=$OUT bash bench/hopper/run.sh
#
# 1. gemm_bf16.py (C = A @ B^T, bf16, 8192^3) with gemm_bf16_tn.cu: TMA loads,
#    a 4-stage mbarrier pipeline, setmaxnreg and wgmma. Target: >= 70% of
#    torch.matmul's throughput (speedup over eager >= 0.70).
# 2. KernelBench level 1 problem 1 (fp32, N = 4096) with sgemm_3xtf32.cu:
#    3xTF32 on the tensor cores, correct under the fp32 rules. Target:
#    >= 1.5x torch's fp32 matmul (TF32 off in the reference).
# Writes $OUT/hopper_<name>.json (the evaluations) and prints a table.
set -uo pipefail
source "$(dirname "$0")/../common.sh"
KB_PROBLEM=${KB_PROBLEM:-bench/hopper/kernelbench/1_Square_matrix_multiplication_.py}
require_ks
export_meta
echo "device: $BENCH_DEVICE; commit: $BENCH_COMMIT; $BENCH_DATE"

run_one() {  # name problem kernel
  local name=$1 problem=$2 kernel=$3
  log "eval $name"
  "$KS" eval "$problem" "bench/hopper/$kernel.cu" --plan "bench/hopper/$kernel.json" --sets 2 --json \
    >"$OUT/hopper_$name.json" 2>"$OUT/hopper_$name.err"
  echo "$name: rc $?"
  tail -n 3 "$OUT/hopper_$name.err"
}

run_one gemm_bf16 bench/hopper/gemm_bf16.py gemm_bf16_tn
run_one sgemm_3xtf32 "$KB_PROBLEM" sgemm_3xtf32

"$PYTHON" - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
rows = [("gemm_bf16", 2 * 8192 ** 3, 0.70, "torch.matmul bf16 (A @ B^T)"),
        ("sgemm_3xtf32", 2 * 4096 ** 3, 1.50, "torch.matmul fp32, TF32 off")]
print("| candidate | status | target | ms (median) | TFLOP/s | torch ms | torch TFLOP/s | ours / torch | goal | rel. norm err |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, flops, goal, torch_what in rows:
    path = os.path.join(out, "hopper_%s.json" % name)
    try:
        e = json.load(open(path))
    except Exception as ex:
        print("| %s | no result (%s) |" % (name, ex))
        continue
    ev = e.get("evaluation", e)
    st = ev.get("status")
    ms = (ev.get("timing") or {}).get("median_ms", 0)
    tms = (ev.get("eager") or {}).get("median_ms", 0)
    err = max([o.get("rel_norm", 0) for o in ev.get("errors", [])] or [0])
    ratio = tms / ms if ms else 0
    print("| %s | %s | %s | %.4f | %.0f | %.4f | %.0f | %.3f | >= %.2f %s | %.2e |" % (
        name, st, ev.get("target", "?"), ms, flops / ms / 1e9 if ms else 0, tms, flops / tms / 1e9 if tms else 0,
        ratio, goal, "MET" if st == "correct" and ratio >= goal else "NOT MET", err))
    if st != "correct":
        print("  message:", ev.get("message", "")[:400])
PY
