#!/usr/bin/env bash
# Signature time of every KernelBench level-1/level-2 file: `kernelsearch
# problem info --json` (what `compile` runs first), wall and CPU seconds per
# file, and how the bridge found the shapes (meta, or a real forward).
# CPU only; no GPU needed. The KernelBench checkout is an argument, never
# committed.
#
#   bash bench/signature_time.sh /path/to/KernelBench [OUT.md]
# Exit 0 when run (whatever the figures), 2 when a prerequisite is missing.
set -uo pipefail
KB=${1:?usage: signature_time.sh KERNELBENCH_DIR [OUT.md]}
OUTMD=${2:-bench/results/signature_time_$(date -u +%Y-%m-%d).md}
KS=${KS:-build/cli/kernelsearch}
PY=${KS_PYTHON:-/usr/bin/python3}
[ -x "$KS" ] || { echo "ERROR: $KS not found (set KS=...)" >&2; exit 2; }
[ -d "$KB/level1" ] && [ -d "$KB/level2" ] || { echo "ERROR: $KB has no level1/ and level2/" >&2; exit 2; }
BRIDGE=$(dirname "$0")/../evaluator/reference/bridge.py
TSV=$(mktemp)
trap 'rm -f "$TSV" "$TSV.t"' EXIT
for f in "$KB"/level1/*.py "$KB"/level2/*.py; do
  /usr/bin/time -f "%e %U %S" -o "$TSV.t" "$KS" problem info "$f" --json --python "$PY" >/dev/null 2>"$TSV.err"
  rc=$?
  # GNU time puts "Command exited with non-zero status N" first on a failure: the figures are the last line.
  read -r wall user sys < <(tail -n 1 "$TSV.t")
  how=$("$PY" "$BRIDGE" signature "$f" 2>/dev/null | "$PY" -c \
    "import json,sys; j=json.load(sys.stdin); print(j.get('inferred_by') or 'error: '+j['error']['message'][:90])")
  printf "%s\t%s\t%s\t%s\t%s\n" "$(basename "$(dirname "$f")")/$(basename "$f")" "$rc" "$wall" \
    "$(awk -v a="$user" -v b="$sys" 'BEGIN{printf "%.2f", a+b}')" "$how" >>"$TSV"
done
rm -f "$TSV.err"
{
  echo "# Signature time of KernelBench level 1 and 2 ($(date -u +%Y-%m-%d))"
  echo
  echo "machine: $(nproc) cores, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo), load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null), torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
  echo "command: kernelsearch problem info FILE --json (wall and CPU = user + sys of the whole command, one torch import)"
  echo
  awk -F'\t' '{n++; if ($2==0) ok++; w+=$3; c+=$4; if ($3+0>mw) mw=$3+0; if ($4+0>mc) mc=$4+0; if ($3<=5) w5++; if ($4<=5) c5++; how[$5]++}
    END {printf "files %d, answered (exit 0) %d; wall: mean %.2f s, max %.2f s, <= 5 s: %d; CPU: mean %.2f s, max %.2f s, <= 5 s: %d\n\n", n, ok, w/n, mw, w5, c/n, mc, c5;
         print "how the shapes were found:"; for (h in how) printf "- %s: %d\n", h, how[h]}' "$TSV"
  echo
  echo "| file | exit | wall s | CPU s | shapes by |"
  echo "|---|---|---|---|---|"
  awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}' "$TSV"
} >"$OUTMD"
echo "wrote $OUTMD" >&2
