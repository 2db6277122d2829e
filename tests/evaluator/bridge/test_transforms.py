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
