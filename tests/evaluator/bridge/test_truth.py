"""pytest for each set's float64 truth and the per-block bounds of PyTorch's
own error (evaluator/reference/ks_bridge/truth.py, judge.py and their use in
reference_sets.py), on CPU torch."""
import math
import pathlib
import re
import sys

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evaluator" / "reference"))
import bridge  # noqa: E402
from ks_bridge import judge, truth  # noqa: E402

CPU = torch.device("cpu")

# 50x70 @ 70x30: 1500 elements, five whole blocks of 256 and a partial one.
MATMUL = '''
import torch

class Model(torch.nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)

def get_inputs():
    return [torch.randn(50, 70), torch.randn(70, 30)]

def get_init_inputs():
    return []
'''

# Attention whose keys come in twins one float32 rounding apart: at the
# logits of the x 1e5 set, float32 cannot tell which twin wins the softmax
# (matmul + softmax: torch 1.13 has no scaled_dot_product_attention). The
# GPU tests' fixture, so that both judge the same problem.
ATTENTION = (ROOT / "tests" / "evaluator" / "gpu_fixtures" / "attention_twins.py").read_text()


def _problem(tmp_path, text, name="problem.py"):
    path = tmp_path / name
    path.write_text(text)
    return bridge.Problem(str(path)).load()


def _read(ref, rel, shape, dtype=np.float32):
    return torch.from_numpy(np.fromfile(str(ref / rel), dtype=dtype)).reshape(shape)


def _block_max(d):
    flat = d.reshape(-1)
    pad = (-flat.numel()) % judge.BOUND_BLOCK
    return torch.cat([flat, flat.new_zeros(pad)]).view(-1, judge.BOUND_BLOCK).amax(1)


def test_truth_is_the_float64_forward_and_bounds_are_block_maxima(tmp_path):
    ref = tmp_path / "ref"
    m = bridge.run_reference(_problem(tmp_path, MATMUL), str(ref), 2, 42, "cpu", False, transform_room=0)
    for s in m["sets"]:
        files = s["files"]
        A, B = _read(ref, files["A"], (50, 70)), _read(ref, files["B"], (70, 30))
        exact = A.double() @ B.double()
        out = _read(ref, files["out"], (50, 30))
        assert torch.equal(out, exact.float())
        pt = A @ B
        assert not torch.equal(out, pt)  # the reference is no longer PyTorch's float32 result
        bound = _read(ref, files["out@highest"], (-1,))
        assert bound.shape == (math.ceil(1500 / 256),)
        want = _block_max((pt.double() - exact).abs())
        # The largest |PyTorch - float64| per block, in float32 rounded up.
        assert torch.all(bound.double() >= want)
        assert torch.all(bound.double() <= want * (1 + 2.0 ** -23))
        assert s["truth"] == "float64" and s["truth_note"] is None and s["bound_block"] == 256
        err = s["pytorch_error"]["out"]
        d = pt.double() - exact
        assert err["max_abs"] == pytest.approx(float(d.abs().max()), rel=1e-12)
        assert err["rms"] == pytest.approx(float(d.pow(2).mean().sqrt()), rel=1e-9)
        assert err["rel_norm"] == pytest.approx(float(d.norm() / exact.norm()), rel=1e-9)
        assert err["ill_conditioned"] == 0


def test_lower_levels_share_the_highest_file_on_cpu(tmp_path):
    ref = tmp_path / "ref"
    m = bridge.run_reference(_problem(tmp_path, MATMUL), str(ref), 1, 42, "cpu", False, transform_room=0)
    files = m["sets"][0]["files"]
    assert files["out@highest"] == "set0/out@highest.bin"
    assert files["out@high"] == files["out@medium"] == files["out@highest"]
    assert not (ref / "set0" / "out@high.bin").exists()


def test_ill_conditioned_shifted_set_is_kept_with_a_note(tmp_path):
    ref = tmp_path / "ref"
    m = bridge.run_reference(_problem(tmp_path, ATTENTION), str(ref), 2, 42, "cpu", False, transform_room=4)
    by_name = {t["name"]: t for t in m["transforms"]}
    up = by_name["scale_up"]
    assert up["set"] is not None  # never dropped for being ill-conditioned
    s = m["sets"][up["set"]]
    n = s["pytorch_error"]["out"]["ill_conditioned"]
    assert n > 0 and s["truth"] == "float64"
    assert ("PyTorch's own float32 result differs from float64 on %d elements: ill-conditioned; judged against "
            "float64 with the bound PyTorch itself needs there" % n) in up["note"]
    for judging in m["sets"][:2]:
        assert judging["pytorch_error"]["out"]["ill_conditioned"] == 0
    assert "ill-conditioned" not in by_name["scale_down"]["note"]
    # The reference is float64's answer, and the bound covers PyTorch's wrong one there.
    q, k, v = (_read(ref, s["files"][x], (4, 64, 16)) for x in "qkv")
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2), dim=-1) @ v.double()
    assert torch.equal(_read(ref, s["files"]["out"], (4, 64, 16)), exact.float())
    pt = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
    bound = _read(ref, s["files"]["out@highest"], (-1,))
    assert torch.all(bound.double() >= _block_max((pt.double() - exact).abs()))
    assert float(bound.max()) > 1.0


def test_float64_skipped_when_over_the_time_budget(tmp_path, monkeypatch):
    monkeypatch.setenv("KS_FP64_CHECK_MAX_S", "0")
    ref = tmp_path / "ref"
    m = bridge.run_reference(_problem(tmp_path, MATMUL), str(ref), 2, 42, "cpu", False, transform_room=1)
    assert len(m["sets"]) == 3
    for s in m["sets"]:
        assert s["truth"] == "float32"
        assert "skipped" in s["truth_note"] and "$KS_FP64_CHECK_MAX_S" in s["truth_note"]
        assert s["pytorch_error"] == {}
        assert not [k for k in s["files"] if "@" in k]
        files = s["files"]
        A, B = _read(ref, files["A"], (50, 70)), _read(ref, files["B"], (70, 30))
        assert torch.equal(_read(ref, files["out"], (50, 30)), A @ B)  # PyTorch's own output
    assert m["signature"]["reference_error"] == {}
    assert len([n for n in m["notes"] if "skipped" in n]) == 1  # once for both judging sets


def test_forward_without_float64_support_keeps_pytorchs_output_with_a_note(tmp_path):
    fixture = ROOT / "tests" / "evaluator" / "fixtures" / "float32_only.py"
    m = bridge.run_reference(bridge.Problem(str(fixture)).load(), str(tmp_path / "ref"), 1, 42, "cpu", False,
                             transform_room=0)
    s = m["sets"][0]
    assert s["truth"] == "float32" and "failed (TypeError: float32 only)" in s["truth_note"]
    assert s["pytorch_error"] == {} and not [k for k in s["files"] if "@" in k]


def test_compare_handles_non_finite_elements_and_a_partial_block():
    pt = torch.tensor([math.inf, math.nan, 1.0, math.inf, 2.0] + [0.0] * 300, dtype=torch.float32)
    t64 = torch.tensor([1.0, math.nan, 1.0, math.inf, 2.5] + [0.0] * 299 + [1e-3], dtype=torch.float64)
    bounds, st = truth.compare(pt, t64, 1e-4, 1e-4)
    assert bounds.dtype == torch.float32 and bounds.shape == (2,)
    assert bounds[0] == math.inf and bounds[1] == pytest.approx(1e-3)
    # Both NaN and both +inf agree; inf where float64 is finite fails, as does 2.0 for 2.5 and 0 for 1e-3.
    assert st["ill_conditioned"] == 3
    assert st["max_abs"] == 0.5
    # The RMS over the elements finite in both.
    finite = torch.tensor([False, False, True, False, True] + [True] * 300)
    d = pt.double()[finite] - t64[finite]
    assert st["rms"] == pytest.approx(float(d.pow(2).mean().sqrt()))


def test_float16_output_gets_a_truth_too(tmp_path):
    text = '''
import torch

class Model(torch.nn.Module):
    def forward(self, x):
        return (x @ x.t()).half()

def get_inputs():
    return [torch.randn(20, 40)]

def get_init_inputs():
    return []
'''
    m = bridge.run_reference(_problem(tmp_path, text), str(tmp_path / "ref"), 1, 42, "cpu", False,
                             transform_room=0)
    s = m["sets"][0]
    # forward casts to float16 in float64 too: the float64 product, rounded once by the model's own
    # cast, is the truth, with PyTorch's own error (its float32 product cast) as the bound.
    assert s["truth"] == "float64" and "out" in s["pytorch_error"]
    assert "out@highest" in s["files"]


def test_judge_constants_are_simple_lines_and_match_the_cpp_defaults():
    text = (ROOT / "evaluator" / "reference" / "ks_bridge" / "judge.py").read_text()
    for name in ("BOUND_BLOCK", "CONTRACTS", "ALIASES", "FACTOR", "KERNELBENCH_ATOL", "KERNELBENCH_RTOL",
                 "ROUNDING_FACTOR", "MAX_ROUNDING_REL_NORM", "FLOAT32_ATOL", "FLOAT16_RTOL", "BFLOAT16_ATOL"):
        line = re.search(r"^%s = (.+)$" % name, text, re.M)
        assert line, name
        assert eval(line.group(1), {}) == getattr(judge, name)  # noqa: S307 - our own constants
    assert judge.BOUND_BLOCK == 256
    assert judge.CONTRACTS == ("highest", "high", "medium", "kernelbench")
    assert judge.ALIASES == {"fp32": "highest", "tf32": "high"}
    assert judge.FACTOR == {"highest": 16.0, "high": 4.0, "medium": 4.0, "kernelbench": 16.0}
    assert judge.KERNELBENCH_ATOL == judge.KERNELBENCH_RTOL == 1e-2
    assert bridge.ROUNDING_FACTOR == 16.0 and bridge.DEFAULT_TOLERANCE is judge.DEFAULT_TOLERANCE
    cc = (ROOT / "evaluator" / "signature.cc").read_text()
    names = {"kFloat16": "float16", "kBFloat16": "bfloat16", "kFloat64": "float64", "kFloat32": "float32"}
    found = re.findall(r"case DType::(k\w+): return \{([^,]+), ([^,}]+)", cc)
    assert {names[k] for k, _, _ in found if k in names} == set(names.values())
    for k, atol, rtol in found:
        if k in names:
            assert judge.DEFAULT_TOLERANCE[names[k]] == (float(atol), float(rtol)), k


def test_tolerance_for_ill_conditioning_is_the_problems_or_the_dtypes():
    assert judge.base_tolerance(None, "float32") == (1e-4, 1e-4)
    assert judge.base_tolerance(None, "int64") == (0.0, 0.0)
    assert judge.base_tolerance({"atol": 0.5, "rtol": 0.25}, "float16") == (0.5, 0.25)
    assert judge.contract("tf32") == "high" and judge.contract("kernelbench") == "kernelbench"
    assert judge.contract("fp16") is None


def test_a_level_with_the_bits_of_highest_shares_its_tensor():
    st = truth.SetTruth("float64")
    hi, med = torch.zeros(2), torch.ones(2)
    st.bounds["out"] = {"highest": hi, "high": None, "medium": med}
    keys = st.bound_tensors("out")
    assert [k for k, _ in keys] == ["out@highest", "out@high", "out@medium"]
    assert keys[0][1] is hi and keys[1][1] is hi and keys[2][1] is med
    from ks_bridge import reference_sets

    class FakeResident:
        def __init__(self):
            self.exported = []

        def export(self, t):
            self.exported.append(t)
            return {"handle": "h", "offset": 8 * len(self.exported), "bytes": 8}

    r = FakeResident()
    ipc = reference_sets._export_named(r, keys)
    assert len(r.exported) == 2 and ipc["out@high"] == ipc["out@highest"] != ipc["out@medium"]
