#!/usr/bin/env bash
# Benchmark A: timing fidelity.
#  (a) bench/timing_fidelity.py: PyTorch ops timed by our reference method
#      (evaluator/reference/timing.py) and by triton.testing.do_bench; target:
#      within 3% on each op.
#  (b) one kernel >= 50 us (the softmax_large seed on problems/softmax_large.py by
#      default) evaluated FIDELITY_REPEATS (5) times, each a separate
#      `$KS eval PROBLEM SEED --json` process; spread of the 5 medians
#      (max - min) / median, target <= 2%. The first eval may prepare the
#      reference (cached in $WORK/cache/<problem>, shared with baselines.sh).
# Writes $OUT/timing_fidelity.json and $OUT/timing_fidelity.md (+ raw files).
#
#   OUT=bench/results/raw KS=dist/bin/kernelsearch bash bench/timing_fidelity.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"

FIDELITY_PROBLEM=${FIDELITY_PROBLEM:-softmax_large}
FIDELITY_REPEATS=${FIDELITY_REPEATS:-5}
FIDELITY_SETS=${FIDELITY_SETS:-1}       # input sets per eval (1 keeps the 2 GiB-per-set reference small)
EVAL_LIMIT_S=${EVAL_LIMIT_S:-150}

require_ks
require_gpu
export_meta
prob="problems/$FIDELITY_PROBLEM.py"
seed_cu="problems/seeds/$FIDELITY_PROBLEM.cu"
[ -f "$prob" ] && [ -f "$seed_cu" ] || die "$prob or $seed_cu not found"
"$PYTHON" -c 'import triton.testing' 2>/dev/null || die "$PYTHON cannot import triton.testing (needed for part a)"

# (a)
log "timing fidelity (a): ours vs triton.testing.do_bench ..."
t0=$(now)
"$PYTHON" bench/timing_fidelity.py --out "$OUT/timing_fidelity_ops.json" 2>"$OUT/timing_fidelity_ops.err"
ops_rc=$?
ops_s=$(elapsed "$t0" "$(now)")
cat "$OUT/timing_fidelity_ops.err" >&2
[ "$ops_rc" -eq 0 ] || echo "timing fidelity (a) failed (rc $ops_rc), see $OUT/timing_fidelity_ops.err" >&2

# (b)
export KS_CACHE_DIR="$WORK/cache/$FIDELITY_PROBLEM"
: >"$OUT/timing_fidelity_evals.jsonl"
for i in $(seq 1 "$FIDELITY_REPEATS"); do
  log "timing fidelity (b): eval $i/$FIDELITY_REPEATS of $seed_cu ..."
  t0=$(now)
  timeout --kill-after=10 "$EVAL_LIMIT_S" "$KS" eval "$prob" "$seed_cu" --json --sets "$FIDELITY_SETS" \
    >"$WORK/fidelity_eval.json" 2>"$OUT/timing_fidelity_eval$i.err"
  rc=$?
  wall=$(elapsed "$t0" "$(now)")
  "$PYTHON" - "$WORK/fidelity_eval.json" "$rc" "$wall" "$i" >>"$OUT/timing_fidelity_evals.jsonl" <<'EOF'
import json, sys
path, rc, wall, i = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
try:
    j = json.load(open(path))
except (OSError, ValueError) as e:
    j = {"status": "no_output", "message": "eval rc %d, no JSON (%s)" % (rc, e)}
for k in ("compile_log", "worker_log"):
    j.pop(k, None)
j.update({"run": i, "rc": rc, "wall_s": wall})
print(json.dumps(j))
EOF
done

export ops_rc ops_s FIDELITY_PROBLEM FIDELITY_REPEATS FIDELITY_SETS
"$PYTHON" - <<'EOF'
import json, os, statistics

E = os.environ
OUT = E["OUT"]
try:
    ops = json.load(open(os.path.join(OUT, "timing_fidelity_ops.json")))
except (OSError, ValueError):
    ops = None
evals = [json.loads(l) for l in open(os.path.join(OUT, "timing_fidelity_evals.jsonl")) if l.strip()]
meds = [e["timing"]["median_ms"] for e in evals if e.get("status") == "correct" and isinstance(e.get("timing"), dict)]
spread = (max(meds) - min(meds)) / statistics.median(meds) * 100.0 if len(meds) >= 2 else None
prob = E["FIDELITY_PROBLEM"]
b = {
    "problem": "problems/%s.py" % prob, "candidate": "problems/seeds/%s.cu" % prob, "sets": int(E["FIDELITY_SETS"]),
    "command": "$KS eval problems/%s.py problems/seeds/%s.cu --json --sets %s" % (prob, prob, E["FIDELITY_SETS"]),
    "repeats": int(E["FIDELITY_REPEATS"]), "correct_runs": len(meds), "medians_ms": meds,
    "median_of_medians_ms": statistics.median(meds) if meds else None,
    "kernel_at_least_50us": (min(meds) >= 0.05) if meds else None,
    "spread_pct": spread, "target_pct": 2.0,
    "within_target": spread is not None and spread <= 2.0,
    "runs_per_eval": [(e.get("timing") or {}).get("runs") for e in evals],
    "stddev_ms_per_eval": [(e.get("timing") or {}).get("stddev_ms") for e in evals],
    "eager_median_ms": ((evals[0].get("eager") or {}).get("median_ms") if evals else None),
    "wall_s_per_eval": [e.get("wall_s") for e in evals],
    "statuses": [e.get("status") for e in evals],
    "messages": [e.get("message", "")[:300] for e in evals if e.get("status") != "correct"],
}
res = {"benchmark": "timing_fidelity", "date": E["BENCH_DATE"], "device": E["BENCH_DEVICE"],
       "commit": E["BENCH_COMMIT"], "ops_rc": int(E["ops_rc"]), "ops_s": float(E["ops_s"]),
       "a_ops": ops, "b_repeat": b}
json.dump(res, open(os.path.join(OUT, "timing_fidelity.json"), "w"), indent=1)

L = ["## Benchmark A: timing fidelity, %s" % E["BENCH_DATE"], "",
     "- device: %s" % E["BENCH_DEVICE"], "- commit: %s" % E["BENCH_COMMIT"],
     "- commands: `python3 bench/timing_fidelity.py` (a); `%s` x %s (b)" % (b["command"], b["repeats"]), ""]
if ops:
    L.append("(a) PyTorch ops: our method (timing.py: flush %d MiB, events + device sync, warm-up, adaptive runs, median) "
             "vs `triton.testing.do_bench(..., %s)` (torch %s, triton %s), median of %d alternating rounds each"
             % (ops["flush_bytes_ours"] >> 20, ", ".join("%s=%r" % kv for kv in ops["do_bench_kwargs"].items()),
                ops["torch"], ops["triton"], ops["rounds"]))
    L.append("")
    L.append("| op | ours median ms | do_bench median ms | difference | within 3% | ours without the sync (diagnostic) "
             "| ours without the pad (diagnostic) |")
    L.append("|---|---|---|---|---|---|---|")
    for r in ops["ops"]:
        L.append("| %s | %.4f | %.4f | %+.2f%% | %s | %.4f ms (%+.2f%%) | %s |" % (
            r["what"], r["ours_ms"], r["triton_ms"], r["diff_pct"],
            "n/a (informational)" if r["informational"] else ("yes" if r["within_target"] else "**no**"),
            r["ours_nosync_ms"], r["nosync_diff_pct"],
            "%.4f ms (%+.2f%%)" % (r["ours_nopad_ms"], r["nopad_diff_pct"]) if "ours_nopad_ms" in r else "n/a"))
    L.append("")
    L.append("(a) verdict: max |difference| %.2f%% vs target 3%%: **%s**" % (
        ops["max_abs_diff_pct"] or 0, "PASS" if ops["all_within_target"] else "FAIL"))
else:
    L.append("(a) FAILED (rc %s): see timing_fidelity_ops.err" % E["ops_rc"])
L.append("")
L.append("(b) %s evals of the %s seed, separate processes, %d input set(s): medians %s ms; eager %s ms"
         % (b["repeats"], prob, b["sets"], ", ".join("%.4f" % m for m in meds) or "none",
            "%.4f" % b["eager_median_ms"] if b["eager_median_ms"] else "n/a"))
if spread is not None:
    L.append("(b) verdict: spread (max-min)/median %.2f%% vs target 2%%: **%s**; kernel >= 50 us: %s; runs per eval %s"
             % (spread, "PASS" if b["within_target"] else "FAIL", b["kernel_at_least_50us"], b["runs_per_eval"]))
else:
    L.append("(b) FAILED: fewer than 2 correct evals; statuses %s %s" % (b["statuses"], b["messages"]))
L.append("")
open(os.path.join(OUT, "timing_fidelity.md"), "w").write("\n".join(L))
print("\n".join(L))
EOF
