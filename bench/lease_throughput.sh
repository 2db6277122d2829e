#!/usr/bin/env bash
# Issue 13: how many candidates per second the server's lease path sustains
# (LeaseCandidates + ReportEvaluation, each a SQLite write transaction), with
# GPU workers whose evaluation takes no time (the scripted evaluator, delay 0):
# the ceiling that `kernelsearch serve --evaluator workers` puts on a cluster,
# whatever its GPUs. N pending candidates are written into a fresh store, the
# real `kernelsearch serve` serves them to W real `kernelsearch gpu-worker`
# processes leasing B at a time; wall time until none is pending.
# No GPU or torch needed. Writes $OUT/lease_throughput.md.
#
#   OUT=bench/results/raw KS=build/cli/kernelsearch bash bench/lease_throughput.sh
set -uo pipefail
KS=${KS:-build/cli/kernelsearch}
OUT=${OUT:-bench/results/raw}
N=${N:-2000}
CONFIGS=${CONFIGS:-"1:1 4:1 4:8 8:8"}   # workers:batch
command -v sqlite3 >/dev/null || { echo "ERROR: needs the sqlite3 command (apt-get install sqlite3)" >&2; exit 2; }
[ -x "$KS" ] || { echo "ERROR: $KS not found" >&2; exit 2; }
mkdir -p "$OUT"
W=$(mktemp -d /tmp/ks-lease-bench.XXXXXX)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$W"' EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$W/token"
echo '{"delay_ms": 0}' >"$W/eval.json"

rows=""
for cfg in $CONFIGS; do
  workers=${cfg%%:*} batch=${cfg##*:}
  db="$W/lineage-$workers-$batch.db"
  "$KS" serve --listen 127.0.0.1:0 --token-file "$W/token" --db "$db" --model command:/bin/true \
    --evaluator workers >"$W/serve.out" 2>"$W/serve.err" &
  serve_pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$W/serve.out" 2>/dev/null && break; sleep 0.1; done
  addr=$(sed -n 's/^listening on //p' "$W/serve.out")
  # A finished search (the server resumes nothing) with N pending candidates.
  {
    echo "BEGIN;"
    echo "INSERT INTO problems (name, file_path, source, sha256) VALUES ('copy', 'copy.py', '# copy', 'bench');"
    echo "INSERT INTO searches (problem_id, config_json, status) VALUES (1, '{}', 'finished');"
    for i in $(seq "$N"); do
      echo "INSERT INTO candidates (search_id, round, source, plan_json, content_hash, state, slot_key) VALUES (1, 0, 'k$i FAKE_MS(0.5)', '{}', 'h$i', 'pending', 's$i');"
    done
    echo "COMMIT;"
  } | sqlite3 "$db"
  t0=$(date +%s.%N)
  pids=()
  for w in $(seq "$workers"); do
    "$KS" gpu-worker --server "$addr" --token-file "$W/token" --evaluator "fake:$W/eval.json" --gpus 0 \
      --batch "$batch" --poll 0.05 --exit-when-idle 1 --quiet 2>>"$W/workers.err" &
    pids+=($!)
  done
  while [ "$(sqlite3 "$db" "SELECT COUNT(*) FROM candidates WHERE state = 'pending'")" != 0 ]; do sleep 0.1; done
  t1=$(date +%s.%N)
  wait "${pids[@]}" 2>/dev/null
  kill "$serve_pid"; wait "$serve_pid" 2>/dev/null
  evaluated=$(sqlite3 "$db" "SELECT COUNT(*) FROM evaluations")
  s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}')
  rate=$(awk -v n="$N" -v s="$s" 'BEGIN{printf "%.0f", n/s}')
  echo "workers $workers batch $batch: $N candidates in $s s ($rate/s), $evaluated evaluations stored" >&2
  rows+="| $workers | $batch | $N | $evaluated | $s | $rate | $((rate * 3600)) |"$'\n'
done

cat >"$OUT/lease_throughput.md" <<MD
# Lease path throughput (issue 13, bench/lease_throughput.sh)

- date: $(date -u '+%Y-%m-%d %H:%M UTC'); machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')); commit: $(git rev-parse --short HEAD 2>/dev/null)
- the real \`kernelsearch serve --evaluator workers\` and W real \`kernelsearch gpu-worker\` processes (scripted evaluator, no delay) on one machine: server, workers and SQLite share its CPUs

| workers | batch | candidates | stored | wall s | candidates/s | candidates/h |
|---|---|---|---|---|---|---|
$rows
MD
cat "$OUT/lease_throughput.md"
