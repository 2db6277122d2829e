#!/usr/bin/env bash
# A PNG of a search's report page, as headless Chromium draws it:
#   scripts/report_screenshot.sh DB SEARCH_ID out.png [WIDTHxHEIGHT]
# Uses build/cli/kernelsearch (or $KS_BIN) and /usr/bin/chromium (or $CHROMIUM).
set -euo pipefail
if [ $# -lt 3 ]; then
  echo "usage: $0 DB SEARCH_ID out.png [WIDTHxHEIGHT]" >&2
  exit 2
fi
db=$1; search=$2; out=$3; size=${4:-1400x2200}
root="$(cd "$(dirname "$0")/.." && pwd)"
bin=${KS_BIN:-$root/build/cli/kernelsearch}
chromium=${CHROMIUM:-/usr/bin/chromium}
[ -x "$bin" ] || { echo "$0: no kernelsearch binary at $bin (build first, or set KS_BIN)" >&2; exit 2; }
[ -x "$chromium" ] || { echo "$0: no chromium at $chromium (apt-get install chromium, or set CHROMIUM)" >&2; exit 3; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" report "$search" --db "$db" --out "$tmp/report.html" >/dev/null
out_abs="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
"$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
  --disable-component-update --disable-sync --user-data-dir="$tmp/profile" --hide-scrollbars \
  --virtual-time-budget=5000 --window-size="${size/x/,}" --screenshot="$out_abs" "file://$tmp/report.html" \
  2>"$tmp/chromium.log" || { cat "$tmp/chromium.log" >&2; exit 3; }
echo "wrote $out_abs"
