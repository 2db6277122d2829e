#!/usr/bin/env bash
# Runs GPU test binaries from a packaged dist/ on the GPU machine, each under a
# time limit, and writes one summary (the gtest result lines) to $OUT/gpu_tests.log.
# Tests that read fixtures by the build machine's absolute source path find
# them through a link made here (the checkout travels to another path).
#   OUT=DIR SRC_ON_BUILD_MACHINE=/work/main bash bench/gpu_tests_device.sh TEST[:SECONDS] ...
set -uo pipefail
OUT=${OUT:-bench/results/raw}
mkdir -p "$OUT"
src=${SRC_ON_BUILD_MACHINE:-/work/main}
if [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
log=$OUT/gpu_tests.log
for spec in "$@"; do
  t=${spec%%:*} limit=${spec#*:}
  [ "$limit" = "$spec" ] && limit=300
  echo "-- $t (limit ${limit}s)" | tee -a "$log"
  timeout "$limit" dist/bin/"$t" 2>&1 | grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED) *\]|Failure|tests? ran' | tee -a "$log"
  echo "exit ${PIPESTATUS[0]}" | tee -a "$log"
done
