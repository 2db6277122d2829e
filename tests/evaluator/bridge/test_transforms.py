"""pytest for the distribution-shifted input sets (evaluator/reference/transforms.py
and add_transformed_sets in bridge.py), on CPU torch."""
import json
import pathlib
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evaluator" / "reference"))
import transforms  # noqa: E402

BRIDGE = ROOT / "evaluator" / "reference" / "bridge.py"
FIXTURES = ROOT / "tests" / "evaluator" / "fixtures"


def test_scales_sign_and_untouched_integers_and_scalars():
    x = torch.randn(8, 8)
    idx = torch.arange(4)
    half = torch.randn(16, dtype=torch.float64).half()
    up = transforms.apply("scale_up", [x, idx, 3, half], 43)
    assert torch.equal(up[0], x * 1e5)
    assert up[1] is idx and up[2] == 3
    assert torch.equal(up[3], half * 1e3)  # float16 ends at 65,504: scaled less
    assert torch.isfinite(up[3]).all()
    assert torch.equal(transforms.apply("scale_down", [x], 43)[0], x * 1e-5)
    assert torch.equal(transforms.apply("sign_flip", [x], 43)[0], -x)
    assert torch.equal(x, x.clone())  # the originals are not changed in place


def test_outliers_are_few_large_seeded_and_keep_the_sign():
    x = torch.rand(64, 256) - 0.25
    a = transforms.apply("outliers", [x], 43)[0]
    b = transforms.apply("outliers", [x], 43)[0]
    c = transforms.apply("outliers", [x], 44)[0]
    assert torch.equal(a, b) and not torch.equal(a, c)
    changed = a != x
    assert 1 <= int(changed.sum()) <= x.numel() // transforms.OUTLIER_EVERY
    big = transforms.OUTLIER_FACTOR * float(x.abs().max())
    assert torch.allclose(a[changed].abs(), torch.full_like(a[changed], big))
    assert torch.equal(a[changed] < 0, x[changed] < 0)
    # A tensor of fewer than OUTLIER_EVERY elements still gets one.
    assert int((transforms.apply("outliers", [torch.ones(3)], 1)[0] != 1).sum()) == 1


def test_metadata_names_known_transforms_only():
    assert transforms.check_metadata(["scale_up", "outliers"]) is None
    assert transforms.check_metadata([]) is None
    assert "unknown" in transforms.check_metadata(["scale"])
    assert "list" in transforms.check_metadata("scale_up")

    class M:
        INPUT_TRANSFORMS = ("outliers", "scale_up")
    assert transforms.chosen(M) == ["scale_up", "outliers"]  # in the order they are checked
    assert transforms.chosen(object()) == list(transforms.TRANSFORMS)


def test_nonfinite_count():
    t = torch.tensor([1.0, float("nan"), float("inf"), -float("inf")])
    assert transforms.nonfinite_count(t) == 3
    assert transforms.nonfinite_count(torch.arange(3)) == 0


def _reference(tmp_path, problem, *extra):
    out = tmp_path / "ref"
    r = subprocess.run([sys.executable, str(BRIDGE), "reference", str(problem), "--out", str(out), "--sets", "2",
                        "--device", "cpu", *extra], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def test_the_manifest_names_each_transforms_set_or_why_not(tmp_path):
    m = _reference(tmp_path, FIXTURES / "log_positive.py")
    by_name = {t["name"]: t for t in m["transforms"]}
    assert [t["name"] for t in m["transforms"]] == list(transforms.TRANSFORMS)
    assert by_name["sign_flip"]["set"] is None and "dropped" in by_name["sign_flip"]["note"]
    sets = m["sets"]
    assert [s.get("transform") for s in sets] == [None, None, "scale_up", "scale_down", "outliers"]
    for name in ("scale_up", "scale_down", "outliers"):
        assert sets[by_name[name]["set"]]["transform"] == name
    assert any("sign_flip" in n for n in m["notes"])


def test_no_room_asked_for_means_no_shifted_sets(tmp_path):
    m = _reference(tmp_path, FIXTURES / "matmul.py", "--transform-sets", "1")
    assert [s.get("transform") for s in m["sets"]] == [None, None, "scale_up"]
    assert all("no room" in t["note"] for t in m["transforms"][1:])


def _tensor(ref_dir, rel, like):
    import numpy as np
    data = np.fromfile(str(ref_dir / rel), dtype=np.float32)
    return torch.from_numpy(data).reshape(like.shape)


def test_parameters_are_transformed_with_the_inputs_in_a_set_of_their_own(tmp_path):
    m = _reference(tmp_path, FIXTURES / "conv_params.py")
    ref = tmp_path / "ref"
    base = m["sets"][0]["files"]
    by_name = {t["name"]: t for t in m["transforms"]}
    for name in transforms.TRANSFORMS:
        t = by_name[name]
        assert sorted(t["parameters"]) == ["conv.bias", "conv.weight", "scale"], t
        assert "parameters likewise" in t["note"]
        s = m["sets"][t["set"]]
        assert s["parameters"] == t["parameters"]
        # The shifted set has its own files for the float32 parameters, the
        # buffer ("shift") is the shared one.
        for p in t["parameters"]:
            assert s["files"][p] != base[p] and s["files"][p].startswith("set%d/" % t["set"])
        assert s["files"]["shift"] == base["shift"]
    # Scaled by exactly the transform's factor; the shared file unchanged.
    w0 = _tensor(ref, base["conv.weight"], torch.empty(8, 3, 3, 3))
    up = _tensor(ref, m["sets"][by_name["scale_up"]["set"]]["files"]["conv.weight"], w0)
    assert torch.equal(up, w0 * 1e5)
    flip = _tensor(ref, m["sets"][by_name["sign_flip"]["set"]]["files"]["scale"], torch.empty(8, 1, 1))
    assert torch.equal(flip, -_tensor(ref, base["scale"], flip))
    # The reference is PyTorch's output on the transformed inputs and parameters.
    import importlib.util
    spec = importlib.util.spec_from_file_location("conv_params", FIXTURES / "conv_params.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.Model(3, 8, 3)
    s = m["sets"][by_name["scale_down"]["set"]]
    state = {"conv.weight": _tensor(ref, s["files"]["conv.weight"], w0),
             "conv.bias": _tensor(ref, s["files"]["conv.bias"], torch.empty(8)),
             "scale": _tensor(ref, s["files"]["scale"], torch.empty(8, 1, 1)),
             "shift": _tensor(ref, s["files"]["shift"], torch.empty(8, 1, 1))}
    model.load_state_dict(state)
    x = _tensor(ref, s["files"]["x"], torch.empty(2, 3, 16, 16))
    out_name = m["signature"]["outputs"][0]["name"]
    want = _tensor(ref, s["files"][out_name], torch.empty(2, 8, 14, 14))
    with torch.no_grad():
        assert torch.allclose(model(x), want, rtol=1e-5, atol=1e-12)


def test_parameters_kept_where_transforming_them_leaves_the_range_or_the_problem_says_so(tmp_path):
    m = _reference(tmp_path, FIXTURES / "param_overflow.py")
    by_name = {t["name"]: t for t in m["transforms"]}
    # (x w)^4 with both x 1e5: 1e40 overflows float32; with x alone it does not.
    up = by_name["scale_up"]
    assert up["set"] is not None and up["parameters"] == []
    assert "parameters kept as they are" in up["note"] and "NaN/Inf" in up["note"]
    assert "parameters" not in m["sets"][up["set"]]
    assert by_name["sign_flip"]["parameters"] == ["w"]
    # conv_params.py with PARAMETER_TRANSFORMS = []: its parameters stay as they are.
    inputs_only = tmp_path / "conv_params_inputs_only.py"
    inputs_only.write_text((FIXTURES / "conv_params.py").read_text() + "\nPARAMETER_TRANSFORMS = []\n")
    m2 = _reference(tmp_path / "b", inputs_only)
    for t in m2["transforms"]:
        assert t["set"] is not None and t["parameters"] == []
        assert "PARAMETER_TRANSFORMS" in t["note"]
    assert all("parameters" not in s for s in m2["sets"])


def test_parameter_transforms_metadata():
    assert "PARAMETER_TRANSFORMS" in transforms.check_metadata(["big"], "PARAMETER_TRANSFORMS")

    class M:
        INPUT_TRANSFORMS = ["scale_up", "sign_flip"]
    assert transforms.parameters_chosen(M) == ["scale_up", "sign_flip"]  # follows the inputs

    class N:
        PARAMETER_TRANSFORMS = []
    assert transforms.parameters_chosen(N) == [] and transforms.chosen(N) == list(transforms.TRANSFORMS)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    assert transforms.transformable_parameters(model) == ["0.weight", "0.bias", "1.weight", "1.bias"]
    w = model[0].weight.detach().clone()
    running = model[1].running_var.clone()
    transforms.apply_to_parameters("scale_up", model, 43)
    assert torch.equal(model[0].weight.detach(), w * 1e5) and torch.equal(model[1].running_var, running)


def test_practice_sets_follow_the_judging_sets_from_their_own_seeds(tmp_path):
    # An agent's practice sets (search/agent.h) in the judging reference:
    # after the K judging sets, before the shifted ones, marked, seeded apart.
    m = _reference(tmp_path, FIXTURES / "matmul.py", "--practice-sets", "1", "--practice-seed", "1042",
                   "--transform-sets", "1")
    sets = m["sets"]
    assert [s.get("practice", False) for s in sets] == [False, False, True, False]
    assert [s["seed"] for s in sets[:3]] == [43, 44, 1043]
    assert [s.get("transform") for s in sets] == [None, None, None, "scale_up"]
    ref = tmp_path / "ref"
    inputs = [k for k, rel in sets[2]["files"].items() if rel.startswith("set2/")]
    assert inputs, sets[2]["files"]
    for k in inputs:  # another seed: other tensors than the judging sets'
        assert (ref / sets[2]["files"][k]).read_bytes() != (ref / sets[0]["files"][k]).read_bytes()
    # The shifted set is made from judging set 0, not from the practice set.
    assert m["transforms"][0]["set"] == 3


def test_practice_sets_need_a_seed(tmp_path):
    out = tmp_path / "ref"
    r = subprocess.run([sys.executable, str(BRIDGE), "reference", str(FIXTURES / "matmul.py"), "--out", str(out),
                        "--sets", "2", "--device", "cpu", "--practice-sets", "1"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "--practice-seed" in r.stdout, r.stdout + r.stderr
