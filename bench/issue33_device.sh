#!/usr/bin/env bash
# Issue 33 on the GPU machine: the real-size phase benchmark
# (bench/real_size_batch.sh) on 24_LogSoftmax (6.4 GB input) and a KernelBench
# GEMM, and bench/throughput.sh's mixed batch, each with the binaries before
# (dist-base/) and after (dist/), one after the other on one machine. The
# reference cache is shared, so only the first evaluation of each problem
# prepares it.
#   OUT=DIR BASE_COMMIT=... NEW_COMMIT=... bash bench/issue33_device.sh KB_DIR
#   env: N_SOFTMAX (40), N_GEMM (20), ONLY_NEW=1 (skip dist-base), SKIP_THROUGHPUT=1, SKIP_GEMM=1,
#        EXTRA (more `eval` flags for the real-size batches, e.g. --verbose)
set -uo pipefail
KB=$1
OUT=${OUT:-bench/results/raw}
mkdir -p "$OUT"
[ -d dist ] || tar -xJf distpack/dist.tar.xz
[ -d dist-base ] || [ ! -f distpack/base.tar.xz ] || tar -xJf distpack/base.tar.xz
# Each version its own reference cache: both first evaluations prepare the
# reference and time eager and torch.compile, so they compare.
export PYTHONUNBUFFERED=1
versions="base new"
[ -n "${ONLY_NEW:-}" ] && versions=new
for v in $versions; do
  d=dist; c=${NEW_COMMIT:-unknown}
  [ $v = base ] && d=dist-base c=${BASE_COMMIT:-unknown}
  export KS_CACHE_DIR=/tmp/ks-issue33-cache-$v
  KS=$d/bin/kernelsearch KS_COMMIT=$c OUT=$OUT TAG=24_LogSoftmax_$v \
    bash bench/real_size_batch.sh "$KB/level1/24_LogSoftmax.py" bench/kernelbench_scale/kernels/24_LogSoftmax.cu "${N_SOFTMAX:-40}" 2>>"$OUT/issue33.log"
  [ -z "${SKIP_GEMM:-}" ] && KS=$d/bin/kernelsearch KS_COMMIT=$c OUT=$OUT TAG=12_Gemm_$v \
    bash bench/real_size_batch.sh "$KB/level2/12_Gemm_Multiply_LeakyReLU.py" bench/kernelbench_scale/kernels/12_Gemm_Multiply_LeakyReLU.cu "${N_GEMM:-20}" 2>>"$OUT/issue33.log"
  if [ -z "${SKIP_THROUGHPUT:-}" ]; then
    mkdir -p "$OUT/tp_$v"
    KS=$d/bin/kernelsearch KS_COMMIT=$c OUT=$OUT/tp_$v WORK=/tmp/ks-tp-$v SKIP_ISSUE4=1 bash bench/throughput.sh >"$OUT/tp_$v/log.txt" 2>&1
    grep -E "candidates/min|mixed \(" "$OUT/tp_$v/throughput.md" | head -3
  fi
done
