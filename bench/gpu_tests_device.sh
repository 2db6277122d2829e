#!/usr/bin/env bash
# Runs GPU test binaries from a packaged dist/ on the GPU machine, each under a
# time limit. Writes the gtest result lines to $OUT/gpu_tests.log and every
# test's whole output to $OUT/gpu_tests_full.tar.gz (one file: the device
# returns at most 8). Tests that read fixtures or binaries by the build
# machine's absolute paths find them through links made here (the checkout
# travels to another path).
#   OUT=DIR SRC_ON_BUILD_MACHINE=/work/main bash bench/gpu_tests_device.sh TEST[:SECONDS] ...
set -uo pipefail
OUT=${OUT:-bench/results/raw}
mkdir -p "$OUT"
if [ ! -d dist ] && [ -f distpack/dist.tar.xz ]; then tar -xJf distpack/dist.tar.xz; fi
src=${SRC_ON_BUILD_MACHINE:-/work/main}
if [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -s "$PWD" "$src"; fi
mkdir -p build/cli && ln -sfn ../../dist/bin/kernelsearch build/cli/kernelsearch
log=$OUT/gpu_tests.log
full=$(mktemp -d)
for spec in "$@"; do
  t=${spec%%:*} limit=${spec#*:}
  [ "$limit" = "$spec" ] && limit=300
  echo "-- $t (limit ${limit}s) $(date -u +%T)" | tee -a "$log"
  timeout "$limit" dist/bin/"$t" > "$full/$t.log" 2>&1
  rc=$?
  grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED) *\]|Failure|tests? ran' "$full/$t.log" | tee -a "$log"
  echo "exit $rc" | tee -a "$log"
done
tar -C "$full" -czf "$OUT/gpu_tests_full.tar.gz" .
