"""pytest for `bridge.py reference --signature-from FILE` (issue 33): a cached
manifest's signature is used instead of shape inference and FLOP counting,
which cost seconds of torch imports on every real-size command; a file that
cannot be read means shape inference as before. Runs the bridge as the
evaluator does (--then-files on the CPU, the files request on stdin)."""
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
BRIDGE = ROOT / "evaluator" / "reference" / "bridge.py"
MATMUL = ROOT / "tests" / "evaluator" / "fixtures" / "matmul.py"
sys.path.insert(0, str(ROOT / "evaluator" / "reference"))
import bridge  # noqa: E402


def run_reference(tmp_path, *extra):
    """(first answer line: the signature, final manifest) of one --then-files run."""
    out = tmp_path / "entry"
    request = json.dumps({"out": str(out), "sets": 1, "time": False, "transform_sets": 0}) + "\n"
    r = subprocess.run([sys.executable, str(BRIDGE), "reference", str(MATMUL), "--then-files", "--sets", "1",
                        "--device", "cpu", "--transform-sets", "0"] + list(extra),
                       input=request, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2, r.stdout
    return lines[0], lines[1]


def test_a_cached_signature_replaces_shape_inference(tmp_path):
    first, manifest = run_reference(tmp_path)
    assert first["resident"] is False
    phases = dict(manifest["phases"])
    assert "signature (shape inference, FLOP count)" in phases
    assert "imports (torch, ks_bridge)" in phases

    # The cached manifest as the evaluator keeps it; a marker shows whose signature is used.
    cached_sig = dict(manifest["signature"], marker="from the cache")
    cached = tmp_path / "cached.json"
    cached.write_text(json.dumps({"signature": cached_sig, "sets": []}))
    first2, manifest2 = run_reference(tmp_path / "again", "--signature-from", str(cached))
    assert first2["signature"]["marker"] == "from the cache"
    phases2 = dict(manifest2["phases"])
    assert "signature (from the cache)" in phases2
    assert "signature (shape inference, FLOP count)" not in phases2
    # The reference itself is the same: same shapes, same FLOP keys.
    for key in ("inputs", "outputs", "parameters", "flops", "flops_source"):
        assert manifest2["signature"].get(key) == manifest["signature"].get(key), key


@pytest.mark.parametrize("content", [None, "not json", json.dumps({"sets": []}),
                                     json.dumps({"signature": {"inputs": "x"}})])
def test_an_unusable_cache_file_means_shape_inference(tmp_path, content):
    path = tmp_path / "m.json"
    if content is not None:
        path.write_text(content)
    assert bridge._cached_signature(str(path)) is None
    assert bridge._cached_signature(None) is None
