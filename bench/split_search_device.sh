#!/usr/bin/env bash
# Issue 15 on a GPU machine: a real split search. The model side runs with the
# GPU hidden (CUDA_VISIBLE_DEVICES= , as on a login node), the GPU side
# evaluates what it left pending (`evaluate-pending`, which records the device
# facts it measured), alternating until the search ends. The model is the
# recorded softmax transcript (tests/e2e/fixtures/softmax_search.jsonl): real
# kernels, no network. Leaves $OUT/split.db and $OUT/split_prompts.txt (the
# GPU facts each prompt stated).
#
#   OUT=DIR bash bench/split_search_device.sh     (from the repository root)
set -uo pipefail
KS=${KS:-dist/bin/kernelsearch}
OUT=${OUT:-bench/results/raw}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
DB=$OUT/split.db
rm -f "$DB"
# The problem: a small fixture by default; P=.kernelbench/... for a KernelBench
# file at its real size (the model side reads it on the meta device, no --signature).
P=${P:-tests/evaluator/gpu_fixtures/softmax_small.py}
T=tests/e2e/fixtures/softmax_search.jsonl
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
model=(--model "replay:$T" --replay-loose --db "$DB")
echo "== model side, round 0 (no GPU visible), --gpu '$GPU_NAME'"
CUDA_VISIBLE_DEVICES= "$KS" search "$P" --generate-only --gpu "$GPU_NAME" --rounds 1 --ideas 2 --branches 2 \
  --beam 1 --repair 0 "${model[@]}"
echo "exit $?"
for step in 1 2 3; do
  echo "== GPU side, step $step"
  "$KS" evaluate-pending --db "$DB"
  echo "exit $?"
  status=$("$PYTHON" -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select status from searches where id=1').fetchone()[0])" "$DB")
  echo "search 1 is $status"
  [ "$status" = "finished" ] && break
  echo "== model side, step $step (no GPU visible)"
  CUDA_VISIBLE_DEVICES= "$KS" search --resume 1 --generate-only "${model[@]}"
  echo "exit $?"
done
"$KS" history --db "$DB"
"$KS" show 1 --db "$DB" | head -n 60
# What each prompt told the model about the GPU.
"$PYTHON" - "$DB" >"$OUT/split_prompts.txt" <<'PY'
import re, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
cols = [r[1] for r in db.execute("pragma table_info(llm_calls)")]
text = "prompt" if "prompt" in cols else cols[0]
for row in db.execute("select id, role, %s from llm_calls order by id" % text):
    lines = [l for l in str(row[2]).splitlines()
             if re.search(r"SMs|compute capability|Shared memory|L2 cache|bandwidth|TFLOP|unknown", l)]
    print("call %s (%s):" % (row[0], row[1]))
    for l in lines[:12]:
        print("   ", l.strip()[:200])
PY
cat "$OUT/split_prompts.txt" | head -n 80
