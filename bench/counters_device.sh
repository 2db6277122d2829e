#!/usr/bin/env bash
# Issue 26 on a GPU machine, in one call: the hardware-counter GPU tests, the
# compute-floor test, the bridge's FLOP counting on torch >= 2.1, `eval
# --profile`, the floor fraction of the KernelBench-scale kernels recomputed
# with the compute floor, and the profiling overhead of a search round.
#
#   OUT=$OUT bash bench/counters_device.sh DIST SRC KB
#     DIST  a scripts/package_device.sh dist/ with KS_PACKAGE_TARGETS="kernelsearch ks-worker
#           counters_gpu_test gpu_eval_test"
#     SRC   the source tree the test binaries were built from (their KS_SOURCE_DIR is linked to it)
#     KB    KernelBench problem files: KB/level1/*.py, KB/level2/*.py
# env: KS_BUILT_IN, the source dir baked into the test binaries (found with strings otherwise)
# Prints a summary last; everything goes under $OUT.
set -uo pipefail
DIST=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd); KB=$(cd "$3" && pwd)
OUT=${OUT:-/tmp/ks-counters-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PATH="$PATH:/usr/local/cuda/bin"
S=$OUT/summary.md
t0=$(date +%s)
t() { echo "t=$(( $(date +%s) - t0 ))s"; }
log() { echo "$*" | tee -a "$S"; }
# The test binaries look for fixtures under the tree they were built from.
built_in=${KS_BUILT_IN:-$(strings "$DIST/bin/counters_gpu_test" 2>/dev/null | grep -m1 -oE '^/[^ ]*/tests/evaluator/gpu_fixtures/' | sed 's|/tests/evaluator/gpu_fixtures/||')}
if [ -n "$built_in" ] && [ ! -e "$built_in" ]; then mkdir -p "$(dirname "$built_in")" && ln -sfn "$SRC" "$built_in"; fi
log "# issue 26 device run"
log "- $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), $(python3 -c 'import torch; print("torch", torch.__version__)')"
log "- commit $(cat "$SRC/COMMIT" 2>/dev/null || echo unknown); ncu: $(command -v ncu) $(ncu --version 2>/dev/null | tail -n1)"
t
log "## bridge FLOP counting (torch >= 2.1)"
timeout 120 python3 "$SRC/tests/evaluator/bridge/test_flops.py" 2>&1 | tee "$OUT/test_flops.txt" | tail -n 12 | tee -a "$S"
t
log "## counters_gpu_test"
timeout 300 "$DIST/bin/counters_gpu_test" > "$OUT/counters_gpu_test.txt" 2>&1; log "rc $?"
grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|counters \(|profiler-aware|wmma fp16|Failure|Expected|Which is|actual" "$OUT/counters_gpu_test.txt" | head -n 60 | tee -a "$S"
t
log "## gpu_eval_test compute floor"
timeout 120 "$DIST/bin/gpu_eval_test" --gtest_filter='*ComputeFloor*' > "$OUT/gpu_eval_test.txt" 2>&1; log "rc $?"
grep -E "^\[ +(OK|FAILED) +\]|matmul 1024|Failure|Expected|Which is" "$OUT/gpu_eval_test.txt" | tee -a "$S"
t
log "## eval --profile (CLI)"
timeout 90 "$DIST/bin/kernelsearch" eval "$SRC/tests/evaluator/gpu_fixtures/copy_large.py" "$SRC/bench/counters/copy4.cu" \
  --plan "$SRC/bench/counters/copy4.json" --sets 2 --profile > "$OUT/eval_profile.txt" 2>&1; log "rc $?"
sed -n '/^status/,/^$/p;/roofline/,+3p;/hardware counters/,+4p' "$OUT/eval_profile.txt" | head -n 30 | tee -a "$S"
KS_NCU=none timeout 90 "$DIST/bin/kernelsearch" eval "$SRC/tests/evaluator/gpu_fixtures/copy_large.py" \
  "$SRC/bench/counters/copy4.cu" --plan "$SRC/bench/counters/copy4.json" --sets 2 --profile > "$OUT/eval_noncu.txt" 2>&1
log "without ncu: rc $? ; $(grep -m1 'note:' "$OUT/eval_noncu.txt")"
t
log "## compute floor of the KernelBench-scale kernels"
peaks=$(ls ~/.cache/kernelsearch/reference/peaks/*.json 2>/dev/null | head -n1)
[ -n "$peaks" ] || peaks=$SRC/bench/results/peaks_h100.json
cp "$peaks" "$OUT/peaks.json"
timeout 200 python3 "$SRC/bench/compute_floor.py" --results "$SRC/bench/results/kernelbench_scale_2026-11-23b.jsonl" \
  --kernelbench "$KB" --peaks "$peaks" --json "$OUT/compute_floor.json" > "$OUT/compute_floor.md" 2>"$OUT/compute_floor.err"
log "rc $? (peaks from $peaks)"
cat "$OUT/compute_floor.md" >> "$S"
t
log "## search round with --profile-top 1 (softmax, replayed transcript)"
DB=/tmp/ks-counters-search.db; rm -f $DB
/usr/bin/time -f "wall %e s" timeout 200 "$DIST/bin/kernelsearch" search "$SRC/tests/evaluator/gpu_fixtures/softmax_small.py" \
  --model "replay:$SRC/tests/e2e/fixtures/softmax_search.jsonl" --replay-loose --rounds 1 --ideas 2 --branches 2 \
  --beam 1 --repair 0 --profile-top 1 --db $DB --quiet > "$OUT/search.txt" 2>&1; log "rc $? $(tail -n1 "$OUT/search.txt")"
python3 - "$DB" <<'PY' | tee -a "$S"
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rows = db.execute("SELECT c.id, c.round, e.evaluation_json FROM candidates c JOIN evaluations e ON e.candidate_id = c.id "
                  "WHERE e.reused_from IS NULL ORDER BY c.id").fetchall()
per_round = {}
for cid, rnd, ej in rows:
    e = json.loads(ej)
    r = per_round.setdefault(rnd, {"eval_s": 0.0, "compile_s": 0.0, "n": 0, "counters_s": 0.0, "profiled": 0})
    r["eval_s"] += e.get("eval_s", 0.0); r["compile_s"] += e.get("compile_s", 0.0); r["n"] += 1
    c = e.get("counters")
    if c:
        r["counters_s"] += c.get("seconds", 0.0); r["profiled"] += 1
        print("candidate %d (round %d): counters in %.1f s; %s" % (cid, rnd, c.get("seconds", 0.0),
              (c.get("note") or "; ".join("%s dram %.0f%%" % (l["kernel"], l["dram_pct"]) for l in c["launches"]))))
for rnd, r in sorted(per_round.items()):
    print("round %d: %d candidates evaluated in %.1f s (+ %.1f s compile, in parallel); %d profiled in %.1f s: "
          "%.0f%% of the round's evaluation time" % (rnd, r["n"], r["eval_s"], r["compile_s"], r["profiled"],
          r["counters_s"], 100 * r["counters_s"] / max(r["eval_s"], 1e-9)))
PY
t
log "## metrics asked for by name"
# The metrics asked for by name must exist on this chip (ncu refuses unknown names).
# (run last, in a TMPDIR of its own: ncu's lock file in /tmp, made by root, would stop the
# sandboxed worker's ncu, which runs as nobody)
mkdir -p "$OUT/tmpq"; TMPDIR="$OUT/tmpq" ncu --query-metrics --chip gh100 > "$OUT/metrics_gh100.txt" 2>&1
for m in sm__pipe_tensor_cycles_active sm__inst_executed_pipe_tensor l1tex__data_bank_conflicts_pipe_lsu_mem_shared \
         l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld l1tex__data_pipe_lsu_wavefronts_mem_shared \
         l1tex__t_sectors_pipe_lsu_mem_local_op_ld l1tex__t_sectors_pipe_lsu_mem_local_op_st; do
  grep -qE "^$m[[:space:]]" "$OUT/metrics_gh100.txt" && log "  - metric $m: present" || log "  - metric $m: MISSING"
done
t
