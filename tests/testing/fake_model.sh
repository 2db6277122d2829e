#!/bin/sh
# The fake model as a `command:` model, for tests that run the real binaries
# (tests/e2e/*, the README's try-it block); tests/testing/fake_model.h is the
# same model in-process (FakeModel), with the same reply shapes. It answers the
# prompt on stdin for the role in $KS_LLM_ROLE (ideas, implement, repair) with
# a canned reply derived from a hash of the prompt, so that the same prompt
# always gets the same reply, in any process. Kernels carry the scripted
# evaluator's markers (search/scripted_evaluator.h): FAKE_MS(...) sets the
# time; about 3 implementations in 16 are FAKE_STATUS(incorrect), so that
# repairs happen; repairs are correct.
# Optional:
#   KS_FAKE_MODEL_DELAY    seconds to sleep per call, like a slow model;
#   KS_FAKE_MODEL_PROFILE=1 adds per-launch markers (FAKE_LAUNCH_MS, FAKE_REGISTERS);
#   KS_FAKE_MODEL_CALLS    a file that gets one line (the role) per call;
#   KS_FAKE_MODEL_IDEAS    how many ideas an ideas reply has (1 to 3; 3 by default);
#   KS_FAKE_MODEL_CORRECT=1 no kernel is FAKE_STATUS(incorrect);
#   KS_FAKE_MODEL_VARY=1   every kernel differs, even for the same prompt (a random
#                          time): for a server's many searches.
set -eu
h=$(sha256sum | cut -c1-12)
if [ -n "${KS_FAKE_MODEL_CALLS:-}" ]; then echo "${KS_LLM_ROLE:-}" >> "$KS_FAKE_MODEL_CALLS"; fi
if [ -n "${KS_FAKE_MODEL_DELAY:-}" ]; then sleep "$KS_FAKE_MODEL_DELAY"; fi
n=$((0x$(echo "$h" | cut -c1-4)))
first=$(echo "$h" | cut -c1)
k="$h"
if [ -n "${KS_FAKE_MODEL_VARY:-}" ]; then
  n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
  k="${h}_$n"
fi
if [ -n "${KS_FAKE_MODEL_CORRECT:-}" ]; then first=f; fi
ms="0.$(printf '%03d' $((n % 900 + 100)))"
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
    ideas='{"title": "tile-'$h'", "idea": "tile the loop ('$h')"}'
    case "${KS_FAKE_MODEL_IDEAS:-3}" in
      1) ;;
      2) ideas="$ideas,
 {\"title\": \"vector-$h\", \"idea\": \"use float4 loads ($h)\"}" ;;
      *) ideas="$ideas,
 {\"title\": \"vector-$h\", \"idea\": \"use float4 loads ($h)\"},
 {\"title\": \"fuse-$h\", \"idea\": \"fuse the passes ($h)\"}" ;;
    esac
    printf '```json\n[%s]\n```\n' "$ideas"
    ;;
  implement)
    case "$first" in
      0|1|2) kernel "k_$k" " FAKE_STATUS(incorrect)" ;;
      *) kernel "k_$k" "" ;;
    esac
    ;;
  repair) kernel "r_$k" "" ;;
  *) echo "fake_model.sh: unknown role '${KS_LLM_ROLE:-}'" >&2; exit 2 ;;
esac
