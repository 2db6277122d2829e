#!/usr/bin/env bash
# Issue 25 on the GPU machine, in one call: the GPU tests, bench/throughput.sh
# (mixed batch always, issue-4 batch when time allows), one KernelBench-scale
# problem (softmax_large with its seed, three processes) and the bridge's
# pytest under the machine's torch. At most 8 files in $OUT.
#   OUT=DIR bash bench/structure_device.sh   (from a dist/ of the same commit; tests built
#   elsewhere than /work/main: SRC_ON_BUILD_MACHINE=that checkout)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/results/raw}
mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__)" >> "$OUT/device.txt" 2>&1
bash bench/gpu_tests_device.sh gpu_eval_test:170 adversarial_test:120 constructs_gpu_test:60 \
  search_gpu_test:90 export_gpu_test:90
scratch=$(mktemp -d)
skip=1
[ $(( $(date +%s) - start )) -lt 300 ] && skip=0
SKIP_ISSUE4=$skip OUT="$scratch" KS=dist/bin/kernelsearch timeout 200 bash bench/throughput.sh > "$scratch/log" 2>&1
cp "$scratch/throughput.md" "$scratch/throughput.json" "$OUT/" 2>/dev/null || tail -20 "$scratch/log" > "$OUT/throughput_failed.log"
for i in 1 2 3; do
  timeout 120 dist/bin/kernelsearch eval problems/softmax_large.py problems/seeds/softmax_large.cu --json --sets 1
done > "$OUT/softmax_large.jsonl" 2> "$scratch/softmax.err" || tail -20 "$scratch/softmax.err" >> "$OUT/softmax_large.jsonl"
(python3 -m pytest -p no:cacheprovider -q tests/evaluator/bridge 2>&1 | tail -15) > "$OUT/bridge_pytest.log"
echo "total $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
cat "$OUT/gpu_tests.log"; cat "$OUT/throughput.md" 2>/dev/null | head -30; tail -3 "$OUT/bridge_pytest.log"
