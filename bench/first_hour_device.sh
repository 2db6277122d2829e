#!/usr/bin/env bash
# Issue 22 on a GPU machine, from a packaged dist/ (scripts/package_device.sh
# with KS_PACKAGE_TARGETS="kernelsearch ks-worker search_gpu_test export_gpu_test"):
#  1. the GPU tests that start the CLI, run from dist/ (they find it next to
#     themselves and the fixtures in the working directory);
#  2. a split search of a KernelBench problem at its real size: the model side
#     with no GPU visible and no --signature (the meta device), round 0's
#     prompts with the GPU's datasheet figures, the GPU side evaluating.
#   OUT=DIR bash bench/first_hour_device.sh   (from the repository root)
set -uo pipefail
OUT=${OUT:-bench/results/raw}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
echo "== GPU tests from dist/"
for t in search_gpu_test export_gpu_test; do
  echo "-- $t"
  dist/bin/$t 2>&1 | grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED|RUN) *\]|tests? ran|Failure|error' | tail -n 20
  echo "exit ${PIPESTATUS[0]}"
done
echo "== split search of KernelBench level1 23_Softmax (4096 x 393216)"
P=.kernelbench/level1/23_Softmax.py OUT=$OUT KS=dist/bin/kernelsearch bash bench/split_search_device.sh 2>&1 | tail -n 60
echo "== what each prompt said about the GPU"
cat "$OUT/split_prompts.txt" 2>/dev/null | head -n 40
