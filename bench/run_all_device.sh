#!/usr/bin/env bash
# All device benchmarks in one command, from the repository root of the GPU machine:
#
#   OUT=$OUT bash bench/run_all_device.sh
#
# Order (cheap and bounded first, the open-ended one last with what is left of
# TOTAL_BUDGET_S, default 450 s):
#   1. bench/peaks.py                 matmul TFLOP/s per dtype, D2D copy GB/s   (~15 s)
#   2. dist/bin/bench_compile_time    NVRTC compile time, 50 runs per mode        (~20 s; skipped if not packaged)
#   3. bench/throughput.sh            Benchmark B: 100 mixed + 200 issue-4 candidates (~2-3 min)
#   4. bench/timing_fidelity.sh       Benchmark A: ours vs do_bench; 5 evals of the softmax seed (~1.5 min)
#   5. bench/baselines.sh             issue 8 headroom table, problems in order until the budget is spent
# Everything goes under $OUT (default bench/results/raw); scratch under $WORK
# (default /tmp/ks-bench-work). Summary tables are printed last and collected in
# $OUT/summary.md. Set KS_COMMIT=<sha> when the tree has no .git.
set -uo pipefail
source "$(dirname "$0")/common.sh"

TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-450}
COMPILE_BENCH=${COMPILE_BENCH:-dist/bin/bench_compile_time}
T_ALL=$(now)
exec > >(tee -a "$OUT/run_all.log") 2>&1
TEE_PID=$!

echo "run_all_device: OUT=$OUT KS=$KS WORK=$WORK budget ${TOTAL_BUDGET_S}s"
require_ks
require_gpu
export BENCH_GPU_CHECKED=1
"$PYTHON" -c 'import triton' 2>/dev/null || echo "run_all_device: WARNING: $PYTHON has no triton; timing fidelity (a) will fail" >&2
export_meta
echo "device: $BENCH_DEVICE; commit: $BENCH_COMMIT; $BENCH_HOST_CPUS CPUs ($BENCH_CPU); $("$KS" --version 2>&1)"
df -h "$WORK" 2>/dev/null | tail -n 1

step_rc() { echo "run_all_device: $1 finished with rc $2 after $(elapsed "$T_ALL" "$(now)")s total"; }

# 1. peaks
timeout 120 "$PYTHON" bench/peaks.py --out "$OUT/peaks.json"
step_rc peaks $?

# 2. compile time
if [ -x "$COMPILE_BENCH" ]; then
  timeout 120 "$COMPILE_BENCH" --runs 50 --out "$OUT/compile_time.md" --commit "$BENCH_COMMIT"
  step_rc compile_time $?
else
  echo "run_all_device: $COMPILE_BENCH not packaged; compile time skipped" \
       "(package with KS_PACKAGE_TARGETS=\"kernelsearch ks-worker gpu_eval_test adversarial_test bench_compile_time\")"
  echo "compile time: skipped, $COMPILE_BENCH not packaged" >"$OUT/compile_time.md"
fi

# 3. throughput
BATCH_LIMIT_S=${BATCH_LIMIT_S:-200} bash bench/throughput.sh
step_rc throughput $?

# 4. timing fidelity
bash bench/timing_fidelity.sh
step_rc timing_fidelity $?

# 5. baselines with what is left
used=$(elapsed "$T_ALL" "$(now)")
left=$(awk -v b="$TOTAL_BUDGET_S" -v u="$used" 'BEGIN{printf "%d", b-u}')
echo "run_all_device: ${left}s left for baselines"
if [ "$left" -gt 30 ]; then
  BASELINES_BUDGET_S=$left bash bench/baselines.sh
  step_rc baselines $?
else
  echo "run_all_device: no time left for baselines; run: OUT=\$OUT bash bench/baselines.sh"
fi

{
  echo "# Device benchmarks, $BENCH_DATE"
  echo
  echo "- device: $BENCH_DEVICE; commit: $BENCH_COMMIT; command: \`OUT=$OUT bash bench/run_all_device.sh\`"
  echo "- total wall: $(elapsed "$T_ALL" "$(now)") s"
  echo
  for f in compile_time.md throughput.md timing_fidelity.md baselines.md; do
    [ -s "$OUT/$f" ] && { cat "$OUT/$f"; echo; }
  done
} >"$OUT/summary.md"
echo
echo "================================ SUMMARY ================================"
cat "$OUT/summary.md"
# Let tee write the last lines before the command returns.
exec 1>&- 2>&-
wait "$TEE_PID" 2>/dev/null || true
