#!/usr/bin/env bash
# Benchmark B: evaluation throughput and robustness on the scale problem
# (tests/evaluator/gpu_fixtures/scale.py, out = x * 2 + 1, 1024x1024 fp32).
#
#  1. warm-up: one honest candidate with an empty reference cache (cold: the
#     reference is prepared: python, torch, eager + torch.compile timing), then the
#     same with the cache filled; the difference is the reference preparation.
#  2. mixed batch: N_MIXED (100) candidates, honest 60% / incorrect 15% /
#     compile errors 10% / crashes 5% / hangs 2% / cheats 8%, one
#     `$KS eval PROBLEM DIR --json --run-timeout 2`, wall clock end to end;
#     candidates per minute (target >= 100/min) and every status against
#     expected.json.
#  3. issue-4 batch: N_ISSUE4 (200) candidates, 20% crash, hang or cheat; every
#     honest one must come back correct, the total time must stay under
#     ISSUE4_BOUND_S (240 s), worker restarts counted from the statuses
#     (every timeout and runtime_error ends the worker).
# Writes $OUT/throughput.json, $OUT/throughput.md and the raw JSON lines
# ($OUT/throughput_{mixed,issue4}.jsonl). Exit 0 when run, whatever the numbers;
# 2 when a prerequisite is missing.
#
#   OUT=bench/results/raw KS=dist/bin/kernelsearch bash bench/throughput.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"

PROBLEM=${PROBLEM:-tests/evaluator/gpu_fixtures/scale.py}
RUN_TIMEOUT=${RUN_TIMEOUT:-2}
N_MIXED=${N_MIXED:-100}
N_ISSUE4=${N_ISSUE4:-200}
MIX_MIXED=${MIX_MIXED:-honest=0.6,incorrect=0.15,compile_error=0.1,crash=0.05,hang=0.02,cheat=0.08}
MIX_ISSUE4=${MIX_ISSUE4:-honest=0.8,crash=0.07,hang=0.05,cheat=0.08}
ISSUE4_BOUND_S=${ISSUE4_BOUND_S:-240}
BATCH_LIMIT_S=${BATCH_LIMIT_S:-300}   # hard cap per batch command (keeps run_all bounded)
TIMING=${TIMING:-adaptive}            # eval --timing: adaptive (default) or full (the method before issue 13)
SKIP_ISSUE4=${SKIP_ISSUE4:-0}         # 1: the mixed batch only

require_ks
require_gpu
[ -f "$PROBLEM" ] || die "$PROBLEM not found (run from a checkout of the repository)"
export_meta

T="$WORK/throughput"
rm -rf "$T"
mkdir -p "$T"
export KS_CACHE_DIR="$WORK/cache/throughput"
rm -rf "$KS_CACHE_DIR"

"$PYTHON" bench/gen_candidates.py --count 1 --mix honest=1 --seed 99 --out "$T/warm" >&2 || die "gen_candidates failed"
"$PYTHON" bench/gen_candidates.py --count "$N_MIXED" --mix "$MIX_MIXED" --seed 1 --out "$T/mixed" >&2 || die "gen_candidates failed"
"$PYTHON" bench/gen_candidates.py --count "$N_ISSUE4" --mix "$MIX_ISSUE4" --seed 2 --out "$T/issue4" >&2 || die "gen_candidates failed"
warm_md=$(ls "$T"/warm/*.md | head -n 1)

# 1. warm-up, cold then cached.
log "throughput: warm-up (cold reference cache) ..."
t0=$(now)
"$KS" eval "$PROBLEM" "$warm_md" --json --run-timeout "$RUN_TIMEOUT" --timing "$TIMING" >"$OUT/throughput_warm_cold.json" 2>"$OUT/throughput_warm_cold.err"
warm_cold_rc=$?
warm_cold_s=$(elapsed "$t0" "$(now)")
log "throughput: warm-up (cached reference) ..."
t0=$(now)
"$KS" eval "$PROBLEM" "$warm_md" --json --run-timeout "$RUN_TIMEOUT" --timing "$TIMING" >"$OUT/throughput_warm_cached.json" 2>"$OUT/throughput_warm_cached.err"
warm_cached_rc=$?
warm_cached_s=$(elapsed "$t0" "$(now)")
if [ "$warm_cold_rc" -ge 2 ] || [ "$warm_cached_rc" -ge 2 ]; then
  echo "throughput: the warm-up eval failed (rc $warm_cold_rc / $warm_cached_rc):" >&2
  tail -n 20 "$OUT/throughput_warm_cold.err" >&2
fi

run_batch() {  # name dir -> $OUT/throughput_NAME.jsonl, prints "rc wall_s"
  local name=$1 dir=$2 t0 rc
  log "throughput: batch $name ($(ls "$dir"/*.md | wc -l) candidates) ..."
  t0=$(now)
  timeout --kill-after=10 "$BATCH_LIMIT_S" "$KS" eval "$PROBLEM" "$dir" --json --run-timeout "$RUN_TIMEOUT" --timing "$TIMING" \
    >"$OUT/throughput_$name.jsonl" 2>"$OUT/throughput_$name.err"
  rc=$?
  echo "$rc $(elapsed "$t0" "$(now)")"
}
read -r mixed_rc mixed_s < <(run_batch mixed "$T/mixed")
if [ "$SKIP_ISSUE4" = 1 ]; then
  issue4_rc=0 issue4_s=0
  : >"$OUT/throughput_issue4.jsonl"
else
  read -r issue4_rc issue4_s < <(run_batch issue4 "$T/issue4")
fi

export T RUN_TIMEOUT TIMING N_MIXED N_ISSUE4 MIX_MIXED MIX_ISSUE4 ISSUE4_BOUND_S PROBLEM BATCH_LIMIT_S
export warm_cold_rc warm_cold_s warm_cached_rc warm_cached_s mixed_rc mixed_s issue4_rc issue4_s
"$PYTHON" - <<'EOF'
import collections, json, os, statistics

E = os.environ
OUT, T = E["OUT"], E["T"]


def load_lines(path):
    rows, junk = [], 0
    try:
        for line in open(path):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                junk += 1
    except OSError:
        pass
    return rows, junk


def err_tail(name):
    try:
        return open(os.path.join(OUT, "throughput_%s.err" % name)).read()[-1500:]
    except OSError:
        return ""


def analyse(name, n, rc, wall):
    d = os.path.join(T, name)
    expected = json.load(open(os.path.join(d, "expected.json")))
    kinds = json.load(open(os.path.join(d, "kinds.json")))
    rows, junk = load_lines(os.path.join(OUT, "throughput_%s.jsonl" % name))
    got = {os.path.basename(r.get("candidate", "")): r for r in rows}
    statuses = collections.Counter(r.get("status", "?") for r in rows)
    mismatches = []
    for f, want in sorted(expected.items()):
        r = got.get(f)
        st = r.get("status") if r else "missing"
        if st != want:
            mismatches.append({"candidate": f, "kind": kinds.get(f), "expected": want, "got": st,
                               "message": (r or {}).get("message", "")[:300]})
    honest = [f for f in expected if kinds.get(f) == "honest"]
    honest_ok = sum(1 for f in honest if got.get(f, {}).get("status") == "correct")
    eval_s = [r.get("eval_s", 0) for r in rows if isinstance(r.get("eval_s"), (int, float))]
    compile_s = [r.get("compile_s", 0) for r in rows if isinstance(r.get("compile_s"), (int, float))]
    by_kind = collections.defaultdict(list)
    for f, r in got.items():
        if isinstance(r.get("eval_s"), (int, float)):
            by_kind[kinds.get(f, "?")].append(r["eval_s"] + (r.get("compile_s") or 0))
    medians = [r["timing"]["median_ms"] for r in rows if isinstance(r.get("timing"), dict)]
    # Where the time went: each phase summed over the batch (GPU side, one
    # candidate after another), compile CPU seconds (parallel, ahead of the GPU).
    phases = collections.defaultdict(float)
    for r in rows:
        for k, v in (r.get("phases_s") or {}).items():
            phases[k] += v
    stopped = collections.Counter((r.get("timing") or {}).get("stopped", "-") for r in rows if isinstance(r.get("timing"), dict))
    runs = [r["timing"]["runs"] for r in rows if isinstance(r.get("timing"), dict)]
    res = {
        "candidates": n, "returned": len(rows), "unparsed_lines": junk, "rc": rc, "wall_s": wall,
        "per_minute": (len(rows) / wall * 60.0) if wall > 0 and rows else 0.0,
        "statuses": dict(statuses),
        "mismatches": mismatches,
        "honest": len(honest), "honest_correct": honest_ok,
        "worker_restarts_from_statuses": statuses.get("timeout", 0) + statuses.get("runtime_error", 0),
        "eval_s": {"median": statistics.median(eval_s) if eval_s else None, "max": max(eval_s) if eval_s else None,
                   "sum": sum(eval_s)},
        "compile_s": {"median": statistics.median(compile_s) if compile_s else None,
                      "max": max(compile_s) if compile_s else None},
        "seconds_by_kind": {k: {"n": len(v), "median": statistics.median(v), "max": max(v)} for k, v in sorted(by_kind.items())},
        "candidate_median_ms": {"median": statistics.median(medians), "min": min(medians), "max": max(medians)} if medians else None,
        "device": rows[0].get("device") if rows else None,
        "phases_s": dict(phases), "compile_cpu_s": sum(compile_s), "timing_stopped": dict(stopped),
        "timed_runs": {"median": statistics.median(runs), "min": min(runs), "max": max(runs)} if runs else None,
    }
    if rc >= 2 or not rows:
        res["error"] = "eval exited %d%s; stderr tail: %s" % (rc, " (killed at the %s s cap)" % E["BATCH_LIMIT_S"] if rc in (124, 137) else "", err_tail(name))
    return res


def fnum(v, fmt="%.1f"):
    return fmt % v if isinstance(v, (int, float)) else "n/a"


warm_cold, warm_cached = float(E["warm_cold_s"]), float(E["warm_cached_s"])
mixed = analyse("mixed", int(E["N_MIXED"]), int(E["mixed_rc"]), float(E["mixed_s"]))
issue4 = analyse("issue4", int(E["N_ISSUE4"]), int(E["issue4_rc"]), float(E["issue4_s"]))
issue4["bound_s"] = float(E["ISSUE4_BOUND_S"])
issue4["within_bound"] = (issue4["wall_s"] <= issue4["bound_s"] and issue4["returned"] == issue4["candidates"]
                          and issue4["rc"] not in (124, 137))
issue4["all_honest_correct"] = issue4["honest"] > 0 and issue4["honest_correct"] == issue4["honest"]
mixed["target_per_minute"] = 100
mixed["meets_target"] = mixed["per_minute"] >= 100

warm_single = None
try:
    warm_single = json.load(open(os.path.join(OUT, "throughput_warm_cached.json")))
except (OSError, ValueError):
    pass
result = {
    "benchmark": "throughput", "date": E["BENCH_DATE"], "device": E["BENCH_DEVICE"], "commit": E["BENCH_COMMIT"],
    "host_cpus": int(E["BENCH_HOST_CPUS"]), "cpu": E["BENCH_CPU"],
    "command": "$KS eval %s DIR --json --run-timeout %s --timing %s  (KS=%s)" % (E["PROBLEM"], E["RUN_TIMEOUT"], E["TIMING"], E["KS"]),
    "warmup": {"cold_s": warm_cold, "cold_rc": int(E["warm_cold_rc"]), "cached_s": warm_cached,
               "cached_rc": int(E["warm_cached_rc"]),
               "reference_prep_s": warm_cold - warm_cached,
               "single_candidate_status": (warm_single or {}).get("status")},
    "mixed": dict(mixed, mix=E["MIX_MIXED"]),
    "issue4": dict(issue4, mix=E["MIX_ISSUE4"]),
}
json.dump(result, open(os.path.join(OUT, "throughput.json"), "w"), indent=1)

L = []
L.append("## Benchmark B: evaluation throughput, %s" % E["BENCH_DATE"])
L.append("")
L.append("- device: %s (%s CPUs, %s)" % (E["BENCH_DEVICE"], E["BENCH_HOST_CPUS"], E["BENCH_CPU"]))
L.append("- commit: %s" % E["BENCH_COMMIT"])
L.append("- command: `%s`; candidates from `bench/gen_candidates.py` (seeds 1 and 2)" % result["command"])
L.append("- reference preparation: cold warm-up %.1f s, cached warm-up %.1f s: about %.1f s is reference preparation "
         "(python + torch + eager/torch.compile timing); the batches below run with the cache filled"
         % (warm_cold, warm_cached, warm_cold - warm_cached))
L.append("")
L.append("| batch | candidates | returned | wall s | candidates/min | mismatches | honest correct | worker restarts | median eval s | max eval s |")
L.append("|---|---|---|---|---|---|---|---|---|---|")
for name, r in (("mixed", mixed), ("issue-4", issue4)):
    L.append("| %s | %d | %d | %.1f | %.0f | %d | %d/%d | %d | %s | %s |" % (
        name, r["candidates"], r["returned"], r["wall_s"], r["per_minute"], len(r["mismatches"]), r["honest_correct"],
        r["honest"], r["worker_restarts_from_statuses"], fnum(r["eval_s"]["median"], "%.2f"), fnum(r["eval_s"]["max"], "%.2f")))
L.append("")
L.append("- mixed (%s): %.0f candidates/min vs target >= 100: **%s**; statuses %s"
         % (E["MIX_MIXED"], mixed["per_minute"], "PASS" if mixed["meets_target"] else "FAIL", json.dumps(mixed["statuses"], sort_keys=True)))
L.append("- issue 4 (%s): honest %d/%d correct (**%s**), %.1f s vs bound %.0f s (**%s**); statuses %s"
         % (E["MIX_ISSUE4"], issue4["honest_correct"], issue4["honest"], "PASS" if issue4["all_honest_correct"] else "FAIL",
            issue4["wall_s"], issue4["bound_s"], "PASS" if issue4["within_bound"] else "FAIL",
            json.dumps(issue4["statuses"], sort_keys=True)))
L.append("- worker restarts are counted from the statuses (each timeout and runtime_error ends the worker); "
         "the human output's \"worker restarts: N\" is not printed with --json")
for name, r in (("mixed", mixed), ("issue-4", issue4)):
    if r["phases_s"]:
        L.append("- %s, where the time went (seconds summed over the batch; GPU-side phases run one candidate after "
                 "another, compiles in parallel ahead of them): %s; compile %.1f CPU s; timed runs per correct "
                 "candidate %s; why timing stopped %s" % (
                     name, ", ".join("%s %.2f" % (k, v) for k, v in sorted(r["phases_s"].items(), key=lambda kv: -kv[1])),
                     r["compile_cpu_s"], json.dumps(r["timed_runs"]), json.dumps(r["timing_stopped"], sort_keys=True)))
for name, r in (("mixed", mixed), ("issue-4", issue4)):
    sk = r["seconds_by_kind"]
    if sk:
        L.append("- %s, seconds per candidate (compile + eval) by kind: %s" % (name, ", ".join(
            "%s median %.2f max %.2f (n=%d)" % (k, v["median"], v["max"], v["n"]) for k, v in sk.items())))
    if r.get("error"):
        L.append("- %s: ERROR %s" % (name, r["error"].replace("\n", " ")[:800]))
for name, r in (("mixed", mixed), ("issue-4", issue4)):
    if r["mismatches"]:
        L.append("")
        L.append("%s mismatches:" % name)
        L.append("")
        L.append("| candidate | kind | expected | got | message |")
        L.append("|---|---|---|---|---|")
        for m in r["mismatches"][:40]:
            L.append("| %s | %s | %s | %s | %s |" % (m["candidate"], m["kind"], m["expected"], m["got"],
                                                 m["message"].replace("|", "\\|").replace("\n", " ")[:160]))
        if len(r["mismatches"]) > 40:
            L.append("| ... %d more in throughput.json | | | | |" % (len(r["mismatches"]) - 40))
L.append("")
open(os.path.join(OUT, "throughput.md"), "w").write("\n".join(L))
print("\n".join(L))
EOF
