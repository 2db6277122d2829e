#!/usr/bin/env bash
# Benchmark (issue 33): real-size throughput and where one evaluation's time
# goes. N copies of one correct kernel (each with its own comment line, so no
# two sources are the same) judged as one batch by `kernelsearch eval PROBLEM
# DIR --json`, the reference cached by a first single evaluation. Per batch:
# wall time, candidates per minute, statuses, the timing medians, and the
# phases of every evaluation summed (phases_s: load, correctness, shifted sets,
# warm-up, timed runs, profile, final checks) with what the runs inside them
# spent (run_parts_s: staging an input set, the worker's round trip and the
# plan's own time in it, the output comparison, the input and guard checks),
# per candidate. The limit: the plan's own time (kernel) is what no evaluator
# can remove.
#
#   bash bench/real_size_batch.sh PROBLEM KERNEL.cu [N]
#     PROBLEM   a KernelBench-style problem file (full size)
#     KERNEL.cu a correct kernel for it, its launch plan in KERNEL.json beside it
#     N         candidates in the batch (default 40)
#   env: KS (default dist/bin/kernelsearch), OUT (default bench/results/raw),
#        TAG (a name for this run's files, default the kernel's stem),
#        EXTRA (more `eval` flags), BATCH_LIMIT_S (default 400)
# Writes $OUT/real_size_$TAG.json and .md; exit 0 when it ran, 2 when a
# prerequisite is missing.
set -uo pipefail
source "$(dirname "$0")/common.sh"

PROBLEM=${1:-}
KERNEL=${2:-}
N=${3:-40}
[ -n "$PROBLEM" ] && [ -n "$KERNEL" ] || die "usage: bash bench/real_size_batch.sh PROBLEM KERNEL.cu [N]"
[ -f "$PROBLEM" ] || die "$PROBLEM: no such problem file"
[ -f "$KERNEL" ] || die "$KERNEL: no such kernel"
PLAN=${KERNEL%.cu}.json
[ -f "$PLAN" ] || die "$PLAN: the kernel's launch plan is missing"
TAG=${TAG:-$(basename "$KERNEL" .cu)}
BATCH_LIMIT_S=${BATCH_LIMIT_S:-400}
EXTRA=${EXTRA:-}
require_ks
require_gpu
export_meta

D="$WORK/real_size_$TAG"
rm -rf "$D"
mkdir -p "$D/batch"
for i in $(seq 1 "$N"); do
  stem=$(printf "v%03d" "$i")
  { echo "// real_size_batch variant $i"; cat "$KERNEL"; } >"$D/batch/$stem.cu"
  cp "$PLAN" "$D/batch/$stem.json"
done

log "real_size_batch $TAG: preparing the reference (one evaluation) ..."
t0=$(now)
# shellcheck disable=SC2086
"$KS" eval "$PROBLEM" "$KERNEL" --json $EXTRA >"$OUT/real_size_${TAG}_first.json" 2>"$OUT/real_size_${TAG}_first.err"
first_rc=$?
first_s=$(elapsed "$t0" "$(now)")
log "real_size_batch $TAG: the batch of $N ..."
t0=$(now)
# shellcheck disable=SC2086
timeout --kill-after=10 "$BATCH_LIMIT_S" "$KS" eval "$PROBLEM" "$D/batch" --json $EXTRA \
  >"$OUT/real_size_${TAG}.jsonl" 2>"$OUT/real_size_${TAG}.err"
batch_rc=$?
batch_s=$(elapsed "$t0" "$(now)")

export TAG N first_rc first_s batch_rc batch_s PROBLEM KERNEL EXTRA
"$PYTHON" - <<'EOF'
import collections, json, os, statistics

E = os.environ
OUT, TAG = E["OUT"], E["TAG"]
rows = []
for line in open(os.path.join(OUT, "real_size_%s.jsonl" % TAG)):
    line = line.strip()
    if line.startswith("{"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
n, wall = len(rows), float(E["batch_s"])
statuses = collections.Counter(r.get("status", "?") for r in rows)
phases, parts = collections.defaultdict(float), collections.defaultdict(float)
for r in rows:
    for k, v in (r.get("phases_s") or {}).items():
        phases[k] += v
    for k, v in (r.get("run_parts_s") or {}).items():
        parts[k] += v
medians = [r["timing"]["median_ms"] for r in rows if isinstance(r.get("timing"), dict)]
timed = [r["timing"].get("runs") for r in rows if isinstance(r.get("timing"), dict)]
stopped = collections.Counter((r.get("timing") or {}).get("stopped", "-") for r in rows if isinstance(r.get("timing"), dict))
eval_s = [r.get("eval_s", 0) for r in rows]
per = lambda d: {k: round(v / n, 4) for k, v in sorted(d.items(), key=lambda kv: -kv[1])} if n else {}
kernel_s = parts.get("kernel", 0.0)
res = {
    "benchmark": "real_size_batch", "tag": TAG, "date": E["BENCH_DATE"], "device": E["BENCH_DEVICE"],
    "commit": E["BENCH_COMMIT"], "problem": E["PROBLEM"], "kernel": E["KERNEL"], "extra_flags": E["EXTRA"],
    "command": "$KS eval %s DIR --json %s (DIR: %s copies of %s)" % (E["PROBLEM"], E["EXTRA"], E["N"], E["KERNEL"]),
    "first_eval": {"rc": int(E["first_rc"]), "wall_s": float(E["first_s"])},
    "batch": {"rc": int(E["batch_rc"]), "candidates": int(E["N"]), "returned": n, "wall_s": wall,
              "per_minute": n / wall * 60 if wall > 0 and n else 0.0, "statuses": dict(statuses),
              "eval_s_median": statistics.median(eval_s) if eval_s else None,
              "median_ms": {"median": statistics.median(medians), "min": min(medians), "max": max(medians)} if medians else None,
              "timed_runs_median": statistics.median(timed) if timed else None, "timing_stopped": dict(stopped)},
    "per_candidate_phases_s": per(phases),
    "per_candidate_run_parts_s": per(parts),
    # The plan's own time over the batch's wall time: the share of the limit reached.
    "kernel_share_of_wall": kernel_s / wall if wall > 0 else None,
    "limit_per_minute": (n / kernel_s * 60) if kernel_s > 0 else None,
}
json.dump(res, open(os.path.join(OUT, "real_size_%s.json" % TAG), "w"), indent=1)
b = res["batch"]
L = ["## real_size_batch %s, %s" % (TAG, E["BENCH_DATE"]), "",
     "- device: %s; commit %s" % (E["BENCH_DEVICE"], E["BENCH_COMMIT"]),
     "- command: `%s`" % res["command"],
     "- first evaluation (reference prepared): %.1f s (rc %s)" % (res["first_eval"]["wall_s"], E["first_rc"]),
     "- batch: %d/%d returned in %.1f s: **%.0f candidates/min** (rc %d); statuses %s" % (
         n, int(E["N"]), wall, b["per_minute"], b["rc"], json.dumps(dict(statuses), sort_keys=True)),
     "- candidate medians (ms): %s; timed runs (median) %s; why timing stopped %s" % (
         json.dumps(b["median_ms"]), b["timed_runs_median"], json.dumps(dict(stopped), sort_keys=True)),
     "- per candidate, phases (s): %s" % ", ".join("%s %.3f" % kv for kv in res["per_candidate_phases_s"].items()),
     "- per candidate, inside the runs (s): %s" % ", ".join("%s %.3f" % kv for kv in res["per_candidate_run_parts_s"].items()),
     "- the plan's own time is %.0f%% of the wall time; a judge that cost nothing but the runs would do %s/min" % (
         100 * (res["kernel_share_of_wall"] or 0), "%.0f" % res["limit_per_minute"] if res["limit_per_minute"] else "n/a"),
     ""]
open(os.path.join(OUT, "real_size_%s.md" % TAG), "w").write("\n".join(L))
print("\n".join(L))
EOF
