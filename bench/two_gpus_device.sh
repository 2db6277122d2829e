#!/usr/bin/env bash
# Issue 33's two-GPU check on a two-GPU machine, in one call: the real-size
# batch (bench/real_size_batch.sh, 24_LogSoftmax, a resident reference) with
# `--gpus 0` and then `--gpus 0,1`, each at N candidates, `--verbose` so that
# every command's setup phases land in its .err file. Writes $OUT/two_gpus.tar.gz
# and prints the summaries.
# KEEP=10m: every command with --keep-reference 10m (the first keeps the
# reference, every batch leases it).
#   OUT=DIR KS_COMMIT=... [KEEP=10m] bash bench/two_gpus_device.sh KB_DIR [N...]
set -uo pipefail
KB=$1; shift
sizes=${*:-60}
OUT=${OUT:-bench/results/raw}
mkdir -p "$OUT"
[ -d dist ] || tar -xJf distpack/dist.tar.xz
export KS_CACHE_DIR=/tmp/ks-two-gpus-cache PYTHONUNBUFFERED=1
work=$(mktemp -d)
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader > "$work/device.txt"
for n in $sizes; do
  for g in 0 0,1; do
    KS=dist/bin/kernelsearch OUT=$work TAG="softmax_n${n}_gpus_${g/,/_}" EXTRA="--gpus $g --verbose${KEEP:+ --keep-reference $KEEP}" \
      bash bench/real_size_batch.sh "$KB/level1/24_LogSoftmax.py" \
      bench/kernelbench_scale/kernels/24_LogSoftmax.cu "$n" 2>>"$work/two_gpus.log" | grep -E "^- (batch|per candidate, phases)"
    # The setup phases of the batch command (its --verbose lines).
    grep -E "^  |^phases" "$work/real_size_softmax_n${n}_gpus_${g/,/_}.err" | head -40
  done
done
tar -czf "$OUT/two_gpus.tar.gz" -C "$work" .
