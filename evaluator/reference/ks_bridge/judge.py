"""The judging constants the bridge shares with the C++ evaluator (issue 36,
"the judge compares with the truth"): the per-dtype default tolerance, the
precision contracts and the factor each allows on PyTorch's own error, and
the block size of the per-block bounds a reference set carries.

Each constant is one `NAME = value` line at module level: a C++ test reads
them with a regular expression and compares them with evaluator/signature.cc
(DefaultTolerance, kRoundingFactor, kMaxRoundingRelNorm) and the evaluator's
contract table, so that both languages judge by the same numbers. Nothing is
imported here.
"""

# Per-block bounds: one float32 entry per BOUND_BLOCK consecutive elements of
# a flattened output (the last block partial), the largest |PyTorch - float64|
# in the block, for each precision level PyTorch can run at.
BOUND_BLOCK = 256

# The precision contracts a kernel may be held to, strictest first: full fp32
# (TF32 off), TF32 matmuls and convolutions, bf16-pass matmuls, and
# KernelBench's fixed 1e-2 tolerance.
CONTRACTS = ("highest", "high", "medium", "kernelbench")

# Other names a user may give a contract.
ALIASES = {"fp32": "highest", "tf32": "high"}

# A kernel's error may be at most FACTOR[contract] times PyTorch's own error
# (per block, against the float64 truth) at that precision level.
FACTOR = {"highest": 16.0, "high": 4.0, "medium": 4.0, "kernelbench": 16.0}

# The bound levels the bridge writes ("<output>@<level>"): those of CONTRACTS
# at which PyTorch itself computes.
BOUND_LEVELS = ("highest", "high", "medium")

# KernelBench's own check: torch.allclose(atol=1e-2, rtol=1e-2).
KERNELBENCH_ATOL = 1e-2
KERNELBENCH_RTOL = 1e-2

# PyTorch's float32 rounding (one float64 run) widens a float32 output's
# tolerance by ROUNDING_FACTOR times its RMS, unless the float32 and float64
# results differ by more than MAX_ROUNDING_REL_NORM (then it is not rounding):
# kRoundingFactor and kMaxRoundingRelNorm in evaluator/signature.h.
ROUNDING_FACTOR = 16.0
MAX_ROUNDING_REL_NORM = 1e-3

# The element rule |out - ref| <= atol + rtol * |ref| per output dtype, where
# the problem sets no TOLERANCE: DefaultTolerance in evaluator/signature.cc.
FLOAT32_ATOL = 1e-4
FLOAT32_RTOL = 1e-4
FLOAT16_ATOL = 1e-2
FLOAT16_RTOL = 1e-2
BFLOAT16_ATOL = 2e-2
BFLOAT16_RTOL = 2e-2
FLOAT64_ATOL = 1e-8
FLOAT64_RTOL = 1e-6

# The same by dtype name (integers and bool compare exactly: (0, 0)).
DEFAULT_TOLERANCE = {
    "float16": (FLOAT16_ATOL, FLOAT16_RTOL),
    "bfloat16": (BFLOAT16_ATOL, BFLOAT16_RTOL),
    "float64": (FLOAT64_ATOL, FLOAT64_RTOL),
    "float32": (FLOAT32_ATOL, FLOAT32_RTOL),
}


def base_tolerance(problem_tolerance, dtype):
    """(atol, rtol) of the element rule for an output of dtype name `dtype`:
    the problem's TOLERANCE (Problem.tolerance, or None) else the dtype's
    default; no widening for PyTorch's rounding."""
    if problem_tolerance is not None:
        return problem_tolerance["atol"], problem_tolerance["rtol"]
    return DEFAULT_TOLERANCE.get(dtype, (0.0, 0.0))


def contract(name):
    """The contract `name` or its alias names, or None when it is none of them."""
    name = ALIASES.get(name, name)
    return name if name in CONTRACTS else None
