#!/usr/bin/env python3
"""CPU self-test of gen_candidates.py (no GPU, no NVRTC): every honest and
incorrect candidate's kernel is compiled with the host C++ compiler under a tiny
CUDA emulation (blocks and threads run one after another) and run on sizes with
and without a float4 tail (n = 1024*1024, the scale problem's size, and odd n);
honest ones must write exactly x * 2 + 1 everywhere, incorrect ones must not.
The grid comes from the plan expression, evaluated here with x.numel = n.

  python3 bench/gen_candidates_selftest.py [--count 200] [--seed 3] [--cxx g++]

Exit 0 when every checked candidate behaves as its kind says.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = [1024 * 1024, 1024 * 1024 + 3, 1, 2, 5, 7, 4099]

HARNESS = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
struct Dim { unsigned x = 0, y = 0, z = 0; };
static Dim blockIdx, threadIdx, gridDim, blockDim;
#define __global__
#define __device__
#define __shared__ static
#define __restrict__
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline float2 make_float2(float a, float b) { return {a, b}; }
static inline float __ldg(const float* p) { return *p; }
static inline void __syncthreads() {}
KERNEL_SOURCE
int main(int argc, char** argv) {
  long long n = atoll(argv[1]);
  unsigned grid = (unsigned)atoll(argv[2]), block = (unsigned)atoll(argv[3]);
  std::vector<float> x(n + 64), out(n + 64, NAN), x0;
  for (long long i = 0; i < n + 64; ++i) x[i] = (float)((i * 7919) % 1000) / 37.0f - 13.0f;
  x0 = x;
  gridDim.x = grid; blockDim.x = block; gridDim.y = gridDim.z = blockDim.y = blockDim.z = 1;
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned t = 0; t < block; ++t) {
      blockIdx.x = b; threadIdx.x = t;
      scale(x.data(), out.data(), n);
    }
  long long bad = 0, past = 0, changed = 0;
  for (long long i = 0; i < n; ++i) if (!(out[i] == x0[i] * 2.0f + 1.0f)) ++bad;
  for (long long i = n; i < n + 64; ++i) if (!std::isnan(out[i])) ++past;
  for (long long i = 0; i < n + 64; ++i) if (x[i] != x0[i]) ++changed;
  printf("%lld %lld %lld\n", bad, past, changed);
  return 0;
}
"""


def grid_of(expr, n):
    py = expr.replace("x.numel", str(n))
    return int(eval(py, {"__builtins__": {}}, {"cdiv": lambda a, b: (a + b - 1) // b, "min": min, "max": max}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="ks-gen-selftest-") as tmp:
        d = os.path.join(tmp, "cands")
        subprocess.run([sys.executable, os.path.join(HERE, "gen_candidates.py"), "--count", str(args.count), "--seed",
                        str(args.seed), "--mix", "honest=0.8,incorrect=0.2", "--out", d], check=True)
        expected = json.load(open(os.path.join(d, "expected.json")))
        # One binary per distinct source (kernels repeat with different block sizes).
        binaries = {}
        checked = 0
        for name in sorted(expected):
            text = open(os.path.join(d, name)).read()
            src = re.search(r"^```cuda\n(.*?)^```$", text, re.M | re.S).group(1)
            plan = json.loads(re.search(r"^```json\n(.*?)^```$", text, re.M | re.S).group(1))
            launch = plan["launches"][0]
            body = "\n".join(l for l in src.splitlines() if not l.startswith("// candidate"))
            if body not in binaries:
                exe = os.path.join(tmp, "k%d" % len(binaries))
                cpp = exe + ".cc"
                with open(cpp, "w") as f:
                    f.write(HARNESS.replace("KERNEL_SOURCE", body.replace('extern "C" ', "")))
                r = subprocess.run([args.cxx, "-O1", "-std=c++17", "-w", "-o", exe, cpp], capture_output=True, text=True)
                if r.returncode != 0:
                    print("FAIL %s: host compile failed:\n%s" % (name, r.stderr[:2000]))
                    failures += 1
                    binaries[body] = None
                    continue
                binaries[body] = exe
            exe = binaries[body]
            if exe is None:
                continue
            verdicts = []
            for n in SIZES:
                grid = grid_of(launch["grid"][0], n)
                block = int(launch["block"][0])
                out = subprocess.run([exe, str(n), str(grid), str(block)], capture_output=True, text=True, check=True)
                bad, past, changed = map(int, out.stdout.split())
                verdicts.append((n, bad, past, changed))
            ok_all = all(b == 0 and p == 0 and c == 0 for _, b, p, c in verdicts)
            # The scale problem's size decides what the evaluator sees.
            _, b0, p0, c0 = verdicts[0]
            wrong_at_size = b0 > 0 or p0 > 0 or c0 > 0
            want = expected[name]
            checked += 1
            if want == "correct" and not ok_all:
                failures += 1
                print("FAIL %s: honest but (n, wrong, written past end, input changed) = %s" % (name, verdicts))
            elif want == "incorrect" and not wrong_at_size:
                failures += 1
                print("FAIL %s: expected incorrect but exact at n=%d" % (name, SIZES[0]))
        print("gen_candidates_selftest: %d candidates checked (%d distinct kernels), %d failures"
              % (checked, len([b for b in binaries.values() if b]), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
