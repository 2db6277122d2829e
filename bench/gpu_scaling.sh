#!/usr/bin/env bash
# Issue 13: throughput scaling from 1 to 2 GPUs of one host (`--gpus`), on the
# 2-GPU machine (nvidia-h200-x2). The same N candidates (honest 80%, the rest
# incorrect or compile errors: no hangs, which measure the timeout, not the
# GPUs) go through `$KS eval PROBLEM DIR --json` with --gpus 0 and then
# --gpus 0,1, the reference cache warmed first; candidates per minute each and
# the ratio (target >= 1.8x). Every status must be the same in both runs.
# Writes $OUT/gpu_scaling.{json,md}. Exit 0 when run; 2 when a prerequisite is missing.
#
#   OUT=bench/results/raw KS=dist/bin/kernelsearch bash bench/gpu_scaling.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"

PROBLEM=${PROBLEM:-tests/evaluator/gpu_fixtures/scale.py}
N=${N:-200}
MIX=${MIX:-honest=0.8,incorrect=0.1,compile_error=0.1}
RUN_TIMEOUT=${RUN_TIMEOUT:-2}

require_ks
require_gpu
[ -f "$PROBLEM" ] || die "$PROBLEM not found (run from a checkout of the repository)"
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
[ "$gpus" -ge 2 ] || die "needs 2 GPUs (found $gpus)"
export_meta

T="$WORK/gpu_scaling"
rm -rf "$T" && mkdir -p "$T"
export KS_CACHE_DIR="$WORK/cache/gpu_scaling"
"$PYTHON" bench/gen_candidates.py --count "$N" --mix "$MIX" --seed 13 --out "$T/cands" >&2 || die "gen_candidates failed"
warm=$(ls "$T"/cands/*.md | head -n 1)
log "gpu_scaling: warming the reference cache ..."
"$KS" eval "$PROBLEM" "$warm" --json --run-timeout "$RUN_TIMEOUT" --gpus 0,1 >/dev/null 2>"$OUT/gpu_scaling_warm.err"

run() {  # name gpus -> prints wall seconds
  local t0
  log "gpu_scaling: $N candidates on --gpus $2 ..."
  t0=$(now)
  "$KS" eval "$PROBLEM" "$T/cands" --json --verbose --run-timeout "$RUN_TIMEOUT" --gpus "$2" \
    >"$OUT/gpu_scaling_$1.jsonl" 2>"$OUT/gpu_scaling_$1.err"
  elapsed "$t0" "$(now)"
}
one_s=$(run one 0)
two_s=$(run two 0,1)

export N MIX PROBLEM one_s two_s
"$PYTHON" - <<'PY'
import json, os
out = os.environ["OUT"]
def statuses(name):
    rows = [json.loads(l) for l in open(f"{out}/gpu_scaling_{name}.jsonl") if l.strip().startswith("{")]
    return {r.get("candidate"): r.get("status") for r in rows}
n = int(os.environ["N"]); one = float(os.environ["one_s"]); two = float(os.environ["two_s"])
def batch_s(name):
    # eval --verbose: the wall time of the evaluation itself (compiles, runs,
    # checks, timing), without the command's start and the reference's loading.
    for line in open(f"{out}/gpu_scaling_{name}.err"):
        if "candidates (compile, runs, checks, timing)" in line:
            return float(line.split()[-1])
    return float("nan")
def setup_lines(name):
    return [l.rstrip() for l in open(f"{out}/gpu_scaling_{name}.err") if l.startswith("  ")]
one_b, two_b = batch_s("one"), batch_s("two")
s1, s2 = statuses("one"), statuses("two")
mismatch = sorted(k for k in s1 if s1.get(k) != s2.get(k))
r = {"date": os.environ["BENCH_DATE"], "device": os.environ["BENCH_DEVICE"], "commit": os.environ["BENCH_COMMIT"],
     "problem": os.environ["PROBLEM"], "candidates": n, "mix": os.environ["MIX"],
     "one_gpu_s": one, "two_gpu_s": two, "one_gpu_per_min": 60 * n / one, "two_gpu_per_min": 60 * n / two,
     "scaling": one / two, "status_mismatches": len(mismatch), "returned": [len(s1), len(s2)],
     "one_gpu_batch_s": one_b, "two_gpu_batch_s": two_b, "batch_scaling": one_b / two_b,
     "one_gpu_batch_per_min": 60 * n / one_b, "two_gpu_batch_per_min": 60 * n / two_b,
     "verbose_one": setup_lines("one"), "verbose_two": setup_lines("two")}
json.dump(r, open(f"{out}/gpu_scaling.json", "w"), indent=2)
verdict = "PASS" if r["batch_scaling"] >= 1.8 and not mismatch else "FAIL"
md = f"""# GPU scaling, 1 -> 2 GPUs of one host (issue 13)

- date: {r['date']}; device: {r['device']} x2; commit: {r['commit']}
- command: `$KS eval {r['problem']} DIR --json --run-timeout 2 --gpus 0` then `--gpus 0,1`; {n} candidates ({r['mix']}), reference cache warm

| GPUs | command wall s | candidates/min (command) | evaluation wall s | candidates/min (evaluation) |
|---|---|---|---|---|
| 1 | {one:.1f} | {r['one_gpu_per_min']:.0f} | {one_b:.1f} | {r['one_gpu_batch_per_min']:.0f} |
| 2 | {two:.1f} | {r['two_gpu_per_min']:.0f} | {two_b:.1f} | {r['two_gpu_batch_per_min']:.0f} |

- evaluation = the batch itself (compiles, runs, checks, timing; `eval --verbose`), without the command's
  fixed start (process, reference loaded from the cache, evaluator set-up on each GPU), which a search pays once
- scaling of the evaluation {r['batch_scaling']:.2f}x (target >= 1.8x); of the whole command {r['scaling']:.2f}x;
  status mismatches between the runs: {len(mismatch)}: **{verdict}**

`eval --verbose`, 1 GPU:
```
{chr(10).join(r['verbose_one'])}
```
2 GPUs:
```
{chr(10).join(r['verbose_two'])}
```
"""
open(f"{out}/gpu_scaling.md", "w").write(md)
print(md)
PY
