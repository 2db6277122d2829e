#!/usr/bin/env bash
# device call 1: resident reference tests, verbose first eval of the largest problems, constructs, search, split search
set -o pipefail
export PYTHONUNBUFFERED=1 KS=dist/bin/kernelsearch
S=$OUT/summary.txt
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $S
echo "commit $(cat devrun/commit)" | tee -a $S
t0=$(date +%s)
timeout 200 dist/bin/gpu_eval_test --gtest_filter='*Resident*:*MultiGigabyte*:GpuEvalTest.CorrectSoftmax*:GpuEvalTest.OffByOne*' 2>&1 | tail -n 25 | tee -a $S
echo "t=$(( $(date +%s)-t0 ))" | tee -a $S
KB=.kernelbench/KernelBench
for p in level1/24_LogSoftmax level1/51_Argmax_over_a_dimension; do
  k=bench/kernelbench_scale/kernels/$(basename $p).cu
  [ -f $k ] || { echo "no kernel $k" | tee -a $S; continue; }
  /usr/bin/time -f "wall %e s" timeout 150 $KS eval $KB/$p.py $k --verbose 2>&1 | grep -vE "^\s*$" | tail -n 40 | tee -a $S
  echo "t=$(( $(date +%s)-t0 ))" | tee -a $S
done
timeout 150 dist/bin/constructs_gpu_test 2>&1 | tail -n 15 | tee -a $S
echo "t=$(( $(date +%s)-t0 ))" | tee -a $S
timeout 120 dist/bin/search_gpu_test 2>&1 | tail -n 12 | tee -a $S
echo "t=$(( $(date +%s)-t0 ))" | tee -a $S
timeout 120 bash bench/split_search_device.sh > $OUT/split.log 2>&1; echo "split rc $?" | tee -a $S
tail -n 30 $OUT/split.log >> $S
echo "t=$(( $(date +%s)-t0 ))" | tee -a $S
