#!/usr/bin/env bash
# Benchmark: KernelBench level-1 / level-2 problems at their real sizes (issue 12),
# one honest kernel each (bench/kernelbench_scale/kernels/, named after the
# problem file), evaluated end to end with `kernelsearch eval`.
#
# For each kernel: a first `kernelsearch eval PROBLEM KERNEL --json` with the
# reference cache as the earlier problems left it (the problem's own entry
# cleared first, so the reference is prepared: inputs, reference outputs, eager
# and torch.compile timings), then a second one (the cache warm). Per problem:
# wall time of each, status, speedups, peak disk used by the reference cache
# (`du` of the cache folder, sampled every SAMPLE_S seconds during both runs)
# and peak GPU memory in use (nvidia-smi, sampled likewise). Targets (issue 12):
# every kernel correct, first eval <= 30 s, cache <= the cap.
#
#   bash bench/kernelbench_scale.sh KERNELBENCH_CHECKOUT [KERNELS_DIR]
#     KERNELBENCH_CHECKOUT  a KernelBench repository (its KernelBench/level1 and
#                           level2 folders are read, never written)
#     KERNELS_DIR           default bench/kernelbench_scale/kernels
#   env: KS (default dist/bin/kernelsearch), OUT (default bench/results/raw),
#        ONLY (a grep -E pattern: only these problems), EVAL_TIMEOUT_S (default
#        300, per eval), CACHE_DIR (the reference cache to sample; default
#        $KS_CACHE_DIR, else ~/.cache/kernelsearch/reference), CACHE_CAP_GB
#        (the cap to report against, default 20), SAMPLE_S (default 0.5),
#        SUITE_TABLE=1 (also run `kernelsearch eval KERNELS --problems LEVEL`
#        per level and keep its table).
#
# Results accumulate in $OUT/kernelbench_scale.jsonl (one line per problem, a
# later line for the same problem replaces an earlier one), so the benchmark
# can run in parts (ONLY=...) under a per-command time limit; every run rewrites
# $OUT/kernelbench_scale.md (a markdown table) and $OUT/kernelbench_scale.json
# from all lines. Exit 0 when it ran, whatever the numbers; 2 when a
# prerequisite is missing.
set -uo pipefail
source "$(dirname "$0")/common.sh"

KB=${1:-}
KERNELS=${2:-bench/kernelbench_scale/kernels}
[ -n "$KB" ] || die "usage: bash bench/kernelbench_scale.sh KERNELBENCH_CHECKOUT [KERNELS_DIR]"
LEVELS=()
for l in "$KB/KernelBench/level1" "$KB/KernelBench/level2" "$KB/level1" "$KB/level2"; do
  [ -d "$l" ] && LEVELS+=("$l")
done
[ ${#LEVELS[@]} -gt 0 ] || die "$KB has no KernelBench/level1 or level2 folder"
[ -d "$KERNELS" ] || die "$KERNELS: no such kernel folder"
EVAL_TIMEOUT_S=${EVAL_TIMEOUT_S:-300}
SAMPLE_S=${SAMPLE_S:-0.5}
CACHE_CAP_GB=${CACHE_CAP_GB:-20}
CACHE_DIR=${CACHE_DIR:-${KS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kernelsearch/reference}}
ONLY=${ONLY:-.}
require_ks
require_gpu
export_meta
export CACHE_DIR CACHE_CAP_GB
mkdir -p "$CACHE_DIR"
JSONL="$OUT/kernelbench_scale.jsonl"
RAW="$OUT/kernelbench_scale_raw"
mkdir -p "$RAW"

# Samples the cache's size (du, bytes) and the GPU memory in use (MiB) into
# $1 until the file $2 disappears: "t du_bytes gpu_mib" per line.
sampler() {
  local out=$1 flag=$2
  while [ -e "$flag" ]; do
    local du gpu
    du=$(du -sb "$CACHE_DIR" 2>/dev/null | cut -f1)
    gpu=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)
    echo "$(date +%s.%N) ${du:-0} ${gpu:-0}" >>"$out"
    sleep "$SAMPLE_S"
  done
}

# One `kernelsearch eval`, timed; its JSON in $RAW/$stem.$tag.json.
run_eval() {
  local problem=$1 kernel=$2 stem=$3 tag=$4
  local t0 t1 rc
  t0=$(now)
  timeout "$EVAL_TIMEOUT_S" "$KS" eval "$problem" "$kernel" --json >"$RAW/$stem.$tag.json" 2>"$RAW/$stem.$tag.err"
  rc=$?
  t1=$(now)
  echo "$(elapsed "$t0" "$t1") $rc"
}

for kernel in $(ls "$KERNELS"/*.cu "$KERNELS"/*.md 2>/dev/null | sort -V); do
  stem=$(basename "${kernel%.*}")
  echo "$stem" | grep -Eq "$ONLY" || continue
  problem=""
  for l in "${LEVELS[@]}"; do
    [ -f "$l/$stem.py" ] && problem="$l/$stem.py" && level=$(basename "$l") && break
  done
  if [ -z "$problem" ]; then
    log "$stem: no $stem.py in ${LEVELS[*]}; skipped"
    continue
  fi
  # The first evaluation prepares this problem's reference: clear its own entry
  # (the cache keys entries by the problem's stem), keep the others, as a user's
  # cache would be after the problems before it.
  rm -rf "$CACHE_DIR/$stem"-* 2>/dev/null
  samples="$RAW/$stem.samples"
  : >"$samples"
  flag="$RAW/$stem.sampling"
  touch "$flag"
  sampler "$samples" "$flag" &
  sampler_pid=$!
  log "$stem: first eval"
  read -r first_s first_rc < <(run_eval "$problem" "$kernel" "$stem" first)
  log "$stem: first ${first_s}s (exit $first_rc); second eval"
  read -r second_s second_rc < <(run_eval "$problem" "$kernel" "$stem" second)
  log "$stem: second ${second_s}s (exit $second_rc)"
  rm -f "$flag"
  wait "$sampler_pid" 2>/dev/null
  STEM=$stem LEVEL=$level PROBLEM=$problem KERNEL=$kernel FIRST_S=$first_s FIRST_RC=$first_rc \
    SECOND_S=$second_s SECOND_RC=$second_rc SAMPLES=$samples RAWDIR=$RAW "$PYTHON" - >>"$JSONL" <<'EOF'
import json, os
e = os.environ
def load(tag):
    path = os.path.join(e["RAWDIR"], e["STEM"] + "." + tag + ".json")
    try:
        text = open(path).read().strip()
        return json.loads(text) if text else None
    except (OSError, ValueError):
        return None
def err_tail(tag):
    try:
        lines = [l for l in open(os.path.join(e["RAWDIR"], e["STEM"] + "." + tag + ".err")).read().splitlines()
                 if l.strip() and not l.startswith("preparing")]
        return lines[-1][:300] if lines else ""
    except OSError:
        return ""
du, gpu = [0], [0]
for line in open(e["SAMPLES"]):
    parts = line.split()
    if len(parts) == 3:
        du.append(int(float(parts[1]))); gpu.append(int(float(parts[2])))
first, second = load("first"), load("second")
def status(j, rc, tag):
    if j: return j.get("status", "?")
    if rc == "124": return "eval timed out"
    return "exit %s: %s" % (rc, err_tail(tag))
row = {
    "problem": e["STEM"], "level": e["LEVEL"], "kernel": e["KERNEL"],
    "first_s": float(e["FIRST_S"]), "second_s": float(e["SECOND_S"]),
    "first_exit": int(e["FIRST_RC"]), "second_exit": int(e["SECOND_RC"]),
    "status": status(first, e["FIRST_RC"], "first"), "second_status": status(second, e["SECOND_RC"], "second"),
    "peak_cache_bytes": max(du), "peak_gpu_mib": max(gpu),
}
for key in ("speedup_eager", "speedup_compile"):
    row[key] = (second or first or {}).get(key)
roof = (second or first or {}).get("roofline") or {}
row["fraction_of_floor"] = roof.get("fraction_of_floor")
timing = (second or first or {}).get("timing") or {}
row["median_ms"] = timing.get("median_ms")
if first and first.get("status") != "correct": row["message"] = (first.get("message") or "")[:300]
print(json.dumps(row))
EOF
done

# The suite table of each level, from `eval KERNELS --problems LEVEL` (optional:
# it evaluates every kernel a third time).
if [ "${SUITE_TABLE:-0}" = "1" ]; then
  for l in "${LEVELS[@]}"; do
    name=$(basename "$l")
    log "suite table for $name"
    timeout $((EVAL_TIMEOUT_S * 40)) "$KS" eval "$KERNELS" --problems "$l" >"$OUT/kernelbench_scale_suite_$name.txt" \
      2>"$RAW/suite_$name.err"
  done
fi

JSONL=$JSONL "$PYTHON" - <<'EOF'
import json, os
e = os.environ
rows = {}
for line in open(e["JSONL"]):
    line = line.strip()
    if line:
        r = json.loads(line)
        rows[r["problem"]] = r  # a later run of a problem replaces an earlier one
def key(r):
    head = r["problem"].split("_", 1)[0]
    return (r["level"], int(head) if head.isdigit() else 0, r["problem"])
ordered = sorted(rows.values(), key=key)
cap = float(e["CACHE_CAP_GB"]) * 1e9
correct = [r for r in ordered if r["status"] == "correct" and r["second_status"] == "correct"]
fast_start = [r for r in ordered if r["first_s"] <= 30]
peak_cache = max([r["peak_cache_bytes"] for r in ordered] or [0])
summary = {
    "date": e.get("BENCH_DATE"), "device": e.get("BENCH_DEVICE"), "commit": e.get("BENCH_COMMIT"),
    "problems": len(ordered),
    "level1": sum(r["level"] == "level1" for r in ordered), "level2": sum(r["level"] == "level2" for r in ordered),
    "correct": len(correct), "first_eval_le_30s": len(fast_start),
    "max_first_s": max([r["first_s"] for r in ordered] or [0]),
    "peak_cache_bytes": peak_cache, "cache_cap_bytes": cap, "cache_within_cap": peak_cache <= cap,
    "rows": ordered,
}
json.dump(summary, open(os.path.join(e["OUT"], "kernelbench_scale.json"), "w"), indent=1)
def f(v, spec):
    return "-" if v is None else format(v, spec)
lines = [
    "# KernelBench at full size: first and second `kernelsearch eval` per problem", "",
    "device: %s; commit: %s; %s" % (summary["device"], summary["commit"], summary["date"]), "",
    "%d problems (%d level 1, %d level 2); %d correct on both evaluations; %d with a first evaluation <= 30 s "
    "(slowest %.1f s); peak reference cache %.2f GB (cap %.0f GB: %s)."
    % (summary["problems"], summary["level1"], summary["level2"], summary["correct"], summary["first_eval_le_30s"],
       summary["max_first_s"], peak_cache / 1e9, cap / 1e9, "within" if summary["cache_within_cap"] else "OVER"), "",
    "| level | problem | status | first eval s | second eval s | vs eager | vs compile | floor | peak cache GB | peak GPU GiB | note |",
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
]
for r in ordered:
    st = r["status"] if r["status"] == r["second_status"] else "%s / %s" % (r["status"], r["second_status"])
    floor = None if r.get("fraction_of_floor") is None else r["fraction_of_floor"] * 100
    lines.append("| %s | %s | %s | %.1f | %.1f | %s | %s | %s | %.2f | %.1f | %s |" % (
        r["level"], r["problem"], st, r["first_s"], r["second_s"], f(r.get("speedup_eager"), ".2f"),
        f(r.get("speedup_compile"), ".2f"), f(floor, ".0f") + ("%" if floor is not None else ""),
        r["peak_cache_bytes"] / 1e9, r["peak_gpu_mib"] / 1024, (r.get("message") or "").replace("|", "/")[:120]))
open(os.path.join(e["OUT"], "kernelbench_scale.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
exit 0
