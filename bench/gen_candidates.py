#!/usr/bin/env python3
"""Writes N candidate .md files for the scale problem (out = x * 2 + 1, x 1024x1024
fp32: tests/evaluator/gpu_fixtures/scale.py) with a chosen mix of kinds, plus
DIR/expected.json mapping file name -> the status the evaluator must report.

Kinds and what they must evaluate to:
  honest         correct        block sizes 64..1024, one element per thread,
                                grid-stride loops, float4 with a scalar tail,
                                2 elements per thread (adjacent or half-split)
  incorrect      incorrect      off-by-one (last element never written), wrong
                                constant, writes nothing, writes every other element
  compile_error  compile_error  syntax error, undefined identifier, wrong type
  crash          runtime_error  write to out[i + (1ll << 40)] (illegal address)
  hang           timeout        spin on a volatile flag that never changes
  cheat          incorrect      modifies its input; caches results in a
                                __device__ array across runs

Every kernel has the signature the plan expects: (const float* x, float* out,
long long n) with args ["x", "out", "x.numel"]. Stdlib only.

  gen_candidates.py --count 100 --mix honest=0.6,incorrect=0.15,compile_error=0.1,\
crash=0.05,hang=0.02,cheat=0.08 --seed 1 --out DIR
"""

import argparse
import json
import os
import random
import sys

DEFAULT_MIX = "honest=0.6,incorrect=0.15,compile_error=0.1,crash=0.05,hang=0.02,cheat=0.08"
EXPECTED = {
    "honest": "correct",
    "incorrect": "incorrect",
    "compile_error": "compile_error",
    "crash": "runtime_error",
    "hang": "timeout",
    "cheat": "incorrect",
}
BLOCKS = [64, 128, 256, 512, 1024]


def plan(kernel, grid, block):
    return {"launches": [{"kernel": kernel, "grid": [grid], "block": [block], "args": ["x", "out", "x.numel"]}]}


def one_per_thread(name, body_expr="x[i] * 2.0f + 1.0f", cond="i < n", extra=""):
    return """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (%s) out[i] = %s;%s
}
""" % (name, cond, body_expr, extra)


# ---- honest ---------------------------------------------------------------------------

def honest(rng):
    b = rng.choice(BLOCKS)
    kind = rng.choice(["simple", "fma", "grid_stride", "float4_tail", "two_adjacent", "two_split"])
    k = "scale"
    if kind == "simple":
        src = one_per_thread(k)
        return kind + "_b%d" % b, src, plan(k, "cdiv(x.numel, %d)" % b, b)
    if kind == "fma":
        src = one_per_thread(k, body_expr="fmaf(__ldg(x + i), 2.0f, 1.0f)")
        return kind + "_b%d" % b, src, plan(k, "cdiv(x.numel, %d)" % b, b)
    if kind == "grid_stride":
        blocks = rng.choice([132, 264, 528, 1024])
        src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = x[i] * 2.0f + 1.0f;
}
""" % k
        return kind + "_g%d_b%d" % (blocks, b), src, plan(k, "min(cdiv(x.numel, %d), %d)" % (b, blocks), b)
    if kind == "float4_tail":
        # Thread t < n/4 does one float4; the n % 4 tail elements go to threads 0..2
        # (n = 1M here has no tail, but the code must be right for any n).
        src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  long long n4 = n / 4;
  if (t < n4) {
    float4 v = reinterpret_cast<const float4*>(x)[t];
    v.x = v.x * 2.0f + 1.0f;
    v.y = v.y * 2.0f + 1.0f;
    v.z = v.z * 2.0f + 1.0f;
    v.w = v.w * 2.0f + 1.0f;
    reinterpret_cast<float4*>(out)[t] = v;
  }
  long long tail = n4 * 4 + t;
  if (tail < n) out[tail] = x[tail] * 2.0f + 1.0f;
}
""" % k
        # Grid covers max(n/4, n%4) threads: cdiv(n, 4) >= both.
        return kind + "_b%d" % b, src, plan(k, "cdiv(cdiv(x.numel, 4), %d)" % b, b)
    if kind == "two_adjacent":
        src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 2;
  if (i < n) out[i] = x[i] * 2.0f + 1.0f;
  if (i + 1 < n) out[i + 1] = x[i + 1] * 2.0f + 1.0f;
}
""" % k
        return kind + "_b%d" % b, src, plan(k, "cdiv(x.numel, %d)" % (2 * b), b)
    # two_split: element i and i + half, half = cdiv(n, 2)
    src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long half = (n + 1) / 2;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < half) {
    out[i] = x[i] * 2.0f + 1.0f;
    long long j = i + half;
    if (j < n) out[j] = x[j] * 2.0f + 1.0f;
  }
}
""" % k
    return kind + "_b%d" % b, src, plan(k, "cdiv(cdiv(x.numel, 2), %d)" % b, b)


# ---- incorrect ------------------------------------------------------------------------

def incorrect(rng):
    b = rng.choice(BLOCKS)
    kind = rng.choice(["off_by_one", "wrong_constant", "writes_nothing", "every_other"])
    k = "scale"
    grid = "cdiv(x.numel, %d)" % b
    if kind == "off_by_one":
        src = one_per_thread(k, cond="i < n - 1")  # the last element is never written
    elif kind == "wrong_constant":
        expr = rng.choice(["x[i] * 2.0f + 2.0f", "x[i] * 3.0f + 1.0f", "x[i] * 2.0f - 1.0f", "x[i] + 1.0f"])
        src = one_per_thread(k, body_expr=expr)
        kind += "_" + str(["x[i] * 2.0f + 2.0f", "x[i] * 3.0f + 1.0f", "x[i] * 2.0f - 1.0f",
                           "x[i] + 1.0f"].index(expr))
    elif kind == "writes_nothing":
        src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  float v = x[i < n ? i : 0] * 2.0f + 1.0f;
  (void)v;  // computed, never stored
}
""" % k
    else:
        src = one_per_thread(k, cond="i < n && (i % 2 == 0)")
    return kind + "_b%d" % b, src, plan(k, grid, b)


# ---- compile errors -------------------------------------------------------------------

def compile_error(rng):
    b = rng.choice(BLOCKS)
    kind = rng.choice(["syntax", "undefined", "bad_type"])
    k = "scale"
    if kind == "syntax":
        src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x
  if (i < n) out[i] = x[i] * 2.0f + 1.0f;
}
""" % k  # missing ';'
    elif kind == "undefined":
        src = one_per_thread(k, body_expr="x[i] * scale_factor + 1.0f")
    else:
        src = one_per_thread(k, body_expr="make_float2(x[i], 1.0f)")  # float2 into float
    return kind + "_b%d" % b, src, plan(k, "cdiv(x.numel, %d)" % b, b)


# ---- crashes, hangs, cheats -----------------------------------------------------------

def crash(rng):
    b = rng.choice(BLOCKS)
    k = "scale"
    src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i + (1ll << 40)] = x[i] * 2.0f + 1.0f;  // 4 TiB past the buffer: illegal address
}
""" % k
    return "illegal_address_b%d" % b, src, plan(k, "cdiv(x.numel, %d)" % b, b)


def hang(rng):
    b = rng.choice(BLOCKS)
    k = "scale"
    src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  __shared__ volatile int release;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (threadIdx.x == 0) release = 0;
  __syncthreads();
  if (i < n) out[i] = x[i] * 2.0f + 1.0f;
  if (blockIdx.x == 0 && threadIdx.x == 0)
    while (release == 0) { }  // nobody ever sets it
}
""" % k
    return "spin_b%d" % b, src, plan(k, "cdiv(x.numel, %d)" % b, b)


def cheat(rng):
    b = rng.choice(BLOCKS)
    kind = rng.choice(["modify_input", "device_cache"])
    k = "scale"
    if kind == "modify_input":
        # Right output, then scribbles on its input (e.g. to reuse it as scratch).
        src = """extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i] * 2.0f + 1.0f;
    out[i] = v;
    const_cast<float*>(x)[i] = v;
  }
}
""" % k
    else:
        # Remembers its results in a __device__ array and serves them on later
        # runs: fast when timed, wrong for new inputs; the evaluator must see the
        # state kept across runs.
        src = """__device__ float ks_cache[1 << 20];
__device__ int ks_cache_filled;

extern "C" __global__ void %s(const float* __restrict__ x, float* __restrict__ out, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (ks_cache_filled && n <= (1 << 20)) {
    out[i] = ks_cache[i];
    return;
  }
  float v = x[i] * 2.0f + 1.0f;
  out[i] = v;
  if (n <= (1 << 20)) ks_cache[i] = v;
  if (i == 0) ks_cache_filled = 1;
}
""" % k
    return kind + "_b%d" % b, src, plan(k, "cdiv(x.numel, %d)" % b, b)


MAKERS = {
    "honest": honest,
    "incorrect": incorrect,
    "compile_error": compile_error,
    "crash": crash,
    "hang": hang,
    "cheat": cheat,
}


def parse_mix(text):
    mix = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "=" not in part:
            raise ValueError("mix entry %r is not KIND=FRACTION" % part)
        k, v = part.split("=", 1)
        k = k.strip()
        if k not in MAKERS:
            raise ValueError("unknown kind %r (known: %s)" % (k, ", ".join(MAKERS)))
        f = float(v)
        if f < 0:
            raise ValueError("fraction for %s is negative" % k)
        mix[k] = f
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("the mix is empty")
    return {k: v / total for k, v in mix.items()}


def counts_for(mix, n):
    """Largest-remainder rounding: counts sum to n; a kind with a non-zero share
    gets at least one candidate when n allows."""
    raw = {k: mix[k] * n for k in mix}
    counts = {k: int(raw[k]) for k in mix}
    rest = n - sum(counts.values())
    for k in sorted(mix, key=lambda k: raw[k] - counts[k], reverse=True)[:rest]:
        counts[k] += 1
    for k in mix:
        if mix[k] > 0 and counts[k] == 0:
            donor = max(counts, key=counts.get)
            if counts[donor] > 1:
                counts[donor] -= 1
                counts[k] = 1
    return counts


def render(index, category, variant, src, plan_obj):
    return """# candidate %03d: %s / %s

Generated by bench/gen_candidates.py for tests/evaluator/gpu_fixtures/scale.py (out = x * 2 + 1).

```cuda
// candidate %03d (%s, %s)
%s```

```json
%s
```
""" % (index, category, variant, index, category, variant, src, json.dumps(plan_obj, indent=2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--mix", default=DEFAULT_MIX, help="KIND=FRACTION,... (normalized); kinds: " + ", ".join(MAKERS))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True, help="directory to write (created; existing .md files are removed)")
    args = ap.parse_args(argv)
    if args.count < 1:
        ap.error("--count must be >= 1")
    try:
        mix = parse_mix(args.mix)
    except ValueError as e:
        ap.error(str(e))
    counts = counts_for(mix, args.count)
    rng = random.Random(args.seed)
    cats = [c for c in MAKERS for _ in range(counts.get(c, 0))]
    rng.shuffle(cats)

    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):  # a stale candidate from an earlier run would be evaluated too
        if f.endswith(".md") or f.endswith(".cu") or f == "expected.json":
            os.remove(os.path.join(args.out, f))
    expected = {}
    kinds = {}
    for i, cat in enumerate(cats):
        variant, src, plan_obj = MAKERS[cat](rng)
        name = "c%03d_%s_%s.md" % (i, cat, variant)
        with open(os.path.join(args.out, name), "w") as f:
            f.write(render(i, cat, variant, src, plan_obj))
        expected[name] = EXPECTED[cat]
        kinds[name] = cat
    with open(os.path.join(args.out, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    with open(os.path.join(args.out, "kinds.json"), "w") as f:
        json.dump(kinds, f, indent=1, sort_keys=True)
        f.write("\n")
    summary = ", ".join("%s %d" % (c, counts[c]) for c in MAKERS if counts.get(c))
    print("gen_candidates: %d candidates in %s (%s), seed %d" % (len(cats), args.out, summary, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
