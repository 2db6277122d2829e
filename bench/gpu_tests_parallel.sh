#!/usr/bin/env bash
# Runs GPU test binaries in parallel streams on the GPU machine (one device
# call holds at most 10 minutes): each argument is one stream, its tests run
# one after another, the streams side by side. A test is BIN[:SECONDS[:SHARD/SHARDS]]
# from DIST/bin (DIST default dist). Writes $OUT/gpu_tests.log (the gtest
# result lines of each) and $OUT/gpu_tests_full.tar.gz (every whole output).
#   OUT=DIR DIST=dist bash bench/gpu_tests_parallel.sh "a_test:200 b_test" "c_test:300:0/2" "c_test:300:1/2"
set -uo pipefail
OUT=${OUT:-bench/results/raw}
DIST=${DIST:-dist}
mkdir -p "$OUT"
full=$(mktemp -d)
run_stream() {
  local idx=$1; shift
  for spec in $@; do
    IFS=: read -r t limit shard <<<"$spec"
    limit=${limit:-300}
    local name=$t env=()
    if [ -n "${shard:-}" ]; then
      name="$t.shard${shard%/*}"
      env=(GTEST_SHARD_INDEX="${shard%/*}" GTEST_TOTAL_SHARDS="${shard#*/}")
    fi
    local t0; t0=$(date +%s)
    env "${env[@]}" timeout "$limit" "$DIST/bin/$t" >"$full/$name.log" 2>&1
    local rc=$?
    {
      echo "-- $name ($DIST, stream $idx, limit ${limit}s, $(( $(date +%s) - t0 )) s) exit $rc"
      grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED) *\]|Failure|tests? ran' "$full/$name.log"
    } >"$full/$name.summary"
  done
}
i=0
for stream in "$@"; do
  run_stream "$i" "$stream" &
  i=$((i + 1))
done
wait
cat "$full"/*.summary >>"$OUT/gpu_tests.log"
tar -C "$full" -czf "$OUT/gpu_tests_full.tar.gz" .
grep -E "^-- " "$OUT/gpu_tests.log"
