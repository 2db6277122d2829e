#!/usr/bin/env bash
# Issue 26: what reading hardware counters costs a search round. The same
# replayed search (tests/e2e/fixtures/softmax_search.jsonl: round 0 and one
# improvement round, 2 ideas x 2 branches, on softmax_small.py) three times on
# one GPU: a warm-up with --profile-top 0 (prepares the reference cache), then
# --profile-top 1 and --profile-top 0 again, both on the warm cache. Per run:
# wall time; per profiled kernel: the counters' own time (the stored
# evaluation's counters.seconds).
#   OUT=$OUT bash bench/counters_round_overhead.sh DIST SRC
set -uo pipefail
DIST=$(cd "$1" && pwd); SRC=$(cd "$2" && pwd)
OUT=${OUT:-/tmp/ks-counters-out}; mkdir -p "$OUT"
export PATH="$PATH:/usr/local/cuda/bin"
S=$OUT/overhead.md
search() {  # $1 = profile-top, $2 = db
  rm -f "$2"
  local t0 t1; t0=$(date +%s.%N)
  timeout 200 "$DIST/bin/kernelsearch" search "$SRC/tests/evaluator/gpu_fixtures/softmax_small.py" \
    --model "replay:$SRC/tests/e2e/fixtures/softmax_search.jsonl" --replay-loose --rounds 1 --ideas 2 --branches 2 \
    --beam 1 --repair 0 --profile-top "$1" --db "$2" --quiet > "$OUT/search_top$1_$(basename "$2").txt" 2>&1
  local rc=$?; t1=$(date +%s.%N)
  echo "| --profile-top $1 | $(basename "$2") | rc $rc | $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}') s |" | tee -a "$S"
}
echo "| run | db | exit | wall |" | tee -a "$S"
echo "|---|---|---|---:|" | tee -a "$S"
search 0 /tmp/ks-warmup.db
search 1 /tmp/ks-top1.db
search 0 /tmp/ks-top0.db
python3 - /tmp/ks-top1.db /tmp/ks-top0.db <<'PY' | tee -a "$S"
import json, sqlite3, sys
for path in sys.argv[1:]:
    db = sqlite3.connect(path)
    rows = db.execute("SELECT c.id, c.round, e.evaluation_json FROM candidates c JOIN evaluations e "
                      "ON e.candidate_id = c.id WHERE e.reused_from IS NULL ORDER BY c.id").fetchall()
    per = {}
    for cid, rnd, ej in rows:
        e = json.loads(ej)
        r = per.setdefault(rnd, [0, 0.0, 0, 0.0])
        r[0] += 1; r[1] += e.get("eval_s", 0.0) + e.get("compile_s", 0.0)
        c = e.get("counters")
        if c:
            r[2] += 1; r[3] += c.get("seconds", 0.0)
            print("%s: candidate %d (round %d) profiled in %.1f s: %s" % (path, cid, rnd, c.get("seconds", 0.0),
                  c.get("note") or " | ".join("`%s` DRAM %.0f%%, L2 %.0f GB/s" % (l["kernel"], l["dram_pct"], l["l2_gbps"])
                                              for l in c["launches"])))
    for rnd, (n, ev, p, cs) in sorted(per.items()):
        print("%s: round %d: %d kernels evaluated (%.1f s evaluation + compile), %d profiled (%.1f s)" % (path, rnd, n, ev, p, cs))
PY
