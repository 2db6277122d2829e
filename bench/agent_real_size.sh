#!/usr/bin/env bash
# Benchmark (issue 32): the agent at KernelBench's real sizes on one GPU. For
# each problem, `kernelsearch search --implement agent` with a scripted model
# (bench/kernelbench_scale/kernels/NAME.cu and .json: a correct kernel) that
# tests the kernel TESTS times, then submits it. Per problem: each test
# call's latency (the gap between the model's turns: what an agent waits),
# the practice run's median, the judged result, and the GPU memory
# high-water mark (nvidia-smi every 0.2 s) against the GPU's total.
#
#   bash bench/agent_real_size.sh KERNELBENCH_CHECKOUT [NAME ...]
#     default NAMEs: 19_ReLU 24_LogSoftmax (6.4 GB of input each)
#   env: KS, OUT (bench/common.sh), TESTS (default 3), WORKER=1 (the same
#        through `serve --evaluator workers` + one `gpu-worker` on loopback;
#        WORKER_EVALUATOR=fake runs its flow without a GPU, with
#        BENCH_GPU_CHECKED=1)
# Writes $OUT/agent_real_size.md (a table) and $OUT/agent_real_size.log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
KB=${1:-}
[ -n "$KB" ] || die "usage: bash bench/agent_real_size.sh KERNELBENCH_CHECKOUT [NAME ...]"
shift
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(19_ReLU 24_LogSoftmax)
TESTS=${TESTS:-3}
require_ks
require_gpu
KERNELS=bench/kernelbench_scale/kernels

# WORKER=1: the same search submitted to `serve --evaluator workers` on
# loopback, its tool calls and candidate served by one `gpu-worker` on this
# GPU. The model's budget of calls ends the search after the agent's turns
# (a submitted search has at least one round). The store read afterwards is
# the server's ($w/ks.db).
run_through_worker() {
  local w=$1 problem=$2 port=${WORKER_PORT:-50917}
  "$PYTHON" -c 'import secrets; print(secrets.token_hex(32))' > "$w/token"
  "$KS" serve --listen "127.0.0.1:$port" --token-file "$w/token" --db "$w/ks.db" --evaluator workers \
    --model "command:$PYTHON $w/agent.py" > "$w/serve.log" 2>&1 &
  local server=$!
  "$KS" gpu-worker --server "127.0.0.1:$port" --token-file "$w/token" --poll 0.2 \
    --evaluator "${WORKER_EVALUATOR:-gpu}" > "$w/worker.log" 2>&1 &
  local worker=$!
  local id="" i
  for i in $(seq 1 50); do
    id=$("$KS" submit "$problem" --server "127.0.0.1:$port" --token-file "$w/token" --implement agent --rounds 1 \
      --ideas 1 --branches 1 --repairs 0 --budget-calls $((TESTS + 1)) --agent-tool-calls $((TESTS + 2)) \
      --agent-turns $((TESTS + 2)) 2>> "$w/err") && break
    sleep 0.2
  done
  "$KS" watch "$id" --server "127.0.0.1:$port" --token-file "$w/token" > "$w/out" 2>> "$w/err"
  local rc=$?
  # A search that ends on its budget leaves the submitted candidate to the
  # workers (they lease it all the same): wait for its evaluation.
  for i in $(seq 1 600); do
    "$PYTHON" -c 'import sqlite3, sys; sys.exit(0 if sqlite3.connect(sys.argv[1]).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] else 1)' "$w/ks.db" && break
    sleep 0.2
  done
  kill "$worker" 2>/dev/null; wait "$worker" 2>/dev/null
  kill "$server" 2>/dev/null; wait "$server" 2>/dev/null
  cat "$w/serve.log" "$w/worker.log" >> "$w/err"
  return $rc
}
suffix=""
[ "${WORKER:-0}" = 1 ] && suffix=_worker
MD=$OUT/agent_real_size$suffix.md
LOG=$OUT/agent_real_size$suffix.log
{
  echo "# Agent at real size${suffix:+, through a GPU worker} ($(date -u +%F), $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n1), commit $(commit_id))"
  echo
  echo "| problem | test calls (s) | practice median (ms) | judged | GPU memory high-water / total (MiB) | search wall (s) |"
  echo "|---|---|---|---|---|---|"
} > "$MD"
for name in "${NAMES[@]}"; do
  problem=$(ls "$KB"/KernelBench/level*/"$name".py "$KB"/level*/"$name".py 2>/dev/null | head -n1)
  [ -n "$problem" ] || { log "$name: not in $KB"; continue; }
  w=$WORK/agent_$name
  rm -rf "$w" && mkdir -p "$w"
  "$PYTHON" - "$KERNELS/$name.cu" "$KERNELS/$name.json" "$TESTS" > "$w/turns.json" <<'PY'
import json, sys
src, plan, n = open(sys.argv[1]).read(), json.load(open(sys.argv[2])), int(sys.argv[3])
def turn(tool, i):
    return {"text": "", "tool_calls": [{"id": "c%d" % i, "name": tool, "arguments": {"source": src, "plan": plan}}]}
print(json.dumps([turn("test", i) for i in range(n)] + [turn("submit", n)]))
PY
  cat > "$w/agent.py" <<'PY'
import json, os, sys, time
req = json.load(sys.stdin)
here = os.path.dirname(os.path.abspath(__file__))
turn = sum(1 for m in req["messages"] if m["role"] == "assistant")
with open(os.path.join(here, "turn_times"), "a") as f:
    f.write("%d %.3f\n" % (turn, time.time()))
print(json.dumps(json.load(open(os.path.join(here, "turns.json")))[turn]))
PY
  (while [ ! -e "$w/done" ]; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n1; sleep 0.2; done) > "$w/mem" &
  sampler=$!
  t0=$(now)
  if [ "${WORKER:-0}" = 1 ]; then
    run_through_worker "$w" "$problem"
  else
    "$KS" search "$problem" --model "command:$PYTHON $w/agent.py" --implement agent --rounds 0 --branches 1 \
      --repair 0 --profile-top 0 --agent-tool-calls $((TESTS + 2)) --agent-turns $((TESTS + 2)) --db "$w/ks.db" \
      --quiet > "$w/out" 2> "$w/err"
  fi
  rc=$?
  t1=$(now)
  touch "$w/done"
  wait "$sampler"
  { echo "== $name (exit $rc)"; cat "$w/out" "$w/err"; cat "$w/turn_times"; } >> "$LOG"
  "$PYTHON" - "$w" "$name" "$problem" "$(elapsed "$t0" "$t1")" "$TESTS" >> "$MD" <<'PY'
import json, os, sqlite3, sys
w, name, problem, wall, n = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
at = {}
for line in open(os.path.join(w, "turn_times")) if os.path.exists(os.path.join(w, "turn_times")) else []:
    t, s = line.split()
    at[int(t)] = float(s)
lat = ["%.2f" % (at[i + 1] - at[i]) for i in range(n) if i in at and i + 1 in at]
mem = [int(x) for x in open(os.path.join(w, "mem")).read().split() if x.isdigit()]
total = (os.popen("nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null").read().split() or ["?"])[0]
db = sqlite3.connect(os.path.join(w, "ks.db"))
practice, judged = "", "not judged"
row = db.execute("SELECT evaluation_json FROM attempts WHERE tool='test' AND evaluation_json != '' ORDER BY id DESC LIMIT 1").fetchone()
if row:
    e = json.loads(row[0])
    practice = "%.3f" % e.get("timing", {}).get("median_ms", 0) if e.get("timing") else e.get("status", "")
row = db.execute("SELECT e.status, e.median_ms, e.speedup_eager FROM candidates c JOIN evaluations e ON e.candidate_id = c.id LIMIT 1").fetchone()
if row:
    judged = "%s, %.3f ms, %.2fx eager" % (row[0], row[1] or 0, row[2] or 0)
print("| %s | %s | %s | %s | %s / %s | %.0f |" % (name, ", ".join(lat) or "none", practice, judged,
      max(mem) if mem else "?", total, wall))
PY
done
cat "$MD"
