# shellcheck shell=bash
# Shared helpers for the device benchmarks (sourced, not run).
# Everything runs from the repository root; results go under $OUT.

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_ROOT=$(cd "$BENCH_DIR/.." && pwd)
cd "$REPO_ROOT" || exit 2

KS=${KS:-dist/bin/kernelsearch}
OUT=${OUT:-bench/results/raw}
# Scratch (generated candidates, the reference cache) lives outside $OUT: $OUT
# comes back from the GPU machine and must stay small.
WORK=${WORK:-${TMPDIR:-/tmp}/ks-bench-work}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)

die() {
  echo "ERROR: $*" >&2
  exit 2
}

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", b-a}'; }

require_ks() {
  [ -x "$KS" ] || die "$KS not found or not executable (set KS=path/to/kernelsearch; the lead's package puts it in dist/bin)"
  "$KS" --version >/dev/null 2>&1 || die "$KS does not run ($("$KS" --version 2>&1 | head -n 3))"
}

require_python_torch_cuda() {
  command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found (set PYTHON=...)"
  local why
  why=$("$PYTHON" - 2>&1 <<'EOF'
import sys
try:
    import torch
except Exception as e:
    print("cannot import torch: %s" % e); sys.exit(1)
if not torch.cuda.is_available():
    print("torch %s sees no CUDA device" % torch.__version__); sys.exit(1)
EOF
  ) || die "no usable GPU from $PYTHON: $why"
}

require_gpu() {
  [ "${BENCH_GPU_CHECKED:-0}" = "1" ] && return 0  # run_all_device.sh checked once for all
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi -L >/dev/null 2>&1 || die "nvidia-smi finds no GPU ($(nvidia-smi -L 2>&1 | head -n 2))"
  fi
  require_python_torch_cuda
}

commit_id() {
  if [ -n "${KS_COMMIT:-}" ]; then echo "$KS_COMMIT"; return; fi
  local c
  c=$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null) || { echo "unknown (set KS_COMMIT)"; return; }
  if [ -n "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no 2>/dev/null | head -n 1)" ]; then c="$c+dirty"; fi
  echo "$c"
}

gpu_name() {
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1 && return
  fi
  "$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null || echo "unknown"
}

# Exports the metadata every results file carries (read by the python blocks).
export_meta() {
  export BENCH_DATE BENCH_DEVICE BENCH_COMMIT BENCH_HOST_CPUS BENCH_CPU
  BENCH_DATE=$(date -u '+%Y-%m-%d %H:%M:%S UTC')
  BENCH_DEVICE=$(gpu_name)
  BENCH_COMMIT=$(commit_id)
  BENCH_HOST_CPUS=$(nproc)
  BENCH_CPU=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | sed 's/.*: //')
  export KS OUT WORK PYTHON
}
