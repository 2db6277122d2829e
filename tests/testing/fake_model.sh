#!/bin/sh
# A `command:` model for end-to-end tests of `kernelsearch search`
# (tests/e2e/search_e2e_test.cc). It answers the prompt on stdin for the role in
# $KS_LLM_ROLE (ideas, implement, repair) with a canned reply derived from a
# hash of the prompt, so that the same prompt always gets the same reply, in any
# process. Kernels carry the scripted evaluator's markers (search/
# scripted_evaluator.h): FAKE_MS(...) sets the time; about 3 implementations in
# 16 are FAKE_STATUS(incorrect), so that repairs happen; repairs are correct.
# Optional: KS_FAKE_MODEL_DELAY (seconds to sleep, like a slow model);
# KS_FAKE_MODEL_PROFILE=1 adds per-launch markers (FAKE_LAUNCH_MS, FAKE_REGISTERS).
set -eu
h=$(sha256sum | cut -c1-12)
if [ -n "${KS_FAKE_MODEL_DELAY:-}" ]; then sleep "$KS_FAKE_MODEL_DELAY"; fi
n=$((0x$(echo "$h" | cut -c1-4)))
ms="0.$(printf '%03d' $((n % 900 + 100)))"
first=$(echo "$h" | cut -c1)
profile=""
if [ -n "${KS_FAKE_MODEL_PROFILE:-}" ]; then profile=" FAKE_LAUNCH_MS($ms) FAKE_REGISTERS(40)"; fi

kernel() {  # $1 = kernel name, $2 = extra marker text
  cat <<REPLY
Here is the kernel.
\`\`\`cuda
extern "C" __global__ void $1(float* out, const float* x, int n) {
  /* FAKE_MS($ms)$2$profile */
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x[i];
}
\`\`\`
\`\`\`json
{"launches": [{"kernel": "$1", "grid": ["cdiv(x.numel, 256)"], "block": [256], "args": ["out", "x", "x.numel"]}]}
\`\`\`
REPLY
}

case "${KS_LLM_ROLE:-}" in
  ideas)
    cat <<REPLY
\`\`\`json
[{"title": "tile-$h", "idea": "tile the loop ($h)"},
 {"title": "vector-$h", "idea": "use float4 loads ($h)"},
 {"title": "fuse-$h", "idea": "fuse the passes ($h)"}]
\`\`\`
REPLY
    ;;
  implement)
    case "$first" in
      0|1|2) kernel "k_$h" " FAKE_STATUS(incorrect)" ;;
      *) kernel "k_$h" "" ;;
    esac
    ;;
  repair) kernel "r_$h" "" ;;
  *) echo "fake_model.sh: unknown role '${KS_LLM_ROLE:-}'" >&2; exit 2 ;;
esac
