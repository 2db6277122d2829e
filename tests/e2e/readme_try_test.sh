#!/usr/bin/env bash
# The README's "Try it without a GPU" block, run as written (issue 22): the lines
# between <!-- try-without-a-gpu --> markers, from the repository root, with
# only the store and the port moved to private places. Needs a python3 with
# torch (the problem's signature); skips (77) without one.
#   readme_try_test.sh SOURCE_DIR CLI_DIR
set -euo pipefail
src=$1 cli_dir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
py=""
for p in ${KS_PYTHON:-} python3 /usr/bin/python3; do
  if "$p" -c 'import torch' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || { echo "SKIP: no python3 with torch"; exit 77; }
port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
awk '/<!-- try-without-a-gpu -->/{f=1; next} /<!-- \/try-without-a-gpu -->/{f=0} f' "$src/README.md" |
  sed 's/^    //' | sed "s/50051/$port/g; s|KS_DB=\$PWD/try.db|KS_DB=$tmp/try.db|" >"$tmp/try.sh"
grep -q "kernelsearch search" "$tmp/try.sh" || { echo "FAIL: no try-without-a-gpu block in README.md"; exit 1; }
cd "$src"
PATH="$cli_dir:$PATH" KS_PYTHON="$py" timeout 300 bash -e "$tmp/try.sh" >"$tmp/out" 2>&1 || {
  echo "FAIL: the README block exited $?"; cat "$tmp/out"; exit 1; }
for want in "NVRTC" "search 1: finished (rounds)" "best: candidate" "listening on 127.0.0.1:$port" \
            "finished: search" "rounds 1/1"; do
  grep -qF "$want" "$tmp/out" || { echo "FAIL: '$want' not in the output:"; cat "$tmp/out"; exit 1; }
done
echo "PASS: the README's try-without-a-gpu block ran as written"
