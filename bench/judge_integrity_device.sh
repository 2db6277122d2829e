#!/usr/bin/env bash
# Issues 31 and 36 on a GPU in one call (before and after on the same machine):
#  1. the GPU tests of the new binaries (dist/), each under a time limit;
#  2. bench/throughput.sh with the old binaries (dist-old/, the commit before
#     the change) and the new ones: candidates per minute and statuses;
#  3. KernelBench problems at full size, a first evaluation each (its own
#     empty reference cache) with the old and the new binaries: wall time, the
#     phases, status, and what each shifted set found (held, broke, and which
#     were ill-conditioned: PyTorch's own float32 far from float64 there).
#
#   OUT=DIR bash bench/judge_integrity_device.sh KB_LEVELS_DIR KERNELS_DIR
#   env: TESTS ("name:seconds ..."), ONLY (KernelBench problems, a grep -E
#        pattern), EVAL_TIMEOUT_S (default 120), SKIP_TESTS=1, SKIP_THROUGHPUT=1
# Writes OUT/summary.md (and the raw files beside it).
set -uo pipefail
KB=$1 KERNELS=$2
OUT=${OUT:-bench/results/raw}
mkdir -p "$OUT"
ONLY=${ONLY:-^(12_Gemm_Multiply_LeakyReLU|24_LogSoftmax)$}
EVAL_TIMEOUT_S=${EVAL_TIMEOUT_S:-120}
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
S=$OUT/summary.md
now() { date +%s.%N; }
{
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1)"
  echo "torch: $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
} | tee "$S"

if [ -z "${SKIP_TESTS:-}" ]; then
  echo "## GPU tests (new)" | tee -a "$S"
  OUT=$OUT bash bench/gpu_tests_device.sh ${TESTS:-adversarial_test:400 judge_gpu_test:300 robustness_gpu_test:300} >/dev/null 2>&1
  cat "$OUT/gpu_tests.log" >>"$S"
  grep -E "^-- |exit|FAILED|PASSED" "$OUT/gpu_tests.log"
fi

if [ -z "${SKIP_THROUGHPUT:-}" ]; then
  for v in old new; do
    d=dist; [ $v = old ] && d=dist-old
    echo "## throughput.sh ($v: $d)" | tee -a "$S"
    mkdir -p "$OUT/tp_$v"
    KS=$d/bin/kernelsearch OUT=$OUT/tp_$v WORK=/tmp/ks-tp-$v bash bench/throughput.sh >"$OUT/tp_$v/log.txt" 2>&1
    python3 - "$OUT/tp_$v/throughput.json" <<'PY' | tee -a "$S"
import json, sys
try:
    t = json.load(open(sys.argv[1]))
except Exception as e:
    print("no result:", e); sys.exit()
def pick(d, keys):
    return {k: d.get(k) for k in keys if k in d}
print(json.dumps({k: (pick(v, ["candidates", "seconds", "per_min", "per_minute", "mismatched", "statuses",
                               "restarts", "all_honest_correct", "wall_s", "candidates_per_min"])
                      if isinstance(v, dict) else v) for k, v in t.items()}, indent=None)[:3000])
PY
  done
fi

echo "## KernelBench first evaluations (old, new)" | tee -a "$S"
echo "| problem | binaries | status | wall | phases (s) | shifted sets |" | tee -a "$S"
echo "|---|---|---|---:|---|---|" | tee -a "$S"
for problem in $(ls "$KB"/level1/*.py "$KB"/level2/*.py 2>/dev/null); do
  stem=$(basename "$problem" .py)
  echo "$stem" | grep -qE "$ONLY" || continue
  kernel=$KERNELS/$stem.cu
  [ -f "$kernel" ] || continue
  for v in old new; do
    d=dist; [ $v = old ] && d=dist-old
    rm -rf "/tmp/ks-kb-$v"
    t0=$(now)
    KS_CACHE_DIR=/tmp/ks-kb-$v timeout "$EVAL_TIMEOUT_S" "$d/bin/kernelsearch" eval "$problem" "$kernel" --json \
      >"$OUT/kb_${stem}_$v.json" 2>"$OUT/kb_${stem}_$v.err"
    rc=$?
    t1=$(now)
    python3 - "$OUT/kb_${stem}_$v.json" "$stem" "$v" "$(python3 -c "print(round($t1 - $t0, 1))")" "$rc" <<'PY' | tee -a "$S"
import json, sys
path, stem, v, secs, rc = sys.argv[1:]
try:
    e = json.load(open(path))
except Exception:
    print("| %s | %s | exit %s | %s s | - | - |" % (stem, v, rc, secs)); sys.exit()
r = e.get("robustness") or {}
checks = "; ".join("%s %s%s" % (c["check"], c["outcome"], " (ill-conditioned)" if "ill-conditioned" in c.get("detail", "") else "")
                   for c in r.get("checks", []))
phases = e.get("phases_s") or {}
ph = ", ".join("%s %.2f" % (k, v) for k, v in phases.items())
t = e.get("timing") or {}
print("| %s | %s | %s%s, median %s ms, %s | %s s | %s | %s |" % (
    stem, v, e.get("status"), " (specialised: %s)" % r.get("broken_by") if r.get("specialised") else "",
    t.get("median_ms"), e.get("precision", ""), secs, ph, checks))
PY
  done
done
