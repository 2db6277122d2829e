#!/usr/bin/env bash
# Issue 8's headroom table: for every problem in problems/ with a seed, one
#   $KS eval problems/NAME.py problems/seeds/NAME.cu --json --sets $BASELINE_SETS
# (each under `timeout $EVAL_LIMIT_S`, failures recorded, the run goes on), and
# from it: eager and torch.compile medians, the seed's median and status, the
# evaluator's bandwidth floor (roofline.floor_ms), a compute floor
# FLOPS / measured peak of the problem's dtype (bench/peaks.py) when the problem
# declares FLOPS, floor = max of the two, and the fraction of the floor that
# eager / torch.compile / the seed reach (floor / median).
#
# Each problem gets its own reference cache ($WORK/cache/NAME), removed after its
# eval unless KEEP_CACHE=1 (softmax, gelu and row_sum are GiBs per input set).
# BASELINES_BUDGET_S (0 = none) stops starting new problems when the budget is
# spent; the rest are recorded as skipped. PROBLEMS="a b" picks problems.
# Writes $OUT/peaks.json (if missing), $OUT/baselines.json, $OUT/baselines.md.
#
#   OUT=bench/results/raw KS=dist/bin/kernelsearch bash bench/baselines.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"

EVAL_LIMIT_S=${EVAL_LIMIT_S:-120}
BASELINE_SETS=${BASELINE_SETS:-1}
BASELINES_BUDGET_S=${BASELINES_BUDGET_S:-0}
MIN_START_S=${MIN_START_S:-45}   # do not start a problem with less budget than this left
KEEP_CACHE=${KEEP_CACHE:-0}

require_ks
require_gpu
export_meta

# Cheap and the first five of problems/README.md first, so a budget cut drops the rest.
ORDER="softmax_large matmul_4096 layernorm_large conv2d_alexnet conv2d_relu_maxpool rmsnorm rmsnorm_bf16 row_sum
gelu_tanh swiglu_fp16 transpose_8192 cumsum cross_entropy bmm_bf16 linear_bias_gelu_bf16 attention_bf16"
if [ -z "${PROBLEMS:-}" ]; then
  PROBLEMS=""
  for p in $ORDER; do [ -f "problems/$p.py" ] && [ -f "problems/seeds/$p.cu" ] && PROBLEMS="$PROBLEMS $p"; done
  for f in problems/*.py; do
    p=$(basename "$f" .py)
    [ -f "problems/seeds/$p.cu" ] || continue
    case " $PROBLEMS " in *" $p "*) ;; *) PROBLEMS="$PROBLEMS $p" ;; esac
  done
fi
[ -n "${PROBLEMS// /}" ] || die "no problems with seeds found under problems/"

if [ ! -s "$OUT/peaks.json" ]; then
  log "baselines: measuring peaks (bench/peaks.py) ..."
  "$PYTHON" bench/peaks.py --out "$OUT/peaks.json" || echo "baselines: peaks.py failed; no compute floors" >&2
fi

RAW="$OUT/baselines_raw.jsonl"
: >"$RAW"
start=$(now)
for p in $PROBLEMS; do
  left=""
  if [ "$BASELINES_BUDGET_S" != "0" ]; then
    used=$(elapsed "$start" "$(now)")
    left=$(awk -v b="$BASELINES_BUDGET_S" -v u="$used" 'BEGIN{printf "%d", b-u}')
    if [ "$left" -lt "$MIN_START_S" ]; then
      log "baselines: $p skipped (budget: ${left}s left)"
      echo "{\"problem\": \"$p\", \"status\": \"skipped\", \"message\": \"time budget: ${left} s of ${BASELINES_BUDGET_S} s left\"}" >>"$RAW"
      continue
    fi
  fi
  limit=$EVAL_LIMIT_S
  if [ -n "$left" ] && [ "$left" -lt "$limit" ]; then limit=$left; fi
  log "baselines: $p (limit ${limit}s) ..."
  export KS_CACHE_DIR="$WORK/cache/$p"
  t0=$(now)
  timeout --kill-after=10 "$limit" "$KS" eval "problems/$p.py" "problems/seeds/$p.cu" --json --sets "$BASELINE_SETS" \
    >"$WORK/baseline_eval.json" 2>"$WORK/baseline_eval.err"
  rc=$?
  wall=$(elapsed "$t0" "$(now)")
  "$PYTHON" - "$p" "$rc" "$wall" "$limit" >>"$RAW" <<'EOF'
import json, os, sys
p, rc, wall, limit = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
W = os.environ["WORK"]
try:
    j = json.load(open(os.path.join(W, "baseline_eval.json")))
except (OSError, ValueError):
    j = None
err = open(os.path.join(W, "baseline_eval.err"), errors="replace").read()
if j is None:
    why = "killed at the %s s limit" % limit if rc in (124, 137) else "no JSON from eval (rc %d)" % rc
    j = {"status": "eval_failed", "message": why + ": " + err.strip()[-600:]}
for k in ("compile_log", "worker_log", "launches", "errors"):
    j.pop(k, None)
j.update({"problem": p, "rc": rc, "wall_s": wall, "stderr_tail": err.strip()[-400:]})
print(json.dumps(j))
EOF
  [ "$KEEP_CACHE" = "1" ] || rm -rf "$WORK/cache/$p"
  log "baselines: $p done in ${wall}s (rc $rc)"
done

export BASELINE_SETS EVAL_LIMIT_S BASELINES_BUDGET_S
"$PYTHON" - <<'EOF'
import ast, json, os

E = os.environ
OUT = E["OUT"]
rows = [json.loads(l) for l in open(os.path.join(OUT, "baselines_raw.jsonl")) if l.strip()]
try:
    peaks = json.load(open(os.path.join(OUT, "peaks.json")))
except (OSError, ValueError):
    peaks = None


def static_info(name):
    """FLOPS (module-level constant arithmetic) and dtype (from the source) without importing the problem."""
    src = open(os.path.join("problems", name + ".py")).read()
    env, flops = {}, None
    for node in ast.parse(src).body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):  # A = B = 1 too
            try:
                v = eval(compile(ast.Expression(node.value), name, "eval"), {"__builtins__": {}}, dict(env))
            except Exception:  # noqa: BLE001 - not a constant expression
                continue
            for t in node.targets:
                env[t.id] = v
    if isinstance(env.get("FLOPS"), (int, float)):
        flops = float(env["FLOPS"])
    if "bfloat16" in src:
        dtype = "bf16"
    elif "float16" in src or ".half()" in src:
        dtype = "fp16"
    else:
        dtype = "fp32"
    return flops, dtype


def med(j, key):
    t = j.get(key)
    return t.get("median_ms") if isinstance(t, dict) else None


table = []
for j in rows:
    p = j["problem"]
    flops, dtype = static_info(p)
    rl = j.get("roofline") if isinstance(j.get("roofline"), dict) else {}
    if rl.get("flops"):
        flops = rl["flops"]
    # The evaluator's floor_ms is already max(bandwidth, compute) since it measures
    # FLOP peaks itself; the bandwidth part is bytes / its measured bandwidth.
    bw_floor = (rl["bytes"] / (rl["peak_gbps"] * 1e9) * 1e3) if rl.get("peak_gbps") and rl.get("bytes") else rl.get("floor_ms")
    comp_floor = tf32_floor = None
    if flops and peaks:
        pk = peaks["tflops"].get(dtype)
        if pk:
            comp_floor = flops / (pk * 1e12) * 1e3
        if dtype == "fp32" and peaks["tflops"].get("tf32"):
            tf32_floor = flops / (peaks["tflops"]["tf32"] * 1e12) * 1e3
    floors = [f for f in (bw_floor, comp_floor) if f]
    floor = max(floors) if floors else None
    eager, comp, seed = med(j, "eager"), med(j, "compiled"), med(j, "timing")
    frac = lambda t: (floor / t) if floor and t else None
    table.append({
        "problem": p, "dtype": dtype, "status": j.get("status"), "message": (j.get("message") or "")[:300],
        "rc": j.get("rc"), "wall_s": j.get("wall_s"),
        "eager_ms": eager, "compiled_ms": comp, "seed_ms": seed,
        "speedup_eager": j.get("speedup_eager"), "speedup_compile": j.get("speedup_compile"),
        "bytes": rl.get("bytes"), "flops": flops,
        "bw_floor_ms": bw_floor, "compute_floor_ms": comp_floor, "tf32_floor_ms": tf32_floor, "floor_ms": floor,
        "eager_fraction_of_floor": frac(eager), "compiled_fraction_of_floor": frac(comp), "seed_fraction_of_floor": frac(seed),
        "evaluator_fraction_of_floor": rl.get("fraction_of_floor"), "device": j.get("device"),
    })

res = {"benchmark": "baselines", "date": E["BENCH_DATE"], "device": E["BENCH_DEVICE"], "commit": E["BENCH_COMMIT"],
       "command": "$KS eval problems/NAME.py problems/seeds/NAME.cu --json --sets %s  (timeout %s s each)"
                  % (E["BASELINE_SETS"], E["EVAL_LIMIT_S"]),
       "peaks": peaks, "problems": table}
json.dump(res, open(os.path.join(OUT, "baselines.json"), "w"), indent=1)


def f(v, fmt="%.3f"):
    return fmt % v if isinstance(v, (int, float)) else "n/a"


L = ["## Baselines and headroom (issue 8), %s" % E["BENCH_DATE"], "",
     "- device: %s" % E["BENCH_DEVICE"], "- commit: %s" % E["BENCH_COMMIT"],
     "- command: `%s`" % res["command"]]
if peaks:
    L.append("- measured peaks (bench/peaks.py, %d^3 matmul, median of %d): %s; D2D copy %.0f GB/s (read + write)"
             % (peaks["n"], peaks["runs"], ", ".join("%s %.1f TFLOP/s" % kv for kv in peaks["tflops"].items()), peaks["copy_gbps"]))
else:
    L.append("- peaks: not measured (peaks.py failed): compute floors missing")
L += ["- floor = max(bandwidth floor from the evaluator's roofline, FLOPS / peak of the dtype (fp32 = TF32 off));"
      " fraction = floor / median (1.0 = at the floor); tf32 floor shown for fp32 problems that declare FLOPS", "",
      "| problem | dtype | seed status | eager ms | compile ms | seed ms | bw floor ms | compute floor ms (tf32) | eager frac | compile frac | seed frac | wall s |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
for r in table:
    cf = f(r["compute_floor_ms"]) + (" (%s)" % f(r["tf32_floor_ms"]) if r["tf32_floor_ms"] else "")
    L.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
        r["problem"], r["dtype"], r["status"], f(r["eager_ms"]), f(r["compiled_ms"]), f(r["seed_ms"]), f(r["bw_floor_ms"], "%.4f"),
        cf, f(r["eager_fraction_of_floor"], "%.2f"), f(r["compiled_fraction_of_floor"], "%.2f"),
        f(r["seed_fraction_of_floor"], "%.3f"), f(r["wall_s"], "%.0f")))
bad = [r for r in table if r["status"] != "correct"]
if bad:
    L += ["", "Not correct / failed / skipped:", ""]
    for r in bad:
        L.append("- %s: %s: %s" % (r["problem"], r["status"], r["message"].replace("\n", " ")[:300]))
L.append("")
open(os.path.join(OUT, "baselines.md"), "w").write("\n".join(L))
print("\n".join(L))
EOF
