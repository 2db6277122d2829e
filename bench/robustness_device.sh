#!/usr/bin/env bash
# Issue 27 on a GPU in one call: the robustness GPU tests, a conv problem's two
# baselines (PyTorch's TF32 defaults and fp32) under both precision contracts,
# and KernelBench-scale kernels re-judged with the distribution-shifted input
# sets: which stay robust, and what the shifted sets cost a first evaluation
# (the same problem with INPUT_TRANSFORMS = [] appended, on caches of its own).
#
#   bash bench/robustness_device.sh DIST KB_LEVELS_DIR KERNELS_DIR OUT
#   env: ONLY (problems, a grep -E pattern), COST_ONLY (problems also timed
#        without the shifted sets), EVAL_TIMEOUT_S (default 90), KB_ONLY=1 (skip
#        the GPU tests and the conv problem)
# Writes OUT/robustness_gpu_test.txt, OUT/conv_*.json, OUT/kb_*.json and OUT/summary.md.
set -uo pipefail
D=$1 KB=$2 KERNELS=$3 OUT=$4
ONLY=${ONLY:-.} COST_ONLY=${COST_ONLY:-^$} EVAL_TIMEOUT_S=${EVAL_TIMEOUT_S:-90}
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_FORCE_DISABLE_CACHES=1
mkdir -p "$OUT"
now() { date +%s.%N; }
{
  echo "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1)"
  echo "torch: $(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null)"
} | tee "$OUT/summary.md"

if [ -z "${KB_ONLY:-}" ]; then  # KB_ONLY=1: the KernelBench part alone
echo "## robustness_gpu_test" | tee -a "$OUT/summary.md"
timeout 240 "$D/bin/robustness_gpu_test" >"$OUT/robustness_gpu_test.txt" 2>&1
echo "exit $?" | tee -a "$OUT/summary.md"
grep -E "^\[ +(OK|FAILED) +\]|^(split|honest|log)" "$OUT/robustness_gpu_test.txt" | tee -a "$OUT/summary.md"

echo "## conv2d_alexnet: both baselines, fp32 and tf32 contracts" | tee -a "$OUT/summary.md"
P=$D/share/kernelsearch/problems
for prec in fp32 tf32; do
  KS_CACHE_DIR=/tmp/ks-conv timeout "$EVAL_TIMEOUT_S" "$D/bin/kernelsearch" eval "$P/conv2d_alexnet.py" \
    "$P/seeds/conv2d_alexnet.cu" --precision "$prec" --json >"$OUT/conv_$prec.json" 2>"$OUT/conv_$prec.err"
  python3 - "$OUT/conv_$prec.json" <<'PY' | tee -a "$OUT/summary.md"
import json, sys
try:
    e = json.load(open(sys.argv[1]))
except Exception as x:
    print("no result:", x); sys.exit()
g = lambda k: (e.get(k) or {}).get("median_ms")
print("precision=%s status=%s median=%s eager(defaults)=%s eager_fp32=%s compiled=%s speedup_eager=%s "
      "speedup_eager_fp32=%s\n  baseline: %s" % (e.get("precision"), e.get("status"), g("timing"), g("eager"),
      g("eager_fp32"), g("compiled"), e.get("speedup_eager"), e.get("speedup_eager_fp32"), e.get("baseline")))
print("  robustness:", json.dumps(e.get("robustness"))[:600])
PY
done

fi

echo "## KernelBench-scale kernels with the shifted sets" | tee -a "$OUT/summary.md"
for kernel in $(ls "$KERNELS"/*.cu | sort -V); do
  stem=$(basename "${kernel%.cu}")
  echo "$stem" | grep -Eq "$ONLY" || continue
  problem=$(ls "$KB"/level*/"$stem.py" 2>/dev/null | head -n1)
  [ -n "$problem" ] || { echo "$stem: no problem file" | tee -a "$OUT/summary.md"; continue; }
  runs="with"
  if echo "$stem" | grep -Eq "$COST_ONLY"; then
    runs="with without"
    mkdir -p /tmp/kb-off
    { cat "$problem"; printf '\nINPUT_TRANSFORMS = []\n'; } >"/tmp/kb-off/$stem.py"
  fi
  for mode in $runs; do
    p=$problem
    [ "$mode" = without ] && p=/tmp/kb-off/$stem.py
    rm -rf "/tmp/ks-$mode"
    t0=$(now)
    KS_CACHE_DIR=/tmp/ks-$mode timeout "$EVAL_TIMEOUT_S" "$D/bin/kernelsearch" eval "$p" "$kernel" --json \
      >"$OUT/kb_${stem}_$mode.json" 2>"$OUT/kb_${stem}_$mode.err"
    rc=$?
    t1=$(now)
    python3 - "$OUT/kb_${stem}_$mode.json" "$stem" "$mode" "$(python3 -c "print(round($t1 - $t0, 1))")" "$rc" <<'PY' | tee -a "$OUT/summary.md"
import json, sys
path, stem, mode, secs, rc = sys.argv[1:]
try:
    e = json.load(open(path))
except Exception:
    print("| %s | %s | exit %s | %s s | - |" % (stem, mode, rc, secs)); sys.exit()
r = e.get("robustness") or {}
held = ",".join(c["check"] for c in r.get("checks", []) if c["outcome"] == "held")
other = "; ".join("%s %s: %s" % (c["check"], c["outcome"], c["detail"][:160]) for c in r.get("checks", [])
                  if c["outcome"] != "held" and c["check"] != "shapes")
phases = e.get("phases_s") or {}
print("| %s | %s | %s%s | %s s | shifted %.2f s | held: %s | %s |" % (
    stem, mode, e.get("status"), " (specialised: %s)" % r.get("broken_by") if r.get("specialised") else "", secs,
    phases.get("shifted_inputs", 0.0), held, other.replace("|", "/")))
PY
  done
done
