#!/usr/bin/env bash
# Benchmark (issue 33): a real-size command with and without a kept reference
# (`eval --keep-reference`), on one machine one after the other. Each run is
# bench/real_size_batch.sh on 24_LogSoftmax: a first single evaluation, then
# one `eval PROBLEM DIR` of N candidates (the figure: its whole wall time).
#   plain  : no keeping (each command starts the bridge, imports torch, computes)
#   kept   : --keep-reference 10m; the first evaluation keeps the reference,
#            the batch leases it
#   kept2  : the same again (the first evaluation leases too)
# Then `cache kept` and `cache release`. Run from the repository root on the
# device with distpack/ carried:
#   OUT=$OUT KS_COMMIT=<commit> bash bench/keep_reference_device.sh KB_DIR [N]
set -uo pipefail
KB=$1
N=${2:-40}
OUT=${OUT:-bench/results/raw}
mkdir -p "$OUT"
[ -d dist ] || tar -xJf distpack/dist.tar.xz
export PYTHONUNBUFFERED=1
export KS_CACHE_DIR=/tmp/ks-keep-cache
P="$KB/level1/24_LogSoftmax.py"
K=bench/kernelbench_scale/kernels/24_LogSoftmax.cu
KS=dist/bin/kernelsearch
for tag in plain kept kept2; do
  extra="--verbose"
  [ $tag != plain ] && extra="--verbose --keep-reference 10m"
  KS=$KS OUT=$OUT TAG=24_LogSoftmax_$tag EXTRA="$extra" \
    bash bench/real_size_batch.sh "$P" "$K" "$N" 2>>"$OUT/keep_reference.log"
  if [ $tag = kept ]; then "$KS" cache kept >"$OUT/kept_list.txt" 2>&1; fi
done
"$KS" cache kept >>"$OUT/kept_list.txt" 2>&1
"$KS" cache release >>"$OUT/kept_list.txt" 2>&1
sleep 2
"$KS" cache kept >>"$OUT/kept_list.txt" 2>&1
nvidia-smi --query-gpu=memory.used --format=csv >>"$OUT/kept_list.txt" 2>&1
for tag in plain kept kept2; do
  echo "== $tag"; grep -E "candidates/min|wall" "$OUT/real_size_24_LogSoftmax_$tag.md" | head -4
done
